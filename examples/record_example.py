#!/usr/bin/env python3
"""Record hermes' bundled example trace: a CPU training loop bound by data loading.

What it records
---------------
A real PyTorch profiler (Kineto) trace of a short CPU training loop with ONE
deliberately injected bottleneck, in the "io" category: slow data processing.
The ``Dataset.__getitem__`` runs a heavy per-sample transform (NumPy blur /
gamma / nonlinear tone-mapping / downsampling, about 2-4 ms per sample on a
typical CPU core) and the ``DataLoader`` uses ``num_workers=0``, so every batch
is produced synchronously in the training process. In the trace, the
``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` annotation
takes most (> 50 %) of each ``ProfilerStep#N``; the model (a small MLP) forward,
backward and optimizer step take only a few milliseconds.

The profiler is configured with activities=[CPU], schedule(wait=1, warmup=1,
active=5, repeat=1), record_shapes=True, with_stack=True and
``_ExperimentalConfig(record_python_gc_info=True)`` (adds "Python GC"
python_function events whenever the cyclic garbage collector runs). If the
installed torch rejects that option, the script falls back to a profile without
it and says so on stdout and in the generated README.

Outputs (paths relative to the repository root):

* ``examples/traces/cpu_dataloader_bound.json.gz``: the Chrome trace exported
  by ``prof.export_chrome_trace`` (to a temporary .json), then gzipped.
* ``examples/traces/README.md``: how the trace was made, what it contains, the
  unprofiled step times of the bad loop and of a fixed twin (``num_workers=2``,
  ``persistent_workers=True``, ``prefetch_factor=4``), the speedup, and the
  share of step time spent in ``DataLoader.__next__`` measured from the trace.

How to run
----------
    pip install torch==2.13.0 && python examples/record_example.py

(NumPy is needed too; it is usually installed alongside torch, otherwise
``pip install numpy``.) The run takes well under a minute on a 2-core machine.
Seeds are fixed (torch, NumPy per-sample generators, DataLoader shuffling), so
the data, the model and the event structure are deterministic; timings vary
with the machine.
"""

from __future__ import annotations

import datetime
import gc
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent
TRACE_DIR = HERE / "traces"
TRACE_PATH = TRACE_DIR / "cpu_dataloader_bound.json.gz"
README_PATH = TRACE_DIR / "README.md"

SEED = 0
BATCH_SIZE = 16
NUM_SAMPLES = 16 * 64  # enough batches for profiling and for timing
IMG = 128  # raw "decoded" image side; the transform downsamples it to 32x32
BLUR_PASSES = 12  # knob for the per-sample cost of the transform

# Profiler schedule: 1 wait + 1 warmup + 5 recorded steps.
WAIT, WARMUP, ACTIVE = 1, 1, 5
# Unprofiled timing: per round, warmup steps (excluded), then timed steps; the
# bad and fixed variants alternate for TIMING_ROUNDS rounds so that background
# load on a small shared machine hits both alike. The headline number per
# variant is its best (lowest) round mean, the least disturbed measurement.
TIMING_WARMUP, TIMING_STEPS, TIMING_ROUNDS = 3, 20, 5


def seed_everything(seed: int = SEED) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


# One intra-op thread for the (tiny) model in the training process: on a 2-core
# machine, two OpenMP threads stall on barriers whenever anything else runs
# (e.g. DataLoader workers), which would add a second, unintended bottleneck.
torch.set_num_threads(1)


