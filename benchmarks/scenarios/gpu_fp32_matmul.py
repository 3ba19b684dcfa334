"""GPU scenario gpu_fp32_matmul: a GEMM-heavy model trained in full FP32 (TF32 off).

Model: 3 residual feed-forward blocks (LayerNorm, Linear 2048 -> 8192, GELU, Linear 8192 -> 2048)
on 8192 tokens per step, fused AdamW, inputs already on the device.

Injected (bad): FP32 everywhere with ``torch.backends.cuda.matmul.allow_tf32 = False`` (PyTorch's
default for matmuls): the GEMMs run on the CUDA cores at FP32 rates (about 67 TFLOP/s on an
H100/H200 by the datasheet) instead of the tensor cores.

Fix (fixed): ``torch.autocast("cuda", dtype=torch.bfloat16)`` around the forward pass (master
weights and the optimizer stay FP32).

Expected: C-COMP-001 (FP32 matrix multiplies on CUDA cores instead of tensor cores).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

TOKENS, D, HIDDEN, BLOCKS = g.size(8192, 256), g.size(2048, 128), g.size(8192, 512), 3


def make_run(variant: str) -> Run:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)

    class FFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.up, self.down = nn.LayerNorm(D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.ln(x)), approximate="tanh"))

    model = nn.Sequential(*[FFN() for _ in range(BLOCKS)], nn.Linear(D, 16)).to(g.DEV)
    cast = g.autocast if variant == "fixed" else contextlib.nullcontext
    return g.classifier_run(model, g.adamw(model.parameters()), (TOKENS, D), 16, timed_steps=20, cast=cast)


LABEL = Label(
    scenario="gpu_fp32_matmul",
    category="computation",
    cause="fp32_gemm_without_tensor_cores",
    expected_cases=["C-COMP-001"],
    description="Feed-forward blocks (2048 -> 8192 -> 2048, 8192 tokens) trained in FP32 with TF32 off: "
    "the GEMMs run on CUDA cores.",
    fix="bf16 autocast around the forward pass.",
)

if __name__ == "__main__":
    common.main("gpu_fp32_matmul", make_run, LABEL)
