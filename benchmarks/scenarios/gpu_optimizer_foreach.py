"""GPU scenario gpu_optimizer_foreach: AdamW's default foreach implementation on a model whose
update is a large part of the step.

Model: a wide MLP (8 layers of 4096 x 4096 with GELU, 134M parameters, bf16 autocast) trained on
device-resident batches of 512 vectors: few FLOPs per parameter, as when fine-tuning with small
batches, so the optimizer's pass over 134M parameters and their two moments is a large part of
the device time.

Injected (bad): ``torch.optim.AdamW(params, lr=3e-4)``: on CUDA PyTorch picks the foreach
implementation (multi-tensor kernels, several passes over parameters, gradients and moments).

Fix (fixed): ``fused=True``: one fused kernel reads and writes each tensor once.

Expected: C-COMP-025 (the optimizer update runs as many memory-bound kernels, not fused).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

WIDTH, LAYERS, BATCH = g.size(4096, 64), 8, g.size(512, 8)


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10)).to(g.DEV)
    opt = g.adamw(model.parameters()) if variant == "fixed" else torch.optim.AdamW(model.parameters(), lr=3e-4)
    return g.classifier_run(model, opt, (BATCH, WIDTH), 10, timed_steps=60)


LABEL = Label(
    scenario="gpu_optimizer_foreach",
    category="computation",
    cause="optimizer_not_fused",
    expected_cases=["C-COMP-025"],
    description="A wide MLP (134M parameters, batch 512, bf16) trained with torch.optim.AdamW's default "
    "(foreach) implementation: the update's multi-tensor kernels are a large part of the step.",
    fix="torch.optim.AdamW(..., fused=True).",
)

if __name__ == "__main__":
    common.main("gpu_optimizer_foreach", make_run, LABEL)
