#!/usr/bin/env python3
"""Scenario loader_workers_pinned: DataLoader workers confined to one core with the training process.

Injected problem (variant "bad"): the DataLoader has two worker processes, but the training
process is pinned to core 0 (``os.sched_setaffinity(0, {0})``, as a launcher-level
``taskset -c 0`` or a narrow cpuset would do) and each worker pins itself to the same core in
its ``worker_init_fn``. The training step and both workers then time-share one core while the
other core stays free for them: the workers cannot produce batches as fast as the step consumes
them, and the step waits on the worker queue. This is the Hermes paper's taskset case.

Fix (variant "fixed"): the same loader (2 workers, persistent, prefetch_factor=2) and model with
no CPU pinning: the workers and the training process spread over both cores.

Per-sample work: a NumPy transform (blur, gamma, tone mapping, downsampling, normalisation)
of about 1.3 ms CPU per sample, so a batch of 32 costs several times the CPU of the model's
step (as in accelerator training, where the host's own work per step is small). Model: a
small MLP trained with SGD+momentum on synthetic 3x32x32 images, batch size 32. Seeds
are fixed (torch, per-sample NumPy generators, shuffling).

Expected diagnosis: category io, cause slow_data_processing, case C-IO-003 (multi-process
loader whose workers do not keep up: too few workers or workers sharing cores). The trace
cannot see the affinity; C-IO-003's explanation names pinning as one of the two causes and
its second optimization is the affinity check.

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/loader_workers_pinned.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "loader_workers_pinned"
SEED = 0
BATCH = 32
NUM_SAMPLES = BATCH * 32
IMG = 64  # "decoded" image side; the transform downsamples it to 32x32
BLUR_PASSES = 6
PIN_TO = {0}  # the one core every process of the bad variant is confined to
WORKERS = 2

torch.set_num_threads(1)  # one intra-op thread in the training process (workers get 1 too)


class TransformDataset(Dataset):
    """Synthetic images with a per-sample NumPy transform (~1.3 ms CPU)."""

    def __len__(self) -> int:
        return NUM_SAMPLES

    @staticmethod
    def _transform(raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        img = raw.astype(np.float32) * (1.0 / 255.0)
        for _ in range(BLUR_PASSES):
            img[:, 1:-1, 1:-1] = 0.2 * (
                img[:, 1:-1, 1:-1]
                + img[:, :-2, 1:-1]
                + img[:, 2:, 1:-1]
                + img[:, 1:-1, :-2]
                + img[:, 1:-1, 2:]
            )
        img = np.power(img, np.float32(0.8 + 0.4 * rng.random()))
        img = np.tanh(np.sin(img * 3.0) + np.cos(img * 2.0))
        f = IMG // 32
        img = np.add.reduce(np.add.reduce(img.reshape(3, 32, f, 32, f), axis=4), axis=2) * (1.0 / (f * f))
        img = img - img.reshape(3, -1).mean(axis=1).reshape(3, 1, 1)
        return (img / (img.reshape(3, -1).std(axis=1).reshape(3, 1, 1) + 1e-5)).astype(np.float32)

    def __getitem__(self, idx: int):
        rng = np.random.default_rng(SEED * 1_000_003 + idx)
        raw = rng.integers(0, 256, size=(3, IMG, IMG), dtype=np.uint8)
        return torch.from_numpy(self._transform(raw, rng)), idx % 10


def pin_worker(worker_id: int) -> None:
    """The injected problem: every worker confines itself to the training process's core."""
    os.sched_setaffinity(0, PIN_TO)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 128), nn.ReLU(), nn.Linear(128, 10))


def make_run(variant: str) -> Run:
    bad = variant == "bad"
    torch.manual_seed(SEED)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(
        TransformDataset(),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        prefetch_factor=2,
        worker_init_fn=pin_worker if bad else None,
        generator=torch.Generator().manual_seed(SEED),
    )
    state: dict = {}

    def setup() -> None:
        state["affinity"] = os.sched_getaffinity(0)
        if bad:
            os.sched_setaffinity(0, PIN_TO)  # like `taskset -c 0 python train.py`
        state["it"] = iter(loader)

    def step(i: int) -> None:
        common.loader_train_step(state, loader, model, opt, loss_fn)

    def teardown() -> None:
        it = state.pop("it", None)
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        os.sched_setaffinity(0, state["affinity"])

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_processing",
    expected_cases=["C-IO-003", "C-IO-006"],
    description=(
        "DataLoader(num_workers=2) whose workers (worker_init_fn) and the training process "
        "(os.sched_setaffinity) are pinned to core 0 of a 2-core machine: the step and both "
        "workers time-share one core, so batches are not ready when the step asks."
    ),
    fix="no CPU pinning (the same 2-worker loader on both cores)",
    notes=[
        "The trace cannot show CPU affinity; C-IO-003 (workers do not keep up: too few workers "
        "or workers sharing cores) is the case whose explanation and optimizations cover it. "
        "C-IO-006 (the same wait, periodic every N steps) also counts as a hit.",
        "On 2 cores the per-batch CPU cost (~1.3 ms x 32 samples) is several times the model "
        "step's, so the unpinned (fixed) loader does not keep up either: its trace still shows "
        "worker wait and C-IO-003 is expected there too (the step is shorter, the share of it "
        "spent waiting is not smaller); unpinning halves the step, more cores and workers would "
        "be the next fix.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
