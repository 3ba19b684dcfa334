"""A real 2-rank run under the always-on monitor, without torch: two plain Python processes
training a toy "model" (pure-Python arithmetic, ~10 ms a step), with two injected problems:

- rank 1 is slow: it does 60% more work per step (as a throttled or shared node would);
- rank 0 has a GC storm: a long-lived heap of ~160k tracked objects, gc thresholds lowered
  to (100, 2, 2), and objects with reference cycles kept alive for three steps, so full
  (generation-2) collections of ~20-40 ms come back every few steps;
- both ranks save a "checkpoint" (a 30 ms write, marked with ``mon.event("checkpoint")``)
  every 50 steps, which the advisor must tell apart from the GC spikes.

    python benchmarks/monitor_two_ranks.py OUT_DIR [--steps 300]

writes OUT_DIR/rank0.jsonl and OUT_DIR/rank1.jsonl; ``hermes advise OUT_DIR`` should name
the slow rank (1, compute) and the GC spikes (rank 0). tests/data/monitor_runs/two_ranks/
was made with this script (--steps 300).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hermes_kb.monitor import Monitor  # noqa: E402

WORK = 50_000  # loop iterations of the "model" step (~10 ms here)
SLOW_FACTOR = 1.6
CKPT_EVERY = 50


def _work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def _loader(steps: int):
    for i in range(steps):
        time.sleep(0.001)  # 1 ms to "read" a batch
        yield i


def run_rank(rank: int, out: str, steps: int) -> None:
    heap, recent = [], deque(maxlen=3)
    if rank == 0:
        heap = [{"i": i, "v": [i]} for i in range(80_000)]  # long-lived objects a full GC must scan
        gc.collect()
        gc.set_threshold(100, 2, 2)
    n = int(WORK * (SLOW_FACTOR if rank == 1 else 1.0))
    with Monitor(out, rank=rank, samples_per_step=32, sample_every=25, procs_every_s=1.0, capture=False) as mon:
        for i in mon.wrap(_loader(steps)):
            _work(n)
            if rank == 0:
                cycles = []
                for _ in range(1500):
                    a, b = [], []
                    a.append(b)
                    b.append(a)  # a reference cycle: only the collector frees it
                    cycles.append(a)
                recent.append(cycles)  # survives young collections, promoted, then dropped
            if i % CKPT_EVERY == CKPT_EVERY - 1:
                with mon.event("checkpoint"):
                    with open(os.devnull, "wb") as fh:
                        fh.write(b"x" * 1_000_000)
                    time.sleep(0.03)
            mon.step()
    del heap


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(r, a.out, a.steps)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"rank process exited with {p.exitcode}")


if __name__ == "__main__":
    main()
