"""Issue 22's scenario, without torch: two plain Python processes under the always-on monitor with
its default triggers, and three injected problems whose steps and sizes are known here:

- a noisy warm-up on both ranks: steps 0-39 take the base step plus up to 3x more, the extra
  fading linearly to nothing at step 40 (compilation, caches, allocator growth);
- slow steps on rank 0: every ``PERIOD`` steps from step ``FIRST_SLOW`` on, ``SLOW_S`` more
  (an unmarked stall: a synchronous save, a blocking log flush);
- a slowed rank: rank 1's steps take ``RANK1_EXTRA_S`` more, every step (a throttled or shared
  node).

The steps are mostly sleeps (``BASE_S`` with ~1 ms of Python work), so their lengths hold on a
loaded 2-core machine. The ranks do not synchronise (no torch.distributed): the domain is every
rank of the run directory ("all"). Captures use ``StepTracer``, a standard-library stand-in for
torch.profiler that writes a Chrome trace of the captured steps (``ProfilerStep#N`` annotations
and the steps' Python work), so the capture machinery runs as it would with torch.

    python benchmarks/monitor_triggers.py OUT_DIR [--steps 300]
    hermes advise OUT_DIR

tests/test_monitor_triggers.py::test_real_two_process_run_catches_slow_steps_and_slow_rank runs it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hermes_kb.monitor import Monitor  # noqa: E402

BASE_S = 0.010
WARMUP_NOISY = 40  # steps 0-39 are noisy
FIRST_SLOW = 100
PERIOD = 25
SLOW_S = 0.040
RANK1_EXTRA_S = 0.006
WORK = 2_000  # loop iterations of Python work per step (~0.1-0.3 ms)


def slow_steps(steps: int) -> list[int]:
    return list(range(FIRST_SLOW, steps, PERIOD))


class StepTracer:
    """A standard-library stand-in for torch.profiler.profile: the monitor's capturer enters it,
    calls step() at each captured step boundary, leaves it and asks for a Chrome trace."""

    def __init__(self, rank: int):
        self.rank = rank
        self.marks: list[float] = []

    def __enter__(self):
        self.marks = [time.time()]
        return self

    def step(self) -> None:
        self.marks.append(time.time())

    def __exit__(self, *exc) -> None:
        self.marks.append(time.time())

    def export_chrome_trace(self, path: str) -> None:
        t0 = self.marks[0]
        events = []
        for k, (a, b) in enumerate(zip(self.marks, self.marks[1:])):
            us, dur = (a - t0) * 1e6, (b - a) * 1e6
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": us, "dur": dur,
                           "pid": os.getpid(), "tid": 1})  # fmt: skip
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": us + 1.0, "dur": min(50.0, dur / 4),
                           "pid": os.getpid(), "tid": 1, "args": {"External id": k + 1}})  # fmt: skip
        with open(path, "w") as fh:
            json.dump({"traceEvents": events, "baseTimeNanoseconds": int(t0 * 1e9), "distributedInfo": {"rank": self.rank}},
                      fh)  # fmt: skip


def _work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def step_seconds(rank: int, i: int, rnd: random.Random) -> float:
    """What this script makes step i of ``rank`` last (the sleep; the Python work adds ~0.2 ms)."""
    t = BASE_S + (RANK1_EXTRA_S if rank == 1 else 0.0)
    if i < WARMUP_NOISY:
        t += BASE_S * rnd.uniform(0.0, 3.0) * (1.0 - i / WARMUP_NOISY)
    if rank == 0 and i >= FIRST_SLOW and (i - FIRST_SLOW) % PERIOD == 0:
        t += SLOW_S
    return t


def run_rank(rank: int, out: str, steps: int, peers_every_s: float) -> None:
    rnd = random.Random(1000 + rank)
    with Monitor(out, rank=rank, samples_per_step=32, poll_s=0.05, peers_every_s=peers_every_s,
                 profiler_factory=lambda: StepTracer(rank)) as mon:  # fmt: skip
        for i in range(steps):
            t = step_seconds(rank, i, rnd)
            t0 = time.perf_counter()
            _work(WORK)
            left = t - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
            mon.step()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--peers-every", type=float, default=0.25, help="seconds between slow-rank verdicts")
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(r, a.out, a.steps, a.peers_every)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"rank process exited with {p.exitcode}")


if __name__ == "__main__":
    main()
