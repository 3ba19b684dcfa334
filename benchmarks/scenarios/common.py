"""Shared harness for the scenario zoo: run a training loop profiled and unprofiled, for the
bad variant and its fixed twin, and write the trace, the timings and the label.

A scenario script defines ``make_run(variant: str) -> Run``: a callable running one training
step per call (``step(i)``), with optional ``setup()`` / ``teardown()``. This module does
the rest, identically for every scenario:

- profile ``PROFILE_STEPS`` steps (after ``WARMUP`` unprofiled ones) of each variant with
  torch.profiler (CPU activity, record_shapes, with_stack, Python GC recording) and write
  ``<out>/<scenario>/<variant>.json.gz``;
- time ``TIMED_STEPS`` unprofiled steps per round, ``ROUNDS`` rounds alternating bad and fixed
  (fresh runs each round), and keep the best round mean of each variant (machines here are
  shared: the best round is the least disturbed; all rounds are recorded too);
- write ``<out>/<scenario>/label.json``: category, cause, expected case ids, the measured step
  times and the speedup of the fix, torch version, machine, date.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).resolve().parent / "recorded"
WARMUP = 3
PROFILE_STEPS = 6
TIMED_STEPS = 12
ROUNDS = 3


@dataclass
class Run:
    step: Callable[[int], None]
    setup: Callable[[], None] = lambda: None
    teardown: Callable[[], None] = lambda: None
    samples_per_step: int | None = None  # for throughput comparisons (small-batch scenario)


@dataclass
class Label:
    scenario: str
    category: str  # the paper's class: parallel, io, cpu, computation, communication, or "none"
    cause: str
    expected_cases: list[str]  # case ids hermes should report first (any of them counts as a hit)
    description: str
    fix: str
    healthy: bool = False  # a control or a fixed twin: no high-severity finding expected
    notes: list[str] = field(default_factory=list)


def _profile(run: Run, path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
    run.setup()
    try:
        for i in range(WARMUP):
            run.step(i)
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=PROFILE_STEPS, repeat=1),
            record_shapes=True,
            with_stack=True,
            experimental_config=cfg,
        ) as prof:
            for i in range(PROFILE_STEPS + 1):
                run.step(WARMUP + i)
                prof.step()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.GzipFile(path, "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
    finally:
        run.teardown()


def _time(run: Run) -> list[float]:
    run.setup()
    try:
        for i in range(WARMUP):
            run.step(i)
        out = []
        for i in range(TIMED_STEPS):
            t = time.perf_counter()
            run.step(WARMUP + i)
            out.append(time.perf_counter() - t)
        return out
    finally:
        run.teardown()


def main(name: str, make_run: Callable[[str], Run], label: Label, variants=("bad", "fixed")) -> dict:
    ap = argparse.ArgumentParser(description=f"record scenario {name}")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-trace", action="store_true", help="only time the variants")
    args = ap.parse_args()
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.manual_seed(0)
    if not args.no_trace:
        for v in variants:
            gc.collect()
            _profile(make_run(v), out / f"{v}.json.gz")
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    per_step: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for v in variants:
            gc.collect()
            t = _time(make_run(v))
            rounds[v].append(statistics.fmean(t))
            per_step[v].extend(t)
    best = {v: min(rounds[v]) for v in variants}
    result = {
        **label.__dict__,
        "variants": list(variants),
        "step_s_best_round": best,
        "step_s_round_means": rounds,
        "step_s_median": {v: statistics.median(per_step[v]) for v in variants},
        "speedup_of_fix": best[variants[0]] / best[variants[1]] if len(variants) > 1 else None,
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "recorded": _dt.date.today().isoformat(),
        "protocol": f"{WARMUP} warmup steps, then {PROFILE_STEPS} profiled steps; timing: {ROUNDS} rounds x "
        f"{TIMED_STEPS} unprofiled steps per variant, alternating, best round mean",
    }
    (out / "label.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("scenario", "step_s_best_round", "speedup_of_fix")}, indent=1))
    return result
