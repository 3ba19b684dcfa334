#!/usr/bin/env python3
"""Scenario loader_compressed_archive: every sample is read out of a compressed zip in the step.

Injected problem (variant "bad"): the dataset is one deflate-compressed zip archive holding one
member per sample (the way datasets are often shipped: a .zip of arrays or images, or a
numpy .npz). ``Dataset.__getitem__`` opens the archive, reads the central directory, and
inflates its member, and the DataLoader runs with ``num_workers=0``: 32 archive opens and
decompressions per batch, in the process that waits for the batch.

Fix (variant "fixed"): the archive is unpacked once before training into one uncompressed
array file on local disk (``.npy``), memory-mapped; ``__getitem__`` indexes it. Same
DataLoader (num_workers=0), model and data.

Model: the small CNN of the other loader scenarios, SGD+momentum on 3x32x32 float32 samples
(smooth fields plus noise, so deflate has something to do: about 2:1), batch 32.

Expected diagnosis: category io, cause slow_data_processing, case C-IO-008 (the DataLoader
wait is spent under zipfile / zlib frames).

    cd /work/main && HERMES_QUIET_WAIT_S=120 /tmp/hm/tv/bin/python benchmarks/scenarios/loader_compressed_archive.py
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "loader_compressed_archive"
SEED = 0
BATCH = 32
NUM_SAMPLES = BATCH * 16
SHAPE = (3, 32, 32)

torch.set_num_threads(1)

def _write(d: Path) -> None:
    """Write the archive once per process (and its unpacked twin for the fix)."""
    rng = np.random.default_rng(SEED)
    yy, xx = np.meshgrid(np.linspace(0, 1, SHAPE[1]), np.linspace(0, 1, SHAPE[2]), indexing="ij")
    with zipfile.ZipFile(d / "samples.zip", "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for i in range(NUM_SAMPLES):
            f = rng.uniform(1, 6, size=(SHAPE[0], 2))
            x = np.sin(f[:, :1, None] * yy[None] * np.pi) * np.cos(f[:, 1:, None] * xx[None] * np.pi)
            x = (x + 0.05 * rng.standard_normal(SHAPE)).astype(np.float32)
            buf = io.BytesIO()
            np.save(buf, x)
            z.writestr(f"{i:05d}.npy", buf.getvalue())


def data_dir() -> Path:
    return common.scratch_dir("hermes_archive_", _write)


class ArchiveDataset(Dataset):
    """bad: open the zip and inflate one member per sample; fixed: an unpacked memory-mapped array."""

    def __init__(self, unpacked: bool) -> None:
        self.path = data_dir() / "samples.zip"
        self.unpacked = unpacked
        self.mem: np.ndarray | None = None
        self.labels = np.arange(NUM_SAMPLES) % 10

    def unpack(self) -> None:
        out = data_dir() / "samples.npy"
        if not out.exists():
            arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(NUM_SAMPLES, *SHAPE))
            with zipfile.ZipFile(self.path) as z:
                for i in range(NUM_SAMPLES):
                    arr[i] = np.load(io.BytesIO(z.read(f"{i:05d}.npy")))
            arr.flush()
            del arr
        self.mem = np.load(out, mmap_mode="r")

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, idx: int):
        if self.unpacked:
            x = np.array(self.mem[idx])
        else:
            with zipfile.ZipFile(self.path) as z:
                x = np.load(io.BytesIO(z.read(f"{idx:05d}.npy")))
        return torch.from_numpy(x), int(self.labels[idx])


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    data_dir()
    model = common.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ds = ArchiveDataset(unpacked=variant == "fixed")
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(SEED))  # fmt: skip
    state: dict = {}

    def setup() -> None:
        if ds.unpacked:
            ds.unpack()  # the fix: unpacked once, before training
        state["it"] = iter(loader)

    def step(i: int) -> None:
        common.loader_train_step(state, loader, model, opt, loss_fn)

    def teardown() -> None:
        state.clear()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_processing",
    expected_cases=["C-IO-008"],
    description=(
        "Each Dataset.__getitem__ opens a deflate-compressed zip of 512 array members (12 KiB each), "
        "reads its central directory and inflates one member; DataLoader(num_workers=0), batch 32: "
        "32 archive opens and decompressions per step."
    ),
    fix="unpack the archive once before training into an uncompressed .npy, memory-mapped",
    notes=[
        "With with_stack=True the time shows as zipfile.py frames (ZipFile.__init__ / "
        "_RealGetContents, ZipFile.read, ZipExtFile.read) and zlib decompress calls inside the "
        "DataLoader iterator's __next__.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