class HeavyTransformDataset(Dataset):
    """Synthetic image classification data with an expensive per-sample transform.

    Each sample is generated from its own seeded NumPy generator, so the data
    does not depend on which process (main or worker) produces it.
    """

    def __init__(self, n: int = NUM_SAMPLES, seed: int = SEED):
        self.n = n
        self.seed = seed
        self._meta_cache: dict[int, dict] = {}

    def __len__(self) -> int:
        return self.n

    def _transform(self, raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # The injected bottleneck: CPU-heavy preprocessing done per sample.
        # Written with array operators and ufuncs (few Python-level calls), so
        # the with_stack trace stays small while the work stays expensive.
        img = raw.astype(np.float32) * (1.0 / 255.0)
        for _ in range(BLUR_PASSES):  # 5-point blur of the interior pixels
            img[:, 1:-1, 1:-1] = 0.2 * (
                img[:, 1:-1, 1:-1] + img[:, :-2, 1:-1] + img[:, 2:, 1:-1]
                + img[:, 1:-1, :-2] + img[:, 1:-1, 2:]
            )
        img = np.power(img, np.float32(0.8 + 0.4 * rng.random()))  # random gamma
        img = np.tanh(np.sin(img * 3.0) + np.cos(img * 2.0))  # "tone mapping"
        f = IMG // 32  # f x f block-average downsampling to 32x32
        img = np.add.reduce(np.add.reduce(img.reshape(3, 32, f, 32, f), axis=4), axis=2)
        img *= 1.0 / (f * f)
        mean = np.add.reduce(img.reshape(3, -1), axis=1).reshape(3, 1, 1) * (1.0 / 1024)
        img -= mean
        std = np.sqrt(np.add.reduce((img * img).reshape(3, -1), axis=1) * (1.0 / 1024))
        return (img / (std.reshape(3, 1, 1) + 1e-5)).astype(np.float32)

    def __getitem__(self, idx: int):
        rng = np.random.default_rng(self.seed * 1_000_003 + idx)
        raw = rng.integers(0, 256, size=(3, IMG, IMG), dtype=np.uint8)  # "decode"
        # "Parse" the sample's annotation record and cache it, as many real
        # datasets do: cheap, but the cache keeps growing by small Python
        # containers, so the cyclic garbage collector runs every ~14 samples
        # (-> short "Python GC" events in the trace; not the bottleneck).
        meta = self._meta_cache.get(idx)
        if meta is None:
            meta = {"id": idx, "label": idx % 10,
                    "boxes": [[float(k), float(k + 1), 4.0, 4.0] for k in range(48)]}
            self._meta_cache[idx] = meta
        x = torch.from_numpy(self._transform(raw, rng))
        return x, meta["label"]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(3 * 32 * 32, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def make_loader(fixed: bool) -> DataLoader:
    gen = torch.Generator().manual_seed(SEED)
    ds = HeavyTransformDataset()
    if not fixed:
        # The bottleneck: all preprocessing runs synchronously in the training loop.
        return DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=0,
                          generator=gen)
    # The fix: preprocess in worker processes, overlapping with training.
    return DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=2,
                      persistent_workers=True, prefetch_factor=4, generator=gen)


def train_step(model, opt, loss_fn, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()


def make_training():
    seed_everything()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt, nn.CrossEntropyLoss()


# --------------------------------------------------------------------------- #
# 1. Record the trace of the bad variant.
# --------------------------------------------------------------------------- #
def record_trace() -> bool:
    from torch.profiler import ProfilerActivity, profile, schedule

    model, opt, loss_fn = make_training()
    loader = make_loader(fixed=False)
    n_steps = WAIT + WARMUP + ACTIVE
    kwargs = dict(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        record_shapes=True,
        with_stack=True,
    )
    gc_info = True
    try:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            record_python_gc_info=True)
    except (AttributeError, TypeError) as exc:  # older/newer torch without the option
        print(f"note: record_python_gc_info unavailable ({exc}); profiling without it")
        kwargs.pop("experimental_config", None)
        gc_info = False

    with tempfile.TemporaryDirectory() as tmp:
        tmp_json = os.path.join(tmp, "trace.json")
        with profile(**kwargs) as prof:
            for step, (x, y) in enumerate(loader):
                train_step(model, opt, loss_fn, x, y)
                prof.step()
                if step + 1 >= n_steps:
                    break
        prof.export_chrome_trace(tmp_json)
        TRACE_DIR.mkdir(parents=True, exist_ok=True)
        # mtime=0 keeps the gzip header reproducible.
        with open(tmp_json, "rb") as src, open(TRACE_PATH, "wb") as raw_out, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw_out, mtime=0,
                              compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    return gc_info


