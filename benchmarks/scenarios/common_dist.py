"""Harness for the multi-rank scenarios of the zoo: a job of ``WORLD`` ranks on this CPU machine,
recorded and timed the way ``common.py`` records and times a one-process scenario.

A scenario script defines ``make_run(variant: str, rank: int, world: int) -> Run``, called inside
each rank's process after torch.distributed is initialised, and calls ``main(name, make_run,
label)``. ``Run`` is common.py's (``step(i)``, optional ``setup()`` / ``teardown()``,
``samples_per_step``) with one addition here: an optional ``batches``, a callable returning the
rank's batch iterator; when it is given, each step gets the next batch (``step(i, batch)``),
and in the monitored run the iterator is wrapped with ``mon.wrap()`` so that the monitor records
the time blocked on the next batch (its data wait), as a job using hermes would.

- the job: ``WORLD`` processes started with torch.multiprocessing (spawn), one per rank, each
  with ``torch.set_num_threads(1)`` (the machine has 2 cores), joined by
  ``torch.distributed.init_process_group("gloo")`` over a ``file://`` store in a fresh temporary
  directory (no port to pick, nothing left behind);
- recording, per variant: after common.py's quiet-machine wait, each rank runs the monitor
  exactly as common.py does (``Monitor(run_dir, rank=R, sample_every=2, procs_every_s=0.5,
  capture=False, device_events=False)``, started after the process group exists so that it finds
  the group and times the collectives issued from Python), ``WARMUP`` steps, then the monitored
  steps, then ``PROFILE_STEPS`` steps under torch.profiler (same settings as common.py), and writes
  ``<out>/<scenario>/<variant>/rank<R>.jsonl`` and ``rank<R>.capture-profile.json.gz``. The ranks
  run collectives in every step, so they must run the same number of steps: rank 0 picks the
  number of monitored steps from its warm-up step time with common.py's bounds (at least
  ``MONITORED_STEPS`` and ``MONITORED_MIN_S``, at most ``MONITORED_MAX_STEPS`` and
  ``MONITORED_S``) and passes it to the others through the process group's store (a key/value
  store, not a collective: nothing appears in the monitor's log or the traces);
- timing: common.py's protocol (``ROUNDS`` rounds alternating bad and fixed, fresh jobs each
  round, ``WARMUP`` then ``TIMED_STEPS`` unprofiled steps, quiet-machine wait before each round);
  a round's step time is the job's: the mean step of its slowest rank (in synchronous training
  every rank waits for it), and the best round of each variant is kept;
- ``<out>/<scenario>/label.json``: as common.py writes it, plus ``world`` (ranks) and
  ``step_s_per_rank`` (the best round's mean step of every rank).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import OUT, Label, wait_for_quiet  # noqa: E402,F401  (Label: re-exported for the scenarios)

WORLD = 2
BACKEND = "gloo"


@dataclass
class Run(common.Run):
    batches: Callable[[], Iterator] | None = None  # the rank's batch iterator; step(i, batch) when given


def _call(run: Run, i: int, it: Iterator | None) -> None:
    if it is None:
        run.step(i)
    else:
        run.step(i, next(it))


def _init(rank: int, world: int, store_dir: str):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(BACKEND, init_method=f"file://{store_dir}/store", rank=rank, world_size=world)
    return dist


def _profile_rank(rank: int, world: int, store_dir: str, make_run, variant: str, run_dir: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from hermes_kb.monitor import Monitor

    dist = _init(rank, world, store_dir)
    store = dist.distributed_c10d._get_default_store()
    run_dir = Path(run_dir)
    cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
    run = make_run(variant, rank, world)
    run.setup()
    mon = Monitor(run_dir, rank=rank, samples_per_step=run.samples_per_step, sample_every=2, procs_every_s=0.5,
                  capture=False, device_events=False)  # fmt: skip
    mon.start()
    try:
        it = mon.wrap(run.batches()) if run.batches is not None else None
        i = 0
        last = 0.0
        for i in range(common.WARMUP):
            t = time.perf_counter()
            _call(run, i, it)
            mon.step()
            last = time.perf_counter() - t
        if rank == 0:
            # common.py's bounds: at least MONITORED_STEPS and MONITORED_MIN_S, at most
            # MONITORED_MAX_STEPS and MONITORED_S (and at least 2), from the last warm-up step
            want = max(common.MONITORED_STEPS, math.ceil(common.MONITORED_MIN_S / max(last, 1e-6)))
            cap = max(2, int(common.MONITORED_S / max(last, 1e-6)))
            n = max(2, min(want, cap, common.MONITORED_MAX_STEPS))
            store.set("hermes_monitored_steps", str(n))
        n = int(store.get("hermes_monitored_steps").decode())
        for _ in range(n):
            i += 1
            _call(run, i, it)
            mon.step()
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=common.PROFILE_STEPS, repeat=1),
            record_shapes=True,
            with_stack=True,
            experimental_config=cfg,
        ) as prof:
            for _ in range(common.PROFILE_STEPS + 1):
                i += 1
                _call(run, i, it)
                mon.step()
                prof.step()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            path = run_dir / f"rank{rank}.capture-profile.json.gz"
            with open(raw, "rb") as src, gzip.GzipFile(path, "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
    finally:
        mon.close()
        run.teardown()
        dist.barrier()  # no rank leaves while another still needs the store
        dist.destroy_process_group()


def _time_rank(rank: int, world: int, store_dir: str, make_run, variant: str, out_file: str) -> None:
    dist = _init(rank, world, store_dir)
    run = make_run(variant, rank, world)
    run.setup()
    try:
        it = iter(run.batches()) if run.batches is not None else None
        for i in range(common.WARMUP):
            _call(run, i, it)
        out = []
        for i in range(common.TIMED_STEPS):
            t = time.perf_counter()
            _call(run, common.WARMUP + i, it)
            out.append(time.perf_counter() - t)
        Path(out_file).write_text(json.dumps(out))
    finally:
        run.teardown()
        dist.barrier()
        dist.destroy_process_group()


def _job(fn, *args) -> None:
    """Run ``fn(rank, WORLD, store_dir, *args)`` in WORLD fresh processes, one per rank."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="hermes_dist_") as store_dir:
        mp.spawn(_entry, args=(fn, store_dir, args), nprocs=WORLD, join=True)


