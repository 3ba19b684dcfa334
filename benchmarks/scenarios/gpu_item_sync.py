"""GPU scenario gpu_item_sync: the loss is read back and printed in every step.

Model: the shared GPT loop (``gpu_common``, "balanced" size: 6 layers, d_model 768, context 512,
batch 8, bf16, fused AdamW), where the host takes about as long to launch a step as the GPU takes
to run it.

Injected (bad): ``print(f"step {i} loss {loss.item():.4f}")`` after every step (to a log file):
``.item()`` copies the loss to the host and waits for the device to finish the step, so the host
can no longer launch step i+1 while the GPU runs step i; the device then waits for the launches of
the next step's first kernels, and the host waits for the device's last ones.

Fix (fixed): the detached losses are summed on the device and read (and printed) every 50 steps.

Expected: C-CPU-006 (values read back to the host inside the step).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

EVERY = 50


def make_run(variant: str) -> Run:
    _, _, batches, train_step, cfg = g.gpt_training("balanced")
    log = open(os.devnull, "w")  # a log file: the cost is the read-back, not the write
    acc = {"sum": None}

    def step(i: int) -> None:
        loss = train_step(*batches.next())
        if variant == "bad":
            print(f"step {i} loss {loss.item():.4f}", file=log)
            return
        acc["sum"] = loss if acc["sum"] is None else acc["sum"] + loss
        if (i + 1) % EVERY == 0:
            print(f"step {i} mean loss {acc['sum'].item() / EVERY:.4f}", file=log)
            acc["sum"] = None

    return Run(step=step, samples_per_step=cfg["batch"], device=g.DEV, teardown=log.close, timed_steps=60)


LABEL = Label(
    scenario="gpu_item_sync",
    category="cpu",
    cause="implicit_device_sync",
    expected_cases=["C-CPU-006"],
    description="loss.item() printed after every step of a bf16 GPT loop whose host and device times "
    "are similar: every step waits for the device to drain before the next one is launched.",
    fix="Losses summed on the device and read every 50 steps.",
)

if __name__ == "__main__":
    common.main("gpu_item_sync", make_run, LABEL)
