"""Shared harness for the scenario zoo: run a training loop profiled and unprofiled, for the
bad variant and its fixed twin, and write the trace, the timings and the label.

A scenario script defines ``make_run(variant: str) -> Run``: a callable running one training
step per call (``step(i)``), with optional ``setup()`` / ``teardown()``. This module does
the rest, identically for every scenario:

- run each variant as a monitored job: the always-on monitor (``hermes_kb.monitor.Monitor``)
  records every step of the run (``WARMUP`` steps, then at least ``MONITORED_STEPS`` more
  lasting at least ``MONITORED_MIN_S`` seconds, so that its CPU samples and process scans see
  something, but no more than ``MONITORED_MAX_STEPS`` steps or ``MONITORED_S`` seconds, then
  the profiled window) into the run directory
  ``<out>/<scenario>/<variant>/rank0.jsonl``, and torch.profiler (CPU activity, record_shapes,
  with_stack, Python GC recording) captures ``PROFILE_STEPS`` steps at the end into
  ``<out>/<scenario>/<variant>/rank0.capture-profile.json.gz``, where ``hermes advise RUN_DIR``
  finds it, as it finds the monitor's own captures;
- before each recording, wait (up to ``QUIET_WAIT_S``) until other processes leave the
  machine nearly idle, and record the background load measured;
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).resolve().parent / "recorded"
WARMUP = 3
MONITORED_STEPS = 24  # unprofiled monitored steps before the profiled window, at least ...
MONITORED_MIN_S = 1.5  # ... and more until this long (CPU samples are 10 ms jiffies; the monitor
#                        scans processes every 0.5 s here: a 0.3 s run would get no scan at all)
MONITORED_MAX_STEPS = 400
MONITORED_S = 4.0  # ... or fewer, when they take longer than this (at least 2)
QUIET_WAIT_S = float(os.environ.get("HERMES_QUIET_WAIT_S", "600"))  # shorter on a shared machine
QUIET_BUSY = 0.15  # the machine counts as quiet below this busy share of all its CPUs
PROFILE_STEPS = 6
TIMED_STEPS = 12
ROUNDS = 3


@dataclass
class Run:
    step: Callable[[int], None]
    setup: Callable[[], None] = lambda: None
    teardown: Callable[[], None] = lambda: None
    samples_per_step: int | None = None  # for throughput comparisons (small-batch scenario)
    device: str = "cpu"  # "cuda": the profiler records device activity too, and timing waits for the device
    timed_steps: int | None = None  # unprofiled steps per timing round (TIMED_STEPS when None)


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


def loader_train_step(state: dict, loader, model, opt, loss_fn) -> None:
    """One training step on the next batch of ``state["it"]`` (a new epoch when the loader is
    exhausted): what the DataLoader scenarios time."""
    try:
        x, y = next(state["it"])
    except StopIteration:
        state["it"] = iter(loader)
        x, y = next(state["it"])
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()


def small_cnn():
    """The small CNN several scenarios train on 3x32x32 images (conv 3->16->32, two linear layers)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def _busy_share(seconds: float = 1.0) -> float | None:
    """Busy share of all CPUs over ``seconds`` (from /proc/stat; None where it is absent)."""
    from hermes_kb.monitor.sampling import system_cpu_jiffies

    a = system_cpu_jiffies()
    time.sleep(seconds)
    b = system_cpu_jiffies()
    if a is None or b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def wait_for_quiet() -> dict:
    """Wait until the machine is nearly idle (other sessions share it), so that a recording
    shows the injected problem and not someone else's job. Returns what was measured."""
    t0 = time.monotonic()
    busy = _busy_share()
    while busy is not None and busy > QUIET_BUSY and time.monotonic() - t0 < QUIET_WAIT_S:
        time.sleep(4.0)
        busy = _busy_share()
    return {"busy_share_before": None if busy is None else round(busy, 3),
            "waited_s": round(time.monotonic() - t0, 1)}


