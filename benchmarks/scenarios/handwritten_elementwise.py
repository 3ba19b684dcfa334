"""Scenario handwritten_elementwise: a residual MLP whose norms and activations are written out
as chains of element-wise operators, run eagerly on CPU.

Model: a residual MLP for tabular data (input 64 features, width 256, four pre-norm blocks of
Linear 256->1024, GELU (tanh approximation), Linear 1024->256, a 10-class head), batch 256, AdamW
(fused=True in both variants), synthetic data, one intra-op thread.

Injected (bad): the layer norm and the GELU are hand-written the way they appear in many
research code bases, ``(x - mu) / torch.sqrt(var + eps) * w + b`` and
``0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x ** 3)))``: about a dozen separate eager
element-wise operators per block in forward, each making its own pass over a 256x1024 or
256x256 activation, and as many again (more) in backward.

Fix (fixed): the built-in single-operator modules the case advises, nn.LayerNorm and
nn.GELU(approximate="tanh") (aten::native_layer_norm, aten::gelu and their fused backward
kernels), same arithmetic.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

IN, WIDTH, HIDDEN, BLOCKS, BATCH = 64, 256, 1024, 4, 256


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)  # 2 shared cores: keep OpenMP noise out of the comparison
    torch.manual_seed(0)
    builtin = variant == "fixed"

    class HandLayerNorm(nn.Module):
        def __init__(self, d: int, eps: float = 1e-5) -> None:
            super().__init__()
            self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias

    class HandGELU(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    def norm(d: int) -> nn.Module:
        return nn.LayerNorm(d) if builtin else HandLayerNorm(d)

    def act() -> nn.Module:
        return nn.GELU(approximate="tanh") if builtin else HandGELU()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = norm(WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, HIDDEN), act(), nn.Linear(HIDDEN, WIDTH))

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    model = nn.Sequential(nn.Linear(IN, WIDTH), *[Block() for _ in range(BLOCKS)], norm(WIDTH), nn.Linear(WIDTH, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, IN, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="handwritten_elementwise",
    category="computation",
    cause="unfused_elementwise_operators",
    expected_cases=["C-COMP-012"],
    description=(
        "A residual MLP (width 256, hidden 1024, 4 blocks, batch 256) trained eagerly on CPU with a "
        "hand-written layer norm and tanh-GELU: a dozen separate element-wise operators per block in "
        "forward and more in backward, each a pass over the activations."
    ),
    fix="The built-in single-operator modules: nn.LayerNorm and nn.GELU(approximate='tanh').",
    notes=[
        "The case's first advice also names torch.compile (Inductor fuses the chains into one loop); the "
        "fixed twin uses the built-in modules, which need no compiler and give the same arithmetic.",
        "One intra-op thread in both variants (2 shared cores); AdamW fused=True in both (the optimizer's "
        "own element-wise work is C-CPU-027's, and the case counts only element-wise time outside it).",
    ],
)

if __name__ == "__main__":
    common.main("handwritten_elementwise", make_run, LABEL)
