"""GPU scenario gpu_unfused_elementwise: hand-written RMSNorm and tanh-GELU run as eager chains.

Model: 6 residual blocks (hand-written RMSNorm, Linear 1024 -> 2048, hand-written tanh-GELU,
Linear 2048 -> 1024) on 16384 tokens in bf16 autocast, fused AdamW, inputs on the device.

Injected (bad): eager mode: each RMSNorm is five kernels (float cast, square, mean, rsqrt, two
multiplies) and each GELU seven, every one reading and writing the whole activation in HBM,
forward and backward.

Fix (fixed): ``torch.compile(model)``: Inductor fuses each chain into one or two kernels.

Expected: C-COMP-003 (chains of small element-wise kernels run one by one).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

TOKENS, D, HIDDEN, BLOCKS = g.size(16384, 128), g.size(1024, 64), g.size(2048, 128), 6


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(D))
            self.up, self.down = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

        def forward(self, x):
            return x + self.down(g.gelu_tanh_by_hand(self.up(g.rmsnorm_by_hand(x, self.w))))

    model = nn.Sequential(*[Block() for _ in range(BLOCKS)], nn.Linear(D, 16)).to(g.DEV)
    opt = g.adamw(model.parameters())
    fwd = torch.compile(model) if variant == "fixed" and g.CUDA else model
    return g.classifier_run(fwd, opt, (TOKENS, D), 16, timed_steps=30)


LABEL = Label(
    scenario="gpu_unfused_elementwise",
    category="computation",
    cause="unfused_elementwise_operators",
    expected_cases=["C-COMP-003"],
    description="Hand-written RMSNorm and tanh-GELU in 6 residual blocks (16384 tokens, width 1024/2048, "
    "bf16): eager element-wise chains, each kernel a full pass over the activation.",
    fix="torch.compile(model) (Inductor fuses the chains).",
    notes=["The compile happens in the warm-up steps of every run (the Inductor cache on disk is warm "
           "after the first), outside the monitored and timed steps."],
)

if __name__ == "__main__":
    common.main("gpu_unfused_elementwise", make_run, LABEL)
