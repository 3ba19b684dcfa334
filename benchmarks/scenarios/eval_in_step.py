"""Scenario eval_in_step: the validation loss of a held-out batch computed in every step.

Model: a temporal convolution regressor (two Conv1d layers of 64 channels over 48-step sequences
of 16 features, average pooling, a linear head) on synthetic sequences, batch 32, Adam (foreach),
one intra-op thread.

Injected (bad): a helper the user calls after every optimizer step evaluates the model on a
held-out batch of 128 sequences under ``torch.no_grad()`` and keeps the loss (a float: one
read-back), the "watch the validation loss" habit left in the step. It runs a full forward of
the model, four times the training batch, for nothing the step needs.

Fix (fixed): the same evaluation every 200 steps (none falls in the timed or recorded steps).

Expected: C-PROG-001 (a function of the step does work besides training in every step), naming
``eval_in_step.py: validate``: its forward is the model's, but it runs no backward or optimizer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

SEQ, FEAT, HIDDEN, BATCH, HELD, EVERY = 48, 16, 64, 32, 128, 200


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Regressor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(nn.Conv1d(FEAT, HIDDEN, 5, padding=2), nn.ReLU(),
                                      nn.Conv1d(HIDDEN, HIDDEN, 5, padding=2), nn.ReLU())  # fmt: skip
            self.head = nn.Linear(HIDDEN, 1)

        def forward(self, x):  # x: (batch, steps, features)
            return self.head(self.conv(x.transpose(1, 2)).mean(2)).squeeze(1)

    model = Regressor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, SEQ, FEAT, generator=gen), torch.randn(BATCH, generator=gen)) for _ in range(8)]
    held = (torch.randn(HELD, SEQ, FEAT, generator=gen), torch.randn(HELD, generator=gen))
    loss_fn = nn.MSELoss()
    history: list[float] = []

    @torch.no_grad()
    def validate() -> float:
        return loss_fn(model(held[0]), held[1]).item()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if variant == "bad" or (i + 1) % EVERY == 0:
            history.append(validate())

    return Run(step=step)


LABEL = Label(
    scenario="eval_in_step",
    category="cpu",
    cause="user_code_in_step",
    expected_cases=["C-PROG-001"],
    description=("A held-out batch of 128 sequences evaluated with the temporal conv model (no_grad forward and loss read back) "
                 "after every optimizer step."),
    fix="The same evaluation every 200 steps.",
    notes=["Recorded for issue 32, written from the mechanism: work every step that belongs outside the loop "
           "(an evaluation)."],
)

if __name__ == "__main__":
    common.main("eval_in_step", make_run, LABEL)
