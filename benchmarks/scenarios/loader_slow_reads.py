#!/usr/bin/env python3
"""Scenario loader_slow_reads: every sample is read from slow (remote-like) storage in the step.

Injected problem (variant "bad"): the dataset lives on a "remote storage" server, a separate
process that serves one sample file per request after a fixed access latency (LATENCY_S = 3 ms,
the order of an NFS/object-store round trip; the server then reads the file from local disk
and sends it). ``Dataset.__getitem__`` opens a connection-level request per sample and reads
the reply in small 4 KiB chunks (``socket.recv``), and the DataLoader runs with
``num_workers=0``, so each batch of 32 samples costs 32 round trips inside the training step.

Fix (variant "fixed"): read the dataset once: the whole dataset is fetched in one request (one
latency, one large sequential transfer, as a packed shard) before training and kept in memory;
``__getitem__`` indexes the in-memory array. Same DataLoader (num_workers=0), model and data.

Model: a small CNN trained with SGD+momentum on 3x32x32 float32 samples (12 KiB each), batch
size 32. Seeds are fixed (NumPy data generator, torch, shuffling).

Expected diagnosis: category io, cause slow_data_reading, case C-IO-004 (the data time is the
self time of Python I/O calls: here socket reads waiting on the storage server).

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/loader_slow_reads.py
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "loader_slow_reads"
SEED = 0
BATCH = 32
NUM_SAMPLES = BATCH * 16
SHAPE = (3, 32, 32)
SAMPLE_BYTES = int(np.prod(SHAPE)) * 4  # float32
LATENCY_S = 0.003  # per-request access latency of the storage server
CHUNK = 4096  # the client reads replies in small chunks
ALL = 0xFFFFFFFF  # request code: the whole dataset as one packed shard

torch.set_num_threads(1)

def _write(d: Path) -> None:
    """Write the dataset once per process: one .npy-like raw file per sample, plus labels."""
    rng = np.random.default_rng(SEED)
    for i in range(NUM_SAMPLES):
        rng.standard_normal(SHAPE, dtype=np.float32).tofile(d / f"{i:05d}.bin")


def data_dir() -> Path:
    return common.scratch_dir("hermes_slow_reads_", _write)


def _serve(sock: socket.socket, root: Path) -> None:
    """The storage server: one reply per request, after the access latency."""
    while True:
        head = sock.recv(4)
        if len(head) < 4:
            return
        (idx,) = struct.unpack("!I", head)
        time.sleep(LATENCY_S)  # remote access latency (metadata lookup + round trip)
        if idx == ALL:
            payload = b"".join((root / f"{i:05d}.bin").read_bytes() for i in range(NUM_SAMPLES))
        else:
            payload = (root / f"{idx:05d}.bin").read_bytes()
        sock.sendall(payload)


class Storage:
    """Client side of the storage server (started in setup, stopped in teardown)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.proc: mp.Process | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = mp.get_context("fork").Process(target=_serve, args=(theirs, data_dir()), daemon=True)
        self.proc.start()
        theirs.close()
        self.sock = ours

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.terminate()
            self.proc = None

    def get(self, idx: int, nbytes: int, chunk: int) -> bytearray:
        self.sock.sendall(struct.pack("!I", idx))
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        while got < nbytes:
            n = self.sock.recv_into(view[got:], min(chunk, nbytes - got))
            if n == 0:
                raise ConnectionError("storage server closed the connection")
            got += n
        return buf


class RemoteDataset(Dataset):
    """bad: one storage round trip per sample; fixed: the whole dataset read once into memory."""

    def __init__(self, storage: Storage, cached: bool) -> None:
        self.storage = storage
        self.cached = cached
        self.mem: np.ndarray | None = None
        self.labels = np.arange(NUM_SAMPLES) % 10

    def load_all(self) -> None:
        raw = self.storage.get(ALL, SAMPLE_BYTES * NUM_SAMPLES, 1 << 20)
        self.mem = np.frombuffer(raw, dtype=np.float32).reshape(NUM_SAMPLES, *SHAPE)

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, idx: int):
        if self.cached:
            x = self.mem[idx]
        else:
            x = np.frombuffer(self.storage.get(idx, SAMPLE_BYTES, CHUNK), dtype=np.float32).reshape(SHAPE)
        return torch.from_numpy(x.copy()), int(self.labels[idx])


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    data_dir()
    model = common.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    storage = Storage()
    ds = RemoteDataset(storage, cached=variant == "fixed")
    loader = DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=0, generator=torch.Generator().manual_seed(SEED)
    )
    state: dict = {}

    def setup() -> None:
        storage.start()
        if ds.cached:
            ds.load_all()  # the fix: one sequential read of the packed dataset, before training
        state["it"] = iter(loader)

    def step(i: int) -> None:
        common.loader_train_step(state, loader, model, opt, loss_fn)

    def teardown() -> None:
        state.clear()
        storage.stop()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="io",
    cause="slow_data_reading",
    expected_cases=["C-IO-004"],
    description=(
        "Each Dataset.__getitem__ fetches its sample from a storage server process with a 3 ms "
        "access latency per request (a model of NFS / object-store reads) and reads the reply in "
        "4 KiB socket.recv chunks; DataLoader(num_workers=0), batch 32: 32 round trips per step."
    ),
    fix="read the dataset once (one request for the packed dataset) into memory before training",
    notes=[
        "The latency is modelled by the server sleeping 3 ms per request before it reads the "
        "sample file from local disk; the client's wait shows up as the self time of "
        "socket.recv_into (a Python I/O call) inside the DataLoader iterator.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
