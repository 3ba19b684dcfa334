"""Scenario tensor_logging: tensors formatted into a log message in every step.

Model: a small MLP classifier (256 -> 512 -> 512 -> 10) trained with AdamW (fused=True in both
variants) on synthetic data, batch 64, one intra-op thread (as sync_logging.py).

Injected (bad): after the forward pass the loop writes a debug message built with an f-string
that embeds the logits of the first four samples and the loss tensor:
``log.debug(f"step {i} logits={out[:4]} loss={loss}")``. The logger is at INFO, so nothing is
printed, but the f-string is evaluated before the call: torch's tensor printer
(torch/_tensor_str.py) runs in every step, reading every element back to a Python float (.item()
per element) to choose a format and then formatting each one; on a GPU each of those reads is a
synchronisation.

Fix (fixed): lazy %-style arguments (``log.debug("step %d loss %s", i, loss)``) that the logging
module formats only when the record is emitted (never, at INFO), and scalars logged as floats.
"""

from __future__ import annotations

import logging
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
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    log = logging.getLogger("train.tensor_logging")
    log.setLevel(logging.INFO)  # debug records are dropped, as in a production run

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        if variant == "bad":
            log.debug(f"step {i} logits={out[:4]} loss={loss}")  # formatted before the level check
        else:
            log.debug("step %d loss %s", i, loss)  # formatted only if emitted
        loss.backward()
        opt.step()

    return Run(step=step)


LABEL = Label(
    scenario="tensor_logging",
    category="cpu",
    cause="tensor_formatting",
    expected_cases=["C-CPU-030"],
    description=(
        "A debug log call with an f-string embedding four samples' logits (4 x 10) and the loss runs every step; "
        "the logger drops it (level INFO) but the f-string has already printed both tensors to text."
    ),
    fix="Lazy %-style logging arguments: nothing is formatted unless the record is emitted.",
    notes=[
        "The formatting shows with with_stack=True as torch/_tensor.py __format__/__repr__ and "
        "torch/_tensor_str.py frames, with hundreds of aten::item / aten::select operators inside.",
    ],
)

if __name__ == "__main__":
    common.main("tensor_logging", make_run, LABEL)
