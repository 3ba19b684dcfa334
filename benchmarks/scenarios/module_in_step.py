"""Scenario module_in_step: a layer constructed inside forward() in every step.

Model: an encoder MLP (256 -> 512 -> 512) followed by a projection and a 10-class head, AdamW
(fused=True in both variants), synthetic data, batch 64, one intra-op thread.

Injected (bad): the projection (a 512 x 512 nn.Linear) is created inside forward() ("built
lazily where its size is known"), so every step runs nn.Linear.__init__: the Module machinery,
parameter allocation and Kaiming-uniform initialisation of 262k weights from the random
generator. (It is also a training bug: the projection's weights are new every step and never
learn; a profiler sees the cost first.)

Fix (fixed): the projection is built once in __init__ (or as nn.LazyLinear, which initialises on
the first call only).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
            self.proj = nn.Linear(512, 512) if variant == "fixed" else None
            self.head = nn.Linear(512, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.enc(x)
            proj = self.proj if self.proj is not None else nn.Linear(h.shape[-1], 512)  # built every call
            return self.head(torch.relu(proj(h)))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step)


LABEL = Label(
    scenario="module_in_step",
    category="cpu",
    cause="object_construction_in_step",
    expected_cases=["C-CPU-035"],
    description=(
        "A 512 x 512 nn.Linear is constructed inside forward() in every step: Module.__init__, "
        "parameter allocation and Kaiming-uniform initialisation run on the training thread each time."
    ),
    fix="Build the projection once in __init__ (or use nn.LazyLinear).",
    notes=[
        "With with_stack=True the construction shows as torch/nn/modules/linear.py __init__ (and "
        "reset_parameters, torch/nn/init.py kaiming_uniform_) frames inside the step, with aten::uniform_ "
        "inside them.",
    ],
)

if __name__ == "__main__":
    common.main("module_in_step", make_run, LABEL)
