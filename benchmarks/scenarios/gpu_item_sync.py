"""GPU scenario gpu_item_sync: the loss is read back and printed in every step.

Model: the shared GPT loop (``gpu_common``, "device" size: 8 layers, d_model 1024, context 1024,
batch 16, bf16, fused AdamW), where the device is the bottleneck: the host launches a whole step in
less time than the GPU runs it. (Recorded first at the "balanced" size on 2026-11-28: that loop
was host-bound on the H200 machine, kernels 28% of the step, so a drain per step cost 2%.)

Injected (bad): ``print(f"step {i} loss {loss.item():.4f}")`` after every step (to a log file):
``.item()`` copies the loss to the host and waits for the device to finish the step, so the host
can no longer launch step i+1 while the GPU runs step i. The device then waits while the host
gathers the next batch and launches the forward pass, whose kernels the GPU runs faster than
Python launches them; the queue the healthy loop keeps ahead of the device is gone.

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
    _, _, batches, train_step, cfg = g.gpt_training("device")
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
    description="loss.item() printed after every step of a device-bound bf16 GPT loop: every step waits "
    "for the device to drain before the next batch is gathered and its forward pass launched.",
    fix="Losses summed on the device and read every 50 steps.",
)

if __name__ == "__main__":
    common.main("gpu_item_sync", make_run, LABEL)
