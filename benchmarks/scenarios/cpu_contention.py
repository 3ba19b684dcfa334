#!/usr/bin/env python3
"""Scenario cpu_contention: other processes spin on the training process's cores.

Injected problem (variant "bad"): while the model trains, two unrelated processes (started in
setup with multiprocessing, stopped in teardown) run busy loops, one per core of this 2-core
machine, as a co-located job, a stray evaluation script or a runaway preprocessing process
would. The training process (one intra-op thread) now shares the two cores with two spinning
processes: the scheduler gives it about two thirds of a core, so its operators run longer and
it is descheduled between operators.

Fix (variant "fixed"): nothing else runs; same model, data and configuration.

Model: a small CNN (conv 3->16->32, two linear layers) trained with SGD+momentum on synthetic
3x32x32 images held in memory (each step slices its batch), batch 32. Seeds are fixed.

Expected diagnosis: category cpu, cause resource_contention. A trace records only the
profiled process, so the competing processes are invisible; their effect is operators that take
longer than the same operators do on free cores, and host time between operators that nothing in
the trace accounts for. No hermes case describes this cause today: the expected case id
C-CPU-018 is a proposal (see the label notes).

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/cpu_contention.py
"""

from __future__ import annotations

import multiprocessing as mp
import sys
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
SPINNERS = 2  # one busy process per core of the 2-core machine

# one intra-op thread: with two OpenMP threads on this shared 2-core machine, any load from other
# sessions (there is some) stalls the threads at their barriers and wrecks the fixed run too; one
# thread keeps the fixed twin stable and leaves the spinners as the only injected difference
torch.set_num_threads(1)


def _spin() -> None:
    """A co-located CPU-bound process: pure Python arithmetic, forever."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    n = BATCH * STEPS_OF_DATA
    images = torch.randn(n, 3, 32, 32, generator=g)  # in memory, shuffled once
    labels = torch.randint(0, 10, (n,), generator=g)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {"procs": []}

    def setup() -> None:
        if variant == "bad":
            ctx = mp.get_context("fork")
            for _ in range(SPINNERS):
                p = ctx.Process(target=_spin, daemon=True)
                p.start()
                state["procs"].append(p)

    def step(i: int) -> None:
        j = (i % STEPS_OF_DATA) * BATCH
        x, y = images[j : j + BATCH], labels[j : j + BATCH]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        for p in state["procs"]:
            p.terminate()
        for p in state["procs"]:
            p.join(timeout=5)
        state["procs"].clear()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="resource_contention",
    expected_cases=["C-CPU-018"],
    description=(
        "Two co-located busy-loop processes (one per core) run during training; the training "
        "process (a small CNN, batch 32, one intra-op thread) shares the two cores with them, "
        "so its operators take longer and it is descheduled between them."
    ),
    fix="no other CPU-bound process on the training process's cores",
    notes=[
        "No existing hermes case covers CPU contention by other processes; C-CPU-018 is the "
        "proposed id of a case that should (cause resource_contention: operators slower than on "
        "free cores, e.g. measured against the same operators' durations in a reference trace "
        "or their FLOP rate, plus host time between operators that no event explains). The "
        "thread_oversubscription scenario (own threads oversubscribing the cores) has the same "
        "cause and proposes C-CPU-017; one contention case covering both would fit either label.",
        "A trace cannot show other processes; the spinners are visible only through their effect.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
