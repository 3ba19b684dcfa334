"""Scenario sync_logging: a synchronous log write to a slow file system in every step.

Model: a small MLP classifier (256 -> 512 -> 512 -> 10) trained with AdamW (fused=True in both
variants: the CPU default, a per-tensor loop, is a problem of its own, see optimizer_for_loop.py)
on synthetic data, batch 64, one intra-op thread.

Injected (bad): after every optimiser step the loop appends a metrics line to a log file the
"safe" way: open in append mode, write, flush, os.fsync, close. The log lives on a slow
(network/remote) file system, simulated by a 12 ms latency inside the write (time.sleep in the
fsync wrapper, the round trip a remote FS or metrics server typically costs). The step blocks on
storage for longer than it computes.

Fix (fixed): a buffered logger with a background writer: the step only appends the formatted
line to an in-memory list; every 10 steps the list is handed to a writer thread (a queue.Queue)
that writes, flushes and fsyncs it in one go, off the training thread (the slow-FS latency is
paid once per 10 steps, and not by the step). Same model, data, optimiser, and log content; the
writer is drained at teardown. (A first version flushed every 10th step on the training thread:
hermes still reported that flush on the twin, and with the flush taken out of the steps the
twin ran 1.36x faster, so that twin kept part of the problem.)
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

SLOW_FS_LATENCY_S = 0.012  # simulated round trip of a remote/slow file system per fsync
FLUSH_EVERY = 10


def _slow_fsync(fd: int) -> None:
    os.fsync(fd)
    time.sleep(SLOW_FS_LATENCY_S)


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)  # 2 shared cores: keep OpenMP noise out of the comparison
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def write_durably(text: str) -> None:
        with open(state["path"], "a") as f:
            f.write(text)
            f.flush()
            _slow_fsync(f.fileno())

    def writer(q: queue.Queue) -> None:
        while (text := q.get()) is not None:
            write_durably(text)

    def setup() -> None:
        state["dir"] = tempfile.mkdtemp(prefix="sync_logging_")
        state["path"] = os.path.join(state["dir"], "train.log")
        state["buf"] = []
        if variant == "fixed":
            state["queue"] = queue.Queue()
            state["writer"] = threading.Thread(target=writer, args=(state["queue"],), daemon=True)
            state["writer"].start()

    def teardown() -> None:
        if variant == "fixed":
            if state["buf"]:
                hand_over()
            state["queue"].put(None)
            state["writer"].join()
        shutil.rmtree(state["dir"], ignore_errors=True)

    def hand_over() -> None:
        state["queue"].put("".join(state["buf"]))
        state["buf"] = []

    def log_line(i: int, loss: float) -> None:
        line = f"{time.time():.3f} step={i} loss={loss:.5f} lr={opt.param_groups[0]['lr']:.2e}\n"
        if variant == "bad":
            write_durably(line)  # open/append/flush/fsync per step, on the training thread
        else:
            state["buf"].append(line)
            if len(state["buf"]) >= FLUSH_EVERY:
                hand_over()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        log_line(i, loss.item())

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="sync_logging",
    category="cpu",
    cause="blocking_host_io",
    expected_cases=["C-CPU-019", "C-CPU-005"],
    description=(
        "Every step appends a log line with open/write/flush/os.fsync/close to a slow file system "
        "(12 ms simulated latency per fsync): the step blocks on storage I/O on the host."
    ),
    fix="Buffer the log lines in memory and hand every 10 of them to a background writer thread (write + fsync off the training thread).",
    notes=[
        "Expected cases: C-CPU-019 (blocking file/storage I/O done in Python, named by the Python "
        "stacks) and C-CPU-005 (the same cause seen as long untraced stretches in traces without "
        "stacks); the harness records with_stack=True, so the blocked time is covered by python_function "
        "events (fsync/sleep/torch.save frames) and C-CPU-019 is the one that applies.",
        "The slow file system is simulated by time.sleep(0.012) after os.fsync; with with_stack=True "
        "the blocked time shows as Python (built-in sleep / _slow_fsync) rather than as an untraced gap.",
        "In the fixed variant the buffer is handed to the writer thread every 10 steps (step indices 9, 19, "
        "...): the profiled window (steps 4-9) and every timed round (steps 3-14) contain one hand-over; the "
        "write and fsync run on the writer thread (time.sleep releases the GIL).",
    ],
)

if __name__ == "__main__":
    common.main("sync_logging", make_run, LABEL)