# --------------------------------------------------------------------------- #
# 2. Time bad vs fixed without the profiler.
# --------------------------------------------------------------------------- #
def time_variant(fixed: bool) -> list[float]:
    model, opt, loss_fn = make_training()
    loader = make_loader(fixed)
    times: list[float] = []
    it = iter(loader)
    try:
        for step in range(TIMING_WARMUP + TIMING_STEPS):
            t0 = time.perf_counter()
            x, y = next(it)  # data loading is part of the step
            train_step(model, opt, loss_fn, x, y)
            dt = time.perf_counter() - t0
            if step >= TIMING_WARMUP:
                times.append(dt)
    finally:
        del it  # shuts down worker processes
    return times


# --------------------------------------------------------------------------- #
# 3. Measure the data-loader share of step time from the trace itself.
# --------------------------------------------------------------------------- #
def analyze_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]
    loads = [e for e in events if e.get("cat") == "user_annotation"
             and e["name"].startswith("enumerate(DataLoader)")]
    per_step = []
    for s in sorted(steps, key=lambda e: e["ts"]):
        s0, s1 = s["ts"], s["ts"] + s["dur"]
        inside = sum(e["dur"] for e in loads
                     if e["tid"] == s["tid"] and s0 <= e["ts"] and e["ts"] + e["dur"] <= s1)
        per_step.append((s["name"], s["dur"] / 1e3, inside / 1e3))
    total_step = sum(p[1] for p in per_step)
    total_load = sum(p[2] for p in per_step)
    counts: dict[tuple, int] = {}
    for e in trace["traceEvents"]:
        k = (e.get("ph"), e.get("cat"))
        counts[k] = counts.get(k, 0) + 1
    gcs = [e for e in events if e.get("cat") == "python_function"
           and e["name"].startswith("Python GC")]
    gc_in_loader = sum(1 for g in gcs if any(
        d["ts"] <= g["ts"] and g["ts"] + g["dur"] <= d["ts"] + d["dur"] for d in loads))
    return dict(per_step=per_step, share=total_load / total_step if total_step else 0.0,
                counts=counts, gc_events=len(gcs), gc_in_loader=gc_in_loader,
                gc_ms=sum(g["dur"] for g in gcs) / 1e3,
                loader_names=sorted({e["name"] for e in loads}),
                has_base_time="baseTimeNanoseconds" in trace)