def keep_freed_memory() -> None:
    """glibc keeps freed memory in the process: no trimming of the heap top and a fixed 32 MiB mmap
    threshold (the dynamic one would otherwise hand large tensors back to the OS at the end of
    every step and fault them in again in the next: C-MON-012's own fix, for scenarios that
    isolate another problem from it)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (its maximum on 64-bit)


_SCRATCH: dict[str, Path] = {}


def scratch_dir(prefix: str, write: Callable[[Path], None]) -> Path:
    """A temporary directory filled once per process by ``write(dir)`` and removed at exit: the
    datasets the loader scenarios read (the same directory for every variant and round)."""
    d = _SCRATCH.get(prefix)
    if d is None:
        import atexit

        d = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, d, True)
        write(d)
        _SCRATCH[prefix] = d
    return d


_RUNNING: list = []  # the Monitor of the monitored run in progress (at most one)


def save_checkpoint(directory: str, step: int, model, opt) -> None:
    """A synchronous checkpoint as training scripts write it: model and optimizer state through
    torch.save into a temporary file, flushed and fsync'ed, then renamed over the last one."""
    import torch

    path = os.path.join(directory, "ckpt.pt")
    with open(path + ".tmp", "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def running_monitor():
    """The Monitor of the monitored run in progress, None in the timed rounds: a step that marks
    events (``mon.event("checkpoint")``) or iterates ``mon.wrap(loader)`` asks for it here."""
    return _RUNNING[-1] if _RUNNING else None


def _profile(run: Run, run_dir: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from hermes_kb.monitor import Monitor

    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
    cuda = run.device.startswith("cuda")
    run.setup()
    # sample resources every other step and scan the other processes every half second: these
    # runs last seconds, not hours, so the monitor's defaults (50 steps, 10 s) would see nothing
    # on a GPU the monitor times each step on the device with CUDA events, as in a real job
    mon = Monitor(run_dir, rank=0, samples_per_step=run.samples_per_step, sample_every=2, procs_every_s=0.5,
                  capture=False, device_events=None if cuda else False)  # fmt: skip
    mon.start()
    _RUNNING.append(mon)
    try:
        i = 0
        for i in range(WARMUP):
            run.step(i)
            mon.step()
        t0 = time.perf_counter()
        for k in range(MONITORED_MAX_STEPS):
            elapsed = time.perf_counter() - t0
            if k >= 2 and elapsed > MONITORED_S or k >= MONITORED_STEPS and elapsed >= MONITORED_MIN_S:
                break
            i += 1
            run.step(i)
            mon.step()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=PROFILE_STEPS, repeat=1),
            record_shapes=True,
            with_stack=True,
            experimental_config=cfg,
        ) as prof:
            for _ in range(PROFILE_STEPS + 1):
                i += 1
                run.step(i)
                mon.step()
                prof.step()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            path = run_dir / "rank0.capture-profile.json.gz"
            with open(raw, "rb") as src, gzip.GzipFile(path, "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
    finally:
        _RUNNING.remove(mon)
        mon.close()
        run.teardown()


def _time(run: Run) -> list[float]:
    run.setup()
    n = run.timed_steps or TIMED_STEPS
    try:
        for i in range(WARMUP):
            run.step(i)
        if run.device.startswith("cuda"):
            # device work is asynchronous: time the block of steps from an idle device to an idle
            # device (no synchronisation between steps, which would change what a fix removes)
            import torch

            torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(n):
                run.step(WARMUP + i)
            torch.cuda.synchronize()
            return [(time.perf_counter() - t) / n] * n
        out = []
        for i in range(n):
            t = time.perf_counter()
            run.step(WARMUP + i)
            out.append(time.perf_counter() - t)
        return out
    finally:
        run.teardown()


def _child(script: str, variant: str, out: Path, env: dict[str, str]) -> list[list[float]]:
    """Record one variant, then time its ``ROUNDS`` rounds, in a fresh process with ``env`` added
    (settings read once at start, such as CUDA_LAUNCH_BLOCKING); the child prints the rounds'
    step times as JSON. Its rounds are not interleaved with the other variant's."""
    cmd = [sys.executable, script, "--child", variant, "--out", str(out.parent)]
    r = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{script} {variant} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def device_info() -> dict:
    """GPU, driver, CUDA and cuDNN of this machine (empty without a GPU): recorded in label.json."""
    import torch

    if not torch.cuda.is_available():
        return {}
    out = {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "gpu_count": torch.cuda.device_count()}  # fmt: skip
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20).stdout.strip().splitlines()  # fmt: skip
        if q:
            out["nvidia_smi"] = q[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def main(name: str, make_run: Callable[[str], Run], label: Label, variants=("bad", "fixed"),
         variant_env: dict[str, dict[str, str]] | None = None) -> dict:
    """``variant_env``: environment variables a variant needs from its process's start (each of its
    recordings and timing rounds then runs in a fresh child process)."""
    ap = argparse.ArgumentParser(description=f"record scenario {name}")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-trace", action="store_true", help="only time the variants")
    ap.add_argument("--no-timing", action="store_true",
                    help="only record the runs; keep the timings of the existing label.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from hermes_kb.core.cpus import host_cpu

    torch.manual_seed(0)
    if args.child:
        _profile(make_run(args.child), out / args.child)
        print(json.dumps([_time(make_run(args.child)) for _ in range(ROUNDS)]))
        raise SystemExit(0)
    variant_env = variant_env or {}
    script = os.path.abspath(sys.argv[0])

    child_rounds: dict[str, list[list[float]]] = {}

    def profile_variant(v: str) -> None:
        if v in variant_env:  # one fresh process per variant: its recording, then its timing rounds
            child_rounds[v] = _child(script, v, out, variant_env[v])
        else:
            _profile(make_run(v), out / v)

    def time_variant(v: str) -> list[float]:
        if v in variant_env:
            if v not in child_rounds:
                child_rounds[v] = _child(script, v, out, variant_env[v])
            return child_rounds[v].pop(0)
        return _time(make_run(v))

    old = json.loads((out / "label.json").read_text()) if (out / "label.json").is_file() else {}
    quiet: dict[str, dict] = dict(old.get("recording_load", {}))
    if not args.no_trace:
        for v in variants:
            gc.collect()
            quiet[v] = wait_for_quiet()
            profile_variant(v)
    timing_keys = ("step_s_best_round", "step_s_round_means", "step_s_median", "speedup_of_fix",
                   "throughput_speedup", "timed")  # fmt: skip
    if args.no_timing:
        if "step_s_best_round" not in old:
            raise SystemExit(f"--no-timing: no timings in {out / 'label.json'} to keep")
        timing = {k: old[k] for k in timing_keys if k in old}
    else:
        rounds: dict[str, list[float]] = {v: [] for v in variants}
        per_step: dict[str, list[float]] = {v: [] for v in variants}
        quiet["timing_rounds"] = []
        for _ in range(ROUNDS):
            quiet["timing_rounds"].append(wait_for_quiet())
            for v in variants:
                gc.collect()
                t = time_variant(v)
                rounds[v].append(statistics.fmean(t))
                per_step[v].extend(t)
        best = {v: min(rounds[v]) for v in variants}
        timing = {
            "step_s_best_round": best,
            "step_s_round_means": rounds,
            "step_s_median": {v: statistics.median(per_step[v]) for v in variants},
            "speedup_of_fix": best[variants[0]] / best[variants[1]] if len(variants) > 1 else None,
            "timed": _dt.date.today().isoformat(),
        }
    result = {
        **label.__dict__,
        "variants": list(variants),
        **timing,
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "cpu_model": host_cpu().get("model") or None,  # step times differ several-fold between hosts
        "python": platform.python_version(),
        **({"variant_env": variant_env} if variant_env else {}),
        **device_info(),
        "recorded": _dt.date.today().isoformat() if not args.no_trace else old.get("recorded"),
        "recording_load": quiet,
        "protocol": f"each variant one monitored run (hermes_kb Monitor every step): {WARMUP} warm-up steps, "
        f"{MONITORED_STEPS} to {MONITORED_MAX_STEPS} more (at least {MONITORED_MIN_S:g} s, at most {MONITORED_S:g} s), then "
        f"{PROFILE_STEPS} profiled steps captured into the run "
        f"directory; timing: {ROUNDS} rounds x {TIMED_STEPS} unprofiled steps per variant, alternating, best round mean",
    }
    if result.get("gpu"):
        result["protocol"] += (
            "; on the GPU the profiler records CPU and CUDA activity, the monitor times steps with CUDA events, "
            "and a timing round is one block of unprofiled steps (Run.timed_steps) between two device "
            "synchronisations, with none between its steps (step time = block time / steps)")

    (out / "label.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("scenario", "step_s_best_round", "speedup_of_fix")}, indent=1))
    return result
