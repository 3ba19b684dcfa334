#!/usr/bin/env python3
"""Scenario cpu_contention: other processes spin on the training process's cores.

Injected problem (variant "bad"): while the model trains, unrelated processes (started detached
in setup, so that they are not the trainer's children, and killed in teardown) run busy loops,
one more than the machine has cores (3 on this 2-core machine), as a co-located job, a stray
evaluation script or a runaway preprocessing process would. The training process (one intra-op
thread) then always shares a core: the scheduler gives it about half a core, so its operators run
longer and it is descheduled between operators. (With only one spinner per core, the scheduler
sometimes leaves the trainer alone on a core for a whole timing round, and short rounds measure
either no slowdown or a large one.)

Fix (variant "fixed"): nothing else runs; same model, data and configuration.

Model: a small CNN (conv 3->16->32, two linear layers) trained with SGD+momentum on synthetic
3x32x32 images held in memory (each step slices its batch), batch 32. Seeds are fixed.

Expected diagnosis: category cpu, cause resource_contention. A trace records only the
profiled process, so the competing processes are invisible in it; the always-on monitor that runs
beside the profiler sees them (/proc: other processes' CPU use, the trainer's run-queue wait), and
C-MON-007 (other processes take the CPUs) is the case that names the cause.

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/cpu_contention.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "cpu_contention"
SEED = 0
BATCH = 32
STEPS_OF_DATA = 16
SPINNERS = (os.cpu_count() or 2) + 1  # one more busy process than cores: the trainer always shares

# one intra-op thread: with two OpenMP threads on this shared 2-core machine, any load from other
# sessions (there is some) stalls the threads at their barriers and wrecks the fixed run too; one
# thread keeps the fixed twin stable and leaves the spinners as the only injected difference
torch.set_num_threads(1)


# A co-located CPU-bound job: pure Python arithmetic, forever. It is started detached (setsid -f:
# its parent is init, not the trainer), as another user's job would be; a multiprocessing child
# would look like one of the trainer's own DataLoader workers to anyone inspecting the machine.
SPIN = (
    "import os, sys\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "x = 0\n"
    "while True:\n"
    "    x = (x * 1103515245 + 12345) & 0x7FFFFFFF\n"
)


def _start_spinner(pid_file: str) -> int:
    subprocess.run(["setsid", "-f", sys.executable, "-c", SPIN, pid_file], check=True)
    for _ in range(200):
        try:
            return int(Path(pid_file).read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise RuntimeError("spinner did not start")


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    n = BATCH * STEPS_OF_DATA
    images = torch.randn(n, 3, 32, 32, generator=g)  # in memory, shuffled once
    labels = torch.randint(0, 10, (n,), generator=g)
    model = common.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {"procs": []}

    def setup() -> None:
        if variant == "bad":
            tmp = tempfile.mkdtemp()
            for k in range(SPINNERS):
                state["procs"].append(_start_spinner(os.path.join(tmp, f"spin{k}.pid")))
            time.sleep(0.5)  # let them settle into their loops before the first step

    def step(i: int) -> None:
        j = (i % STEPS_OF_DATA) * BATCH
        x, y = images[j : j + BATCH], labels[j : j + BATCH]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        for pid in state["procs"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        state["procs"].clear()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="resource_contention",
    expected_cases=["C-MON-007"],
    description=(
        "Co-located busy-loop processes (one more than the cores) run during training; the training "
        "process (a small CNN, batch 32, one intra-op thread) shares the cores with them, "
        "so its operators take longer and it is descheduled between them."
    ),
    fix="no other CPU-bound process on the training process's cores",
    notes=[
        "Recorded with the monitor running beside the profiler (one run directory per variant); the "
        "trace alone cannot show other processes, only their effect (operators slower than on free "
        "cores). The label first proposed C-CPU-018 for this cause; C-MON-007 is the case that "
        "covers it (same cause, resource_contention).",
        "The spinners are detached (setsid -f): multiprocessing children would be counted as the "
        "trainer's own child processes (as DataLoader workers are), not as another job.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