def _busy_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine so far (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def _own_cpu_seconds() -> float:
    """CPU seconds of this process plus its reaped children (DataLoader workers)."""
    import resource
    tot = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        tot += ru.ru_utime + ru.ru_stime
    return tot


def summarize(rounds: list[list[float]]) -> dict:
    """Step-time statistics in ms over timing rounds (each a list of seconds)."""
    means = [statistics.mean(r) * 1e3 for r in rounds]
    flat = [x * 1e3 for r in rounds for x in r]
    return dict(best=min(means), rounds=means, mean=statistics.mean(flat),
                median=statistics.median(flat), n=len(flat))


def fmt_rounds(st: dict) -> str:
    return ", ".join(f"{m:.1f}" for m in st["rounds"])


def write_readme(gc_info: bool, bad: dict, fixed: dict, a: dict,
                 load: tuple[float, float], other: float | None) -> None:
    timing_rows = "\n".join(
        f"| {name} | {cfg} | **{st['best']:.1f} ms** | "
        f"{st['mean']:.1f} / {st['median']:.1f} ms | {fmt_rounds(st)} |"
        for name, cfg, st in (
            ("bad (traced)", "num_workers=0", bad),
            ("fixed twin", "num_workers=2, persistent_workers=True, prefetch_factor=4", fixed)))
    other_txt = ("" if other is None else
                 f" Other processes on the machine used {other:.2f} cores on average"
                 " while timing ran.")
    rows = "\n".join(f"| {n} | {s:.1f} | {l:.1f} | {100 * l / s:.0f} % |"
                     for n, s, l in a["per_step"])
    counts = "\n".join(f"| {ph} | {cat} | {n} |" for (ph, cat), n in
                       sorted(a["counts"].items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))))
    size_kb = TRACE_PATH.stat().st_size / 1024
    gc_line = ("`_ExperimentalConfig(record_python_gc_info=True)` "
               f"({a['gc_events']} `Python GC` python_function events in the trace)"
               if gc_info else
               "no `record_python_gc_info` (the option was rejected by this torch build)")
    text = f"""# Example traces

## `cpu_dataloader_bound.json.gz`

A real PyTorch profiler (Kineto) Chrome trace of a short CPU training loop
with one deliberately injected bottleneck. ({size_kb:.0f} KB gzipped.)

**How it was made**

    pip install torch==2.13.0 && python examples/record_example.py

* torch {torch.__version__}, NumPy {np.__version__}, Python {platform.python_version()}
* machine: {os.cpu_count()}-core CPU ({platform.machine()}, {platform.system()}), no GPU,
  torch intra-op threads: {torch.get_num_threads()}
* recorded {datetime.date.today().isoformat()}
* profiler: activities=[CPU], schedule(wait={WAIT}, warmup={WARMUP}, active={ACTIVE},
  repeat=1), record_shapes=True, with_stack=True, {gc_line};
  `prof.step()` after every iteration, so the recorded steps appear as
  `ProfilerStep#N` user_annotation events; exported with
  `prof.export_chrome_trace` and gzipped. Single process, no distributed info.

**Workload**: a 3-layer MLP (3072-128-64-10, SGD with momentum) on synthetic
3x32x32 images, batch size {BATCH_SIZE}. Each sample is "decoded" as a random
3x{IMG}x{IMG} uint8 image and run through a heavy NumPy transform in
`Dataset.__getitem__` (box blur x{BLUR_PASSES}, random gamma, sin/cos/tanh tone
mapping, 4x4 block downsampling, per-channel normalisation).

**Bottleneck (ground truth)**: category **io**, cause **slow data processing**:
a heavy per-sample transform in `__getitem__` with `DataLoader(num_workers=0)`,
so batches are produced synchronously inside the training step. In the trace
this shows up as the `{a['loader_names'][0] if a['loader_names'] else 'enumerate(DataLoader)...'}`
user_annotation dominating each `ProfilerStep#N`, while the ATen ops of
forward / backward / `Optimizer.step` are small.

**Share of step time in `DataLoader.__next__`, measured from the trace**
(sum of `enumerate(DataLoader)*` user_annotation durations nested in each
`ProfilerStep#N`, divided by the step duration): **{100 * a['share']:.1f} %**
over the {len(a['per_step'])} recorded steps.

| step | step ms | DataLoader.__next__ ms | share |
|---|---|---|---|
{rows}

Only the 5 active steps are recorded, hence `ProfilerStep#2`..`#6` (steps 0
and 1 are the wait and warmup steps). Profiled steps may be somewhat slower
than unprofiled ones: with_stack=True records every Python call.

**Unprofiled step times.** {TIMING_ROUNDS} alternating rounds per variant (bad,
fixed, bad, fixed, ...), each with a fresh model and DataLoader, {TIMING_WARMUP}
warmup steps (excluded) and {TIMING_STEPS} timed steps; a step = fetch the batch +
forward + backward + optimizer step. 1-min load average {load[0]:.2f} before /
{load[1]:.2f} after timing.{other_txt}

| variant | DataLoader settings | best round mean | mean / median of all {bad['n']} steps | round means (ms) |
|---|---|---|---|---|
{timing_rows}

Speedup of the fix: **{bad['best'] / fixed['best']:.2f}x** (best round means;
{bad['mean'] / fixed['mean']:.2f}x on the means of all steps). On a 2-core machine the
two workers share the cores with the training process, so the speedup is
bounded by roughly 2x; with more cores and workers it grows until the model
step becomes the bottleneck. The fixed twin needs both cores, so it suffers
most when other jobs share the machine; that is why the best round is the
headline number and all rounds are listed.

**Event counts by (ph, cat)**

| ph | cat | count |
|---|---|---|
{counts}

**Trace format notes** (torch {torch.__version__})

* Top-level keys besides `traceEvents`: `schemaVersion`, `deviceProperties`
  (empty on CPU), `trace_id`, `with_stack`, `record_shapes`, `host_name`,
  `displayTimeUnit`, `baseTimeNanoseconds` (present: {a['has_base_time']}) and
  `traceName` (the temporary .json path the trace was exported to). Event
  `ts`/`dur` are microseconds; `ts` is relative to `baseTimeNanoseconds`.
* Not every event has an integer `pid`/`tid`: the `PyTorch Profiler (0)`
  span (`cat: "Trace"`) has `pid: "Spans"`, and the two `ph: "i"` instant
  events have string pids (`"Traces"` and `""`).
* `ProfilerStep#N`, `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`,
  `Optimizer.zero_grad#SGD.zero_grad` and `Optimizer.step#SGD.step` are
  `ph: "X"`, `cat: "user_annotation"` events on the main thread; their `args`
  are `External id`, `Record function id` and `Ev Idx`.
* `Python GC` events are `ph: "X"`, `cat: "python_function"` events whose
  `args` hold only `Ev Idx` (no `Python id` / `Python parent id`, unlike the
  with_stack python_function events). Here {a['gc_in_loader']} of {a['gc_events']} fall inside
  `DataLoader.__next__` (the annotation cache in `__getitem__` triggers them),
  {a['gc_ms']:.2f} ms in total: not a bottleneck.
"""
    README_PATH.write_text(text)


