#!/usr/bin/env python3
"""Scenario loader_small_files: every sample is three small files, opened in the step.

Injected problem (variant "bad"): an RGB-D dataset stored one file per modality and sample, the
way such datasets are often laid out: a raw 3x32x32 uint8 colour image (3 KiB), a raw 32x32
uint8 depth map (1 KiB) and a one-line class file per sample, 3 x 1024 files in one directory.
``__getitem__`` checks that the three files exist (``os.path.exists``, defensive code found in
many datasets), opens and reads each (``readinto`` a preallocated uint8 array, ``read`` for the
class) and returns the 4x32x32 uint8 sample (the batch is converted to float and normalised in
the step); the DataLoader runs with ``num_workers=0``, batch 64: 192 existence checks and 192
opens per batch, in the process that waits for the batch. The files are on local disk and in the page cache, so each open is cheap
(microseconds, against milliseconds on a network file system); the per-file overhead still
takes a large share of the wait, since the bytes per file are few.

Fix (variant "fixed"): the case's advice, pack the small files into a large shard and read it
sequentially: before training the samples are packed once into one uncompressed array file
(``.npy``, images) plus one label array, memory-mapped; ``__getitem__`` indexes them, no
per-sample open or existence check. Same DataLoader (num_workers=0), model and data.

Model: the small CNN of the other loader scenarios (conv 4->16->32 with max-pooling, two linear
layers; 4 input channels for RGB-D), SGD+momentum, batch 64, one intra-op thread. (A lighter
model, a few ms a step, was tried first: the fixed twin's per-sample indexing and collation
then became a large share of its step, C-IO-001 high on the twin, a second problem.)

Expected diagnosis: category io, cause slow_data_reading, case C-IO-009 (each batch opens many
small files, and the opens / metadata lookups hold the DataLoader), or C-IO-004 (the wait is
Python I/O), which rests on the same evidence and into which hermes folds C-IO-009.
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

NAME = "loader_small_files"
SEED = 0
BATCH = 64
NUM_SAMPLES = 1024
SHAPE = (4, 32, 32)  # RGB + depth

torch.set_num_threads(1)

def _write(d: Path) -> None:
    """Write the dataset once per process: a colour file, a depth file and a class file per sample."""
    rng = np.random.default_rng(SEED)
    for i in range(NUM_SAMPLES):
        rng.integers(0, 256, (3, 32, 32), dtype=np.uint8).tofile(d / f"{i:06d}.rgb")
        rng.integers(0, 256, (1, 32, 32), dtype=np.uint8).tofile(d / f"{i:06d}.depth")
        (d / f"{i:06d}.cls").write_text(f"{int(rng.integers(0, 10))}\n")


def data_dir() -> Path:
    return common.scratch_dir("hermes_small_files_", _write)


class FilesDataset(Dataset):
    """Three small files per sample (bad), or one packed shard (fixed)."""

    def __init__(self, root: Path, packed: bool):
        self.root = root
        self.packed = packed
        self.images: np.ndarray | None = None
        self.labels: np.ndarray | None = None

    def pack(self) -> None:
        """The fix, once before training: all samples into one .npy shard and a label array."""
        out = self.root / "packed"
        if not (out / "images.npy").is_file():
            out.mkdir(exist_ok=True)
            imgs = np.stack([np.concatenate([np.fromfile(self.root / f"{i:06d}.rgb", dtype=np.uint8),
                                             np.fromfile(self.root / f"{i:06d}.depth", dtype=np.uint8)]).reshape(SHAPE)
                             for i in range(NUM_SAMPLES)])  # fmt: skip
            labels = np.array([int((self.root / f"{i:06d}.cls").read_text()) for i in range(NUM_SAMPLES)],
                              dtype=np.int64)  # fmt: skip
            np.save(out / "images.npy", imgs)
            np.save(out / "labels.npy", labels)
        self.images = np.load(out / "images.npy", mmap_mode="r")
        self.labels = np.load(out / "labels.npy")

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, idx: int):
        if self.packed:
            img = np.array(self.images[idx])  # a copy out of the memory map
            label = int(self.labels[idx])
        else:
            base = os.path.join(self.root, f"{idx:06d}")
            paths = (base + ".rgb", base + ".depth", base + ".cls")
            for p in paths:
                if not os.path.exists(p):
                    raise FileNotFoundError(p)
            img = np.empty(SHAPE, dtype=np.uint8)
            with open(paths[0], "rb") as f:
                f.readinto(img[:3])
            with open(paths[1], "rb") as f:
                f.readinto(img[3:])
            with open(paths[2], "rb") as f:
                label = int(f.read())
        return torch.from_numpy(img), label  # uint8; normalised on the batch in the step


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    ds = FilesDataset(data_dir(), packed=variant == "fixed")
    model = nn.Sequential(
        nn.Conv2d(4, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(SEED))  # fmt: skip
    state: dict = {}

    def setup() -> None:
        if ds.packed:
            ds.pack()
        state["it"] = iter(loader)

    def step(i: int) -> None:
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            x, y = next(state["it"])
        x = x.float().div_(255.0)  # normalised once per batch, not per sample
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        state.clear()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_reading",
    expected_cases=["C-IO-009", "C-IO-004"],
    description=(
        "An RGB-D dataset as three small files per sample (3 KiB colour, 1 KiB depth, a class file); "
        "__getitem__ checks all three exist, opens and reads each; DataLoader(num_workers=0), batch 64: "
        "192 os.path.exists calls and 192 opens per step."
    ),
    fix="the samples packed once into one memory-mapped .npy shard plus a label array; no per-sample open",
    notes=[
        "The files sit on local disk in the page cache: each open costs microseconds, not the "
        "milliseconds of a network file system, so the measured speedup is a lower bound for the "
        "remote storage the case has in mind.",
        "C-IO-004 (the DataLoader wait is the self time of Python I/O calls) rests on the same "
        "evidence: the opens and stats are part of the reading it measures, so hermes folds "
        "C-IO-009 into it (listed under related) whenever C-IO-004 predicts more; either counts.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
