#!/usr/bin/env python3
"""Scenario loader_shard_boundary: the input pipeline falls behind at every shard boundary.

Model: the small CNN of the other loader scenarios (conv 3->16->32, two linear layers), SGD +
momentum on 3x32x32 float32 samples, batch 32, one intra-op thread.

Data: the dataset is stored as compressed shards (``np.savez_compressed``, float16, 12 batches
= 384 samples per shard, 4 shards), the way sharded datasets are shipped. ``Dataset.__getitem__``
keeps the current shard in memory; the first sample of a new shard loads it (inflate, float16
-> float32), a few tens of ms, then the next 383 samples are memory reads.

Injected (bad): ``DataLoader(num_workers=0)``: the training process loads each shard itself
when it reaches it, so every 12th step waits for the shard while the other 11 get their batch
at once. The job runs with the hermes monitor and iterates ``mon.wrap(loader)``, so the monitor
times the wait for every batch: a regular data-wait spike every 12 steps.

Fix (fixed): the case's second advice, remove the source of the slow batches: the spikes come
every 12 steps, at each shard boundary, so the Dataset prefetches the next shard: when it
starts serving a shard it submits the load of the following one to a background thread
(zlib's inflate and NumPy's float16 -> float32 conversion release the GIL, so the load runs on
the other core); at the boundary the next shard is ready. Same DataLoader (num_workers=0),
model and data. (The case's first advice, a worker process with a deep prefetch --
``num_workers=1, persistent_workers=True, prefetch_factor=12`` -- was tried first: on this
2-core machine the worker's per-batch hand-over through shared memory cost the main process
more than the shard loads did, 12.1 ms per step against 10.7 ms, and hermes rightly reported
the wait on the worker queue, C-IO-003.)

Every timed round (indices 3-14) holds one shard load (index 12) in the bad variant, its real
rate. The loop wraps its loader with the harness's running Monitor (common.running_monitor());
the timed rounds run without one.

Expected diagnosis: category io, cause slow_data_loading, case C-MON-004 (the input pipeline
falls behind now and then; from the monitor log). When the profiled steps hold a shard load,
the trace shows it as DataLoader wait too.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "loader_shard_boundary"
SEED = 0
BATCH = 32
SHARD_BATCHES = 12
SHARD = BATCH * SHARD_BATCHES
SHARDS = 4
SHAPE = (3, 32, 32)

torch.set_num_threads(1)

def _write(d: Path) -> None:
    """Write the shards once per process: smooth fields plus noise (float16, so the shard
    compresses and inflating it is real work), and labels."""
    rng = np.random.default_rng(SEED)
    for s in range(SHARDS):
        base = rng.standard_normal((SHARD, 3, 8, 8)).astype(np.float32)
        x = np.repeat(np.repeat(base, 4, axis=2), 4, axis=3)
        x += 0.05 * rng.standard_normal((SHARD, *SHAPE)).astype(np.float32)
        np.savez_compressed(d / f"shard-{s:04d}.npz", x=x.astype(np.float16), y=rng.integers(0, 10, SHARD))


def data_dir() -> Path:
    return common.scratch_dir("hermes_shards_", _write)


class ShardDataset(Dataset):
    """Map-style view of the shards, read in order; one shard is held in memory at a time."""

    def __init__(self, root: Path, prefetch: bool = False):
        self.root = root
        self.cur = -1
        self.x: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.pool = ThreadPoolExecutor(1) if prefetch else None
        self.next: tuple[int, Future] | None = None

    def __len__(self) -> int:
        return SHARD * SHARDS

    def _read(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.root / f"shard-{s:04d}.npz") as z:
            return z["x"].astype(np.float32), z["y"].astype(np.int64)

    def _load(self, s: int) -> None:
        if self.next is not None and self.next[0] == s:
            self.x, self.y = self.next[1].result()  # prefetched while the last shard was served
        else:
            self.x, self.y = self._read(s)
        self.cur = s
        if self.pool is not None:
            n = (s + 1) % SHARDS
            self.next = (n, self.pool.submit(self._read, n))

    def __getitem__(self, idx: int):
        s, j = divmod(idx, SHARD)
        if s != self.cur:
            self._load(s)
        return torch.from_numpy(self.x[j]), int(self.y[j])


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    ds = ShardDataset(data_dir(), prefetch=variant == "fixed")
    model = common.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=0)
    state: dict = {}

    def batches():
        # the job's loop: `for x, y in mon.wrap(loader)` when the monitor runs
        it = iter(loader)
        mon = common.running_monitor()
        return (mon.wrap(it) if mon is not None else it), mon

    def setup() -> None:
        state["it"], state["mon"] = batches()

    def step(i: int) -> None:
        mon = common.running_monitor()
        if mon is not state["mon"]:  # the monitor starts after setup(): wrap the running iterator
            state["it"], state["mon"] = mon.wrap(state["it"]) if mon is not None else state["it"], mon
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"], state["mon"] = batches()
            x, y = next(state["it"])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        state.clear()
        if ds.pool is not None:
            ds.pool.shutdown(wait=True)

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_loading",
    expected_cases=["C-MON-004"],
    description=(
        "The dataset is 4 compressed shards of 12 batches (np.savez_compressed, float16); the "
        "Dataset loads a shard when it reaches its first sample, and DataLoader(num_workers=0) "
        "does it in the training process: every 12th step waits tens of ms for its batch, the "
        "others none (monitored with mon.wrap(loader))."
    ),
    fix="the Dataset prefetches the next shard in a background thread (ready at the boundary)",
    notes=[
        "The loop iterates mon.wrap(loader) on the harness's running Monitor (common.running_monitor()); "
        "the timed rounds run without one.",
        "Every timed round (indices 3-14) holds one shard load in the bad variant (index 12).",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