def main() -> int:
    print(f"torch {torch.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs")
    gc_info = record_trace()
    print(f"wrote {TRACE_PATH} ({TRACE_PATH.stat().st_size / 1024:.0f} KB)")
    a = analyze_trace(TRACE_PATH)
    for name, s, l in a["per_step"]:
        print(f"  {name}: step {s:.1f} ms, DataLoader.__next__ {l:.1f} ms ({100 * l / s:.0f} %)")
    print(f"DataLoader share of step time (from trace): {100 * a['share']:.1f} %")
    print(f"Python GC events in trace: {a['gc_events']}")

    bad_rounds: list[list[float]] = []
    fixed_rounds: list[list[float]] = []
    load_before = os.getloadavg()[0]
    busy0, own0, wall0 = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
    for _ in range(TIMING_ROUNDS):
        gc.collect()
        bad_rounds.append(time_variant(fixed=False))
        gc.collect()
        fixed_rounds.append(time_variant(fixed=True))
    load_after = os.getloadavg()[0]
    busy1, own1, wall1 = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
    # CPU used by other processes on the machine during timing, in cores.
    other = (None if busy0 is None or busy1 is None
             else max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0))
    bad, fixed = summarize(bad_rounds), summarize(fixed_rounds)
    print(f"1-min load average before/after timing: {load_before:.2f} / {load_after:.2f}")
    if other is not None:
        print(f"CPU used by other processes during timing: {other:.2f} cores (average)")
    for label, st in (("bad   (num_workers=0)", bad), ("fixed (num_workers=2)", fixed)):
        print(f"unprofiled step time, {label}: best round mean {st['best']:.1f} ms; "
              f"all {st['n']} steps mean {st['mean']:.1f} / median {st['median']:.1f} ms; "
              f"round means {fmt_rounds(st)}")
    print(f"speedup: {bad['best'] / fixed['best']:.2f}x (best round means), "
          f"{bad['mean'] / fixed['mean']:.2f}x (means of all steps)")
    write_readme(gc_info, bad, fixed, a, (load_before, load_after), other)
    print(f"wrote {README_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
