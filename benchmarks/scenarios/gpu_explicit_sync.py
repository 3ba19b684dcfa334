"""GPU scenario gpu_explicit_sync: ``torch.cuda.synchronize()`` left in the step to time it.

Model: the shared GPT loop ("device" size: 8 layers, d_model 1024, context 1024, batch 16, bf16,
fused AdamW; ``gpu_common``): the device is the bottleneck. (Recorded first at the "balanced" size
on 2026-11-28: that loop was host-bound on the H200 machine, so a drain per step cost 6%.)

Injected (bad): the step is timed with the host clock around ``torch.cuda.synchronize()``, a
habit left over from benchmarking: every step waits for the device to drain, so the launch of
step i+1 cannot overlap the GPU's work on step i.

Fix (fixed): a CUDA event is recorded after every step and the elapsed times are read every 50
steps (one synchronisation of an event already passed, not a drain per step).

Expected: C-CPU-007 (explicit device synchronisation calls inside the step).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

EVERY = 50


def make_run(variant: str) -> Run:
    import torch

    _, _, batches, train_step, cfg = g.gpt_training("device")
    times: list[float] = []
    events: list = []

    def step(i: int) -> None:
        if variant == "bad":
            t0 = time.perf_counter()
            train_step(*batches.next())
            if g.CUDA:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            return
        train_step(*batches.next())
        if g.CUDA:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            events.append(ev)
            if len(events) > EVERY:
                events[-1].synchronize()
                times.extend(a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:]))
                del events[:-1]

    return Run(step=step, samples_per_step=cfg["batch"], device=g.DEV, timed_steps=60)


LABEL = Label(
    scenario="gpu_explicit_sync",
    category="cpu",
    cause="explicit_device_sync",
    expected_cases=["C-CPU-007"],
    description="torch.cuda.synchronize() after every step of a device-bound bf16 GPT loop, to time the step with the "
    "host clock: every step drains the device before the next is launched.",
    fix="CUDA events recorded per step, read every 50 steps.",
)

if __name__ == "__main__":
    common.main("gpu_explicit_sync", make_run, LABEL)
