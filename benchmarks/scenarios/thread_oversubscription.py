"""Scenario thread_oversubscription: intra-op threads x processes far above the core count.

Model: a small CNN (3 conv layers + linear head) on 3x48x48 synthetic images, batch 16, trained
with SGD+momentum. Samples come from a map-style dataset whose __getitem__ does real torch work
(a 5x5 blur as conv2d, a colour-mixing matmul, a per-channel normalisation) in a DataLoader with
2 worker processes.

Injected (bad): torch.set_num_threads(8) in the training process, and a worker_init_fn that also
sets 8 intra-op threads in each of the 2 workers (overriding the DataLoader's default of 1), on a
2-core machine: up to 3 x 8 = 24 OpenMP threads compete for 2 cores. OpenMP parallel regions
then wait at their barriers for threads that are descheduled, so every multi-threaded operator,
in the trainer and in the workers, runs far slower than with one thread.

Fix (fixed): threads sized to the machine: 1 intra-op thread in the trainer and 1 per worker
(3 busy threads for 2 cores, the workers are idle most of the time). Same model, data, loader
and transforms.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

THREADS = {"bad": (8, 8), "fixed": (1, 1)}  # (trainer, each worker)
WORKERS = 2
BATCH = 16
SIZE = 48


def _set_worker_threads(n: int, worker_id: int) -> None:
    import torch

    torch.set_num_threads(n)


class AugmentedImages:
    """Synthetic images with a per-sample augmentation done with torch ops (in the workers)."""

    def __init__(self, n: int = 4096) -> None:
        import torch

        self.n = n
        g = torch.Generator().manual_seed(3)
        self.kernel = torch.softmax(torch.randn(3, 1, 5, 5, generator=g).flatten(1), 1).view(3, 1, 5, 5)
        self.mix = torch.eye(3) + 0.05 * torch.randn(3, 3, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int):
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(idx)
        img = torch.rand(3, 2 * SIZE, 2 * SIZE, generator=g)
        img = F.conv2d(img.unsqueeze(0), self.kernel, padding=2, groups=3)  # blur
        img = F.interpolate(img, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0]
        img = torch.einsum("cd,dhw->chw", self.mix, img)  # colour jitter
        img = (img - img.mean(dim=(1, 2), keepdim=True)) / (img.std(dim=(1, 2), keepdim=True) + 1e-5)
        return img, idx % 10


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    main_threads, worker_threads = THREADS[variant]
    torch.set_num_threads(main_threads)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        loader = torch.utils.data.DataLoader(
            AugmentedImages(),
            batch_size=BATCH,
            shuffle=False,
            num_workers=WORKERS,
            persistent_workers=True,
            prefetch_factor=2,
            worker_init_fn=functools.partial(_set_worker_threads, worker_threads),
            # spawn, not fork: GNU OpenMP is not fork-safe, and a worker forked from a trainer
            # that already ran an 8-thread parallel region deadlocks in its first parallel op
            multiprocessing_context="spawn",
        )
        state["loader"] = loader
        state["it"] = iter(loader)

    def teardown() -> None:
        it = state.pop("it", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        state.pop("loader", None)

    def step(i: int) -> None:
        x, y = next(state["it"])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="thread_oversubscription",
    category="cpu",
    cause="resource_contention",
    expected_cases=["C-MON-008"],
    description=(
        "8 intra-op threads in the trainer plus 8 in each of 2 DataLoader workers doing torch "
        "augmentation, on 2 cores: OpenMP threads oversubscribe the cores and every parallel "
        "operator stalls at its barriers."
    ),
    fix="torch.set_num_threads(1) in the trainer and 1 thread per worker (fits the 2 cores).",
    notes=[
        "Recorded with the monitor running beside the profiler; C-MON-008 (more compute threads than "
        "cores) names the cause from the monitor's thread counts and run-queue wait. The label first "
        "proposed C-CPU-017 (same cause, resource_contention). The trace alone records neither the "
        "intra-op thread count nor the worker processes; there the signature is the same operators taking several "
        "times longer than in a healthy run (here conv ops 9.0 ms mean vs 1.45 ms in the fixed trace, "
        "the same shapes) with the critical path made of operators.",
        "C-COMP-011 (CPU training bound by matmuls/convolutions) fires on both bad and fixed; its first "
        "optimisation (threads + DataLoader workers must not exceed the physical cores) is this fix, "
        "but its diagnosis is not the cause, so it is not listed as expected.",
        "Side measurement (same script, 12 steps): trainer 2 threads (= cores, PyTorch's default here) + "
        "workers at 1 thread was slowest of all, ~430 ms/step vs ~150 ms for 8+8 and ~90 ms for 1+1: "
        "libgomp spins at its barriers when threads <= cores, and only throttles spinning when threads "
        "exceed the cores.",
        "Workers are started with the spawn context: GNU OpenMP is not fork-safe, and a worker forked "
        "from a trainer that already ran an 8-thread parallel region deadlocks in its first parallel op.",
    ],
)

if __name__ == "__main__":
    common.main("thread_oversubscription", make_run, LABEL)
