#!/usr/bin/env python3
"""Scenario loader_heavy_transform: a heavy per-sample transform run in the training process.

Injected problem (variant "bad"): ``Dataset.__getitem__`` runs an expensive NumPy transform per
sample (repeated 5-point blur, random gamma, sin/cos/tanh tone mapping, block downsampling,
per-channel normalisation: a few ms per sample) and the ``DataLoader`` uses ``num_workers=0``,
so every batch is prepared synchronously inside the training step, which then waits for it.

Fix (variant "fixed"): the same dataset and model with ``DataLoader(num_workers=2,
persistent_workers=True, prefetch_factor=2)``: the two worker processes prepare the next
batches while the step trains on the current one.

Model: a small CNN (conv 3->16->32, two linear layers) trained with SGD+momentum on synthetic
3x32x32 images, batch size 16. Seeds are fixed (torch, per-sample NumPy generators, shuffling).

Expected diagnosis: category io, cause slow_data_processing, case C-IO-001 (single-process
loader whose wait is traced Python/operator work preparing samples).

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/loader_heavy_transform.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "loader_heavy_transform"
SEED = 0
BATCH = 16
NUM_SAMPLES = BATCH * 32
IMG = 128  # "decoded" image side; the transform downsamples it to 32x32
BLUR_PASSES = 12  # knob for the per-sample cost

# one intra-op thread in the training process: on a 2-core machine two OpenMP threads stall on
# barriers whenever the DataLoader workers run, which would add a second, unintended problem
torch.set_num_threads(1)


class HeavyTransformDataset(Dataset):
    """Synthetic images, each produced by an expensive per-sample NumPy transform."""

    def __len__(self) -> int:
        return NUM_SAMPLES

    @staticmethod
    def _transform(raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # array operators and ufuncs (few Python calls): an expensive transform, a small trace
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
        raw = rng.integers(0, 256, size=(3, IMG, IMG), dtype=np.uint8)  # "decode"
        return torch.from_numpy(self._transform(raw, rng)), idx % 10


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    model = common.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    if variant == "bad":
        loader = DataLoader(
            HeavyTransformDataset(), batch_size=BATCH, shuffle=True, num_workers=0, generator=gen
        )
    else:
        loader = DataLoader(
            HeavyTransformDataset(),
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            prefetch_factor=2,
            generator=gen,
        )
    state: dict = {}

    def setup() -> None:
        state["it"] = iter(loader)

    def step(i: int) -> None:
        common.loader_train_step(state, loader, model, opt, loss_fn)

    def teardown() -> None:
        it = state.pop("it", None)
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_processing",
    expected_cases=["C-IO-001"],
    description=(
        "Heavy per-sample NumPy transform (blur x12, gamma, tone mapping, downsampling, "
        "normalisation) in Dataset.__getitem__ with DataLoader(num_workers=0): batches are "
        "prepared serially inside every training step of a small CNN."
    ),
    fix="DataLoader(num_workers=2, persistent_workers=True, prefetch_factor=2)",
    notes=[
        "2-core machine: the two workers share the cores with the training process, so the "
        "gain is bounded by about 2x here; more cores give more.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