def _entry(rank: int, fn, store_dir: str, args: tuple) -> None:
    fn(rank, WORLD, store_dir, *args)


def _record(make_run, variant: str, run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    _job(_profile_rank, make_run, variant, str(run_dir))
    peers = run_dir / "peers"  # the monitor's slow-rank board: live exchange between the ranks, not a record
    if peers.is_dir():
        shutil.rmtree(peers)


def _time(make_run, variant: str) -> list[list[float]]:
    """Per rank, the TIMED_STEPS step times of one fresh job."""
    with tempfile.TemporaryDirectory(prefix="hermes_dist_times_") as tmp:
        files = [os.path.join(tmp, f"rank{r}.json") for r in range(WORLD)]
        _job(_time_rank_to, make_run, variant, tmp)
        return [json.loads(Path(f).read_text()) for f in files]


def _time_rank_to(rank: int, world: int, store_dir: str, make_run, variant: str, tmp: str) -> None:
    _time_rank(rank, world, store_dir, make_run, variant, os.path.join(tmp, f"rank{rank}.json"))


def main(name: str, make_run: Callable[[str, int, int], Run], label: Label, variants=("bad", "fixed")) -> dict:
    ap = argparse.ArgumentParser(description=f"record multi-rank scenario {name} ({WORLD} ranks, {BACKEND})")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-trace", action="store_true", help="only time the variants")
    ap.add_argument("--no-timing", action="store_true",
                    help="only record the runs; keep the timings of the existing label.json")
    ap.add_argument("--check-keep-memory", metavar="VARIANT",
                    help="only time VARIANT as recorded and with glibc keeping freed memory (C-MON-012's fix), "
                         "as verify_secondary.py's keep_memory check does, into secondary.json")  # fmt: skip
    args = ap.parse_args()
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    if args.check_keep_memory:
        return keep_memory_check(out, make_run, args.check_keep_memory)
    import torch

    from hermes_kb.core.cpus import host_cpu

    old = json.loads((out / "label.json").read_text()) if (out / "label.json").is_file() else {}
    quiet: dict[str, dict] = dict(old.get("recording_load", {}))
    if not args.no_trace:
        for v in variants:
            gc.collect()
            quiet[v] = wait_for_quiet()
            _record(make_run, v, out / v)
    timing_keys = ("step_s_best_round", "step_s_round_means", "step_s_median", "speedup_of_fix",
                   "step_s_per_rank", "timed")  # fmt: skip
    if args.no_timing:
        if "step_s_best_round" not in old:
            raise SystemExit(f"--no-timing: no timings in {out / 'label.json'} to keep")
        timing = {k: old[k] for k in timing_keys if k in old}
    else:
        rounds: dict[str, list[float]] = {v: [] for v in variants}
        ranks_of: dict[str, list[list[float]]] = {v: [] for v in variants}
        per_step: dict[str, list[float]] = {v: [] for v in variants}
        quiet["timing_rounds"] = []
        for _ in range(common.ROUNDS):
            quiet["timing_rounds"].append(wait_for_quiet())
            for v in variants:
                gc.collect()
                t = _time(make_run, v)
                means = [statistics.fmean(x) for x in t]
                rounds[v].append(max(means))  # the job's step: its slowest rank's
                ranks_of[v].append(means)
                per_step[v].extend(max(xs) for xs in zip(*t))
        best_i = {v: min(range(len(rounds[v])), key=rounds[v].__getitem__) for v in variants}
        best = {v: rounds[v][best_i[v]] for v in variants}
        timing = {
            "step_s_best_round": best,
            "step_s_round_means": rounds,
            "step_s_per_rank": {v: ranks_of[v][best_i[v]] for v in variants},
            "step_s_median": {v: statistics.median(per_step[v]) for v in variants},
            "speedup_of_fix": best[variants[0]] / best[variants[1]] if len(variants) > 1 else None,
            "timed": _dt.date.today().isoformat(),
        }
    result = {
        **label.__dict__,
        "variants": list(variants),
        "world": WORLD,
        **timing,
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "cpu_model": host_cpu().get("model") or None,
        "python": platform.python_version(),
        "recorded": _dt.date.today().isoformat() if not args.no_trace else old.get("recorded"),
        "recording_load": quiet,
        "protocol": f"{WORLD} ranks (one process each, torch.distributed {BACKEND} over a file:// store, one "
        f"intra-op thread each); each variant one monitored job (hermes_kb Monitor every step on every rank): "
        f"{common.WARMUP} warm-up steps, {common.MONITORED_STEPS} to {common.MONITORED_MAX_STEPS} more (at least "
        f"{common.MONITORED_MIN_S:g} s, at most {common.MONITORED_S:g} s, from rank 0's warm-up step time, the "
        f"same count on every rank), then {common.PROFILE_STEPS} profiled steps captured into the run directory "
        f"on every rank; timing: {common.ROUNDS} rounds x {common.TIMED_STEPS} unprofiled steps per variant, "
        f"alternating, fresh jobs, the job's step = its slowest rank's mean step, best round",
    }
    (out / "label.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("scenario", "step_s_best_round", "speedup_of_fix")}, indent=1))
    return result


KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


def keep_memory_check(out: Path, make_run, variant: str) -> dict:
    """C-MON-012's fix applied to a variant (glibc keeps freed memory, every rank's process: the
    environment is inherited) and timed against the variant as recorded: ``ROUNDS`` alternating
    rounds of fresh jobs, the job's step, best round; written to ``secondary.json`` under
    ``<variant>/C-MON-012`` in verify_secondary.py's format (what benchmarks/eval.py reads)."""
    import torch

    rounds: dict[str, list[float]] = {"as_recorded": [], "second_fix": []}
    load = []
    for _ in range(common.ROUNDS):
        load.append(wait_for_quiet())
        for k in rounds:
            saved = {e: os.environ.get(e) for e in KEEP_MEMORY}
            if k == "second_fix":
                os.environ.update(KEEP_MEMORY)
            try:
                gc.collect()
                rounds[k].append(max(statistics.fmean(x) for x in _time(make_run, variant)))
            finally:
                for e, v in saved.items():
                    if v is None:
                        os.environ.pop(e, None)
                    else:
                        os.environ[e] = v
    best = {k: min(v) for k, v in rounds.items()}
    rec = {
        "variant": variant, "check": "keep_memory", "case": "C-MON-012",
        "change": "glibc keeps freed memory: " + ", ".join(f"{k}={v}" for k, v in KEEP_MEMORY.items()),
        "step_s_best_round": best, "step_s_round_means": rounds,
        "speedup": best["as_recorded"] / best["second_fix"], "timing_load": load, "torch": torch.__version__,
        "protocol": f"{WORLD} ranks; {common.ROUNDS} rounds x {common.TIMED_STEPS} unprofiled steps of the variant, "
        "as recorded and with the second fix, alternating, fresh jobs, the job's step (its slowest rank's mean); "
        "best round mean",
    }  # fmt: skip
    path = out / "secondary.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    done[f"{variant}/C-MON-012"] = rec
    path.write_text(json.dumps(done, indent=1) + "\n")
    print(json.dumps({"check": f"{variant}/C-MON-012", "speedup": rec["speedup"], "best": best}))
    return rec
