"""Scenario weights_snapshot: a rollback snapshot of the weights deep-copied in every step.

Model: an MLP (256 -> 1024 -> 1024 -> 10) trained with AdamW (fused=True in both variants) on
synthetic data, batch 64, one intra-op thread. The loop keeps a snapshot of the last good
weights so that it can roll back when a step produces a non-finite loss (a common guard in
unstable training; the same shape as a target network copied every step in reinforcement
learning).

Injected (bad): the snapshot is taken with ``copy.deepcopy(model.state_dict())`` after every
step: a new tensor for every parameter and buffer, allocated and filled, plus a Python walk over
the module tree and the state dict, in every step.

Fix (fixed): the snapshot buffers are allocated once and refreshed in place with one
multi-tensor copy per step (``torch._foreach_copy_``); the rollback reads the same buffers.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        state["snapshot"] = copy.deepcopy(model.state_dict())

    def teardown() -> None:
        state.clear()

    @torch.no_grad()
    def take_snapshot() -> None:
        if variant == "bad":
            state["snapshot"] = copy.deepcopy(model.state_dict())  # new tensors every step
        else:
            snap, live = state["snapshot"], model.state_dict()
            torch._foreach_copy_([snap[k] for k in live], list(live.values()))  # in place

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        if not torch.isfinite(loss):  # never true here: the rollback path
            model.load_state_dict(state["snapshot"])
            return
        loss.backward()
        opt.step()
        take_snapshot()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="weights_snapshot",
    category="cpu",
    cause="state_copy_in_step",
    expected_cases=["C-CPU-045"],
    description=(
        "A rollback snapshot of the weights taken with copy.deepcopy(model.state_dict()) after every step: "
        "every parameter copied into newly allocated tensors, and the state dict walked in Python, each step."
    ),
    fix="Snapshot buffers allocated once and refreshed in place with torch._foreach_copy_.",
    notes=[
        "With with_stack=True the copies show as copy.py deepcopy and torch/nn/modules/module.py "
        "state_dict frames on the training thread, with aten::clone / aten::copy_ inside.",
    ],
)

if __name__ == "__main__":
    common.main("weights_snapshot", make_run, LABEL)
