"""The monitor's own cost, measured against a bare loop in the same run.

    python benchmarks/bench_monitor.py                 # everything (torch parts need torch==2.13.0)
    python benchmarks/bench_monitor.py --only cost     # per-step cost at 1, 10 and 100 ms steps
    python benchmarks/bench_monitor.py --json out.json

- ``cost``: loops of steps of 1, 10 and 100 ms of CPU work (a busy wait on the clock, which holds
  the GIL like Python or dispatch-bound training does), each step fetching its batch through
  ``mon.wrap()`` and ending with ``mon.step()``, under the monitor's defaults (triggers on, the
  slow-rank board every 5 s, resource samples every second, process scans every 10 s; automatic
  captures on, with a profiler that does nothing, so that a trigger never starts torch.profiler
  here), against the same loop without the monitor. Rounds alternate (bare, monitored) and each
  reports: the wall time the monitor added per step (monitored - bare), the CPU time of the
  training thread inside ``step()`` (median and mean per call; the mean includes the periodic
  work: samples, statistics, notes) and the CPU time of the monitor's background thread per step.
  The figures are medians over the rounds, with their spread (min-max).
- ``capture``: a real torch.profiler capture (with_stack, shapes, FLOPs: what an automatic
  capture records) of a monitored training loop with ~1 ms and ~10 ms steps; from the trace, the
  share of the captured steps spent in the monitor's own frames (``hermes_kb/monitor/*.py``,
  what ``hermes advise`` warns about above 5%).
- ``overhead``: a small MLP training loop (~10 ms steps), bare vs monitored vs torch.profiler
  always on (rotated rounds, median).
- ``memory``: 100k ``Monitor.step()`` calls: RSS after 1k steps vs after 100k (must stay flat).

This machine is shared and noisy (a 2-vCPU VM with other jobs): run it twice and compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _thread_cpu(tid: int) -> float:
    """On-CPU seconds of a thread of this process (Linux), 0 where unknown."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class _NoProfiler:
    """A capture that does nothing: the triggers run, torch.profiler never starts."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None

    def step(self):
        pass

    def export_chrome_trace(self, path):
        Path(path).write_text('{"traceEvents": []}')


def memory(n: int = 100_000) -> dict:
    from hermes_kb.monitor import Monitor

    with tempfile.TemporaryDirectory() as d, Monitor(d) as mon:
        t = time.perf_counter()
        for i in range(n):
            mon.step()
            if i == 1000:
                early = _rss()
        per_step = (time.perf_counter() - t) / n
        late = _rss()
    return {"steps": n, "rss_after_1k": early, "rss_after_all": late, "growth_bytes": late - early,
            "step_call_s": per_step}  # fmt: skip


def _busy(seconds: float, pc=time.perf_counter) -> None:
    end = pc() + seconds
    while pc() < end:
        pass


def _batches(n: int):
    yield from range(n)


def _reference(pc=time.perf_counter) -> float:
    """A fixed piece of Python (a getrusage call, a formatted line, a dict): what code right after
    a step costs on this machine, against the same back-to-back."""
    import resource

    a = pc()
    r = resource.getrusage(resource.RUSAGE_SELF)
    line = '{"wall_s":%.6g,"cpu_s":%.6g,"minflt":%d}' % (r.ru_utime, r.ru_stime, r.ru_minflt)
    {"line": line, "n": len(line)}
    return pc() - a


def _bare(step_s: float, steps: int, ref: list[float] | None = None) -> float:
    t0 = time.perf_counter()
    for _ in iter(_batches(steps)):
        _busy(step_s)
        if ref is not None and len(ref) < 200:  # (first round only: the bare loop then runs a little longer)
            ref.append(_reference())
    return time.perf_counter() - t0


def _monitored(step_s: float, steps: int) -> dict:
    from hermes_kb.monitor import Monitor

    tt = time.thread_time
    inside: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        mon = Monitor(d, samples_per_step=32, profiler_factory=_NoProfiler)
        t0 = time.perf_counter()
        mon.start()
        bg = mon._ticker._thread if mon._ticker is not None else None
        bg0 = _thread_cpu(bg.native_id) if bg is not None else 0.0
        for _ in mon.wrap(_batches(steps)):
            _busy(step_s)
            a = tt()
            mon.step()
            inside.append(tt() - a)
        bg1 = _thread_cpu(bg.native_id) if bg is not None else 0.0
        mon.close()
        wall = time.perf_counter() - t0
        notes = Path(d, "rank0.monitor.jsonl").read_text().splitlines()
    triggers = sum(1 for x in notes if '"type":"trigger"' in x)
    return {"wall": wall, "inside": inside, "bg": bg1 - bg0, "triggers": triggers}


def _clock_pair() -> float:
    """What a pair of thread_time() calls costs (taken off the per-call times)."""
    tt = time.thread_time
    c = []
    for _ in range(5000):
        a = tt()
        c.append(tt() - a)
    return statistics.median(c)


def cost(step_ms: tuple[float, ...] = (1.0, 10.0, 100.0), rounds: int = 5, seconds: float = 3.0) -> list[dict]:
    pair = _clock_pair()
    hot = statistics.median(_reference() for _ in range(2000))
    out = []
    for ms in step_ms:
        step_s = ms / 1e3
        steps = max(40, int(seconds / step_s))
        added, med, mean, bg, trig, ref = [], [], [], [], 0, []
        for r in range(rounds):
            order = ("bare", "mon") if r % 2 == 0 else ("mon", "bare")
            got: dict = {}
            for which in order:
                got[which] = _bare(step_s, steps, ref if r == 0 else None) if which == "bare" else _monitored(step_s, steps)
            m = got["mon"]
            added.append((m["wall"] - got["bare"]) / steps)
            calls = [max(x - pair, 0.0) for x in m["inside"]]
            med.append(statistics.median(calls))
            mean.append(statistics.mean(calls))
            bg.append(m["bg"] / steps)
            trig += m["triggers"]
        per = {k: (statistics.median(v), min(v), max(v)) for k, v in
               (("added_wall_s", added), ("step_cpu_median_s", med), ("step_cpu_mean_s", mean),
                ("background_cpu_s", bg))}  # fmt: skip
        total = per["step_cpu_mean_s"][0] + per["background_cpu_s"][0]
        cold = statistics.median(ref)
        out.append({"step_ms": ms, "steps": steps, "rounds": rounds, **per, "cpu_total_s": total,
                    "share": total / step_s, "triggers_noted": trig, "reference_hot_s": hot, "reference_after_step_s": cold,
                    "machine_factor": cold / hot if hot > 0 else None})  # fmt: skip
    return out


def _profiled_loop(step_s: float, steps: int, capture_steps: int = 5) -> dict | None:
    """A monitored MLP loop of ~step_s per step with one real capture; the share of the captured
    steps in the monitor's frames."""
    try:
        import torch
    except ImportError:
        return None
    from hermes_kb.monitor import Monitor
    from hermes_kb.monitor.capture import write_request

    torch.manual_seed(0)
    torch.set_num_threads(1)

    def make(width: int):
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(64, width)

        def work():
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        for _ in range(3):
            work()
        t = time.perf_counter()
        for _ in range(10):
            work()
        return work, (time.perf_counter() - t) / 10

    width = 64
    work, per = make(width)
    while per < step_s and width < 8192:  # one optimizer step per training step, of about step_s
        width = int(width * 1.25) // 16 * 16 + 16
        work, per = make(width)
    reps = 1
    with tempfile.TemporaryDirectory() as d:
        with Monitor(d, samples_per_step=32, poll_s=0.05, auto_capture=False) as mon:
            for i in range(steps):
                if i == steps // 2:
                    write_request(d, steps=capture_steps, reason="bench")
                    time.sleep(0.2)  # the watcher picks it up
                for _ in range(reps):
                    work()
                mon.step()
        (trace,) = Path(d).glob("rank0.capture*.json.gz")
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps_ev = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    window = sum(float(e["dur"]) for e in steps_ev)
    lo = min(float(e["ts"]) for e in steps_ev)
    hi = max(float(e["ts"]) + float(e["dur"]) for e in steps_ev)
    tids = {e.get("tid") for e in steps_ev}  # the training thread (the background thread sleeps through it)
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                   if e.get("cat") == "python_function" and "hermes_kb/monitor/" in str(e.get("name", ""))
                   and e.get("tid") in tids and lo <= float(e["ts"]) <= hi)  # fmt: skip
    wins = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps_ev)
    in_step = [0.0] * len(wins)
    end = float("-inf")
    for a, b in spans:  # nested frames: count the time once, inside the captured steps only (as hermes does)
        for j, (wa, wb) in enumerate(wins):
            lo_, hi_ = max(a, end, wa), min(b, wb)
            if hi_ > lo_:
                in_step[j] += hi_ - lo_
        end = max(end, b)
    union = sum(in_step)
    shares = sorted(m / (wb - wa) for m, (wa, wb) in zip(in_step, wins) if wb > wa)
    return {"step_ms": step_s * 1e3, "width": width, "measured_step_ms": per * 1e3, "captured_steps": len(steps_ev),
            "captured_us": window, "monitor_us": union, "share": union / window if window else None,
            "median_step_share": shares[len(shares) // 2] if shares else None}  # fmt: skip


def capture(step_ms: tuple[float, ...] = (1.0, 10.0)) -> list[dict] | None:
    out = []
    for ms in step_ms:
        r = _profiled_loop(ms / 1e3, steps=max(60, int(2.0 / (ms / 1e3))))
        if r is None:
            return None
        out.append(r)
    return out


def overhead(steps: int = 60, rounds: int = 9) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    from hermes_kb.monitor import Monitor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024)

    def train_step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def bare():
        for _ in range(steps):
            train_step()

    def monitored():
        # flops=False: each round is a new monitor, and its one FLOP-counted step (measured apart,
        # below) would be a cost of every round instead of once a run
        with tempfile.TemporaryDirectory() as d, Monitor(d, samples_per_step=64, profiler_factory=_NoProfiler,
                                                          flops=False) as mon:  # fmt: skip
            for _ in range(steps):
                train_step()
                mon.step()

    def flop_count_cost() -> dict:
        """The one FLOP-counted step of a run against the median step."""
        with tempfile.TemporaryDirectory() as d:
            with Monitor(d, samples_per_step=64, profiler_factory=_NoProfiler, warmup=10) as mon:
                for _ in range(40):
                    train_step()
                    mon.step()
            notes = [json.loads(x) for x in Path(d, "rank0.monitor.jsonl").read_text().splitlines()]
            walls = {r["step"]: r["wall_s"] for r in map(json.loads, Path(d, "rank0.jsonl").read_text().splitlines())
                     if r["type"] == "step"}  # fmt: skip
        m = next((x for x in notes if x["type"] == "mfu" and x.get("counted_step") is not None), None)
        if m is None:
            return {}
        med = statistics.median(w for s, w in walls.items() if s > 12 and s != m["counted_step"])
        return {"counted_step_s": walls[m["counted_step"]], "median_step_s": med, "flops_per_step": m["flops_per_step"]}

    def profiled():
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True):
            for _ in range(steps):
                train_step()

    for _ in range(5):
        train_step()
    import resource

    times: dict[str, list[float]] = {"bare": [], "monitor": [], "profiler": []}
    faults: dict[str, list[float]] = {k: [] for k in times}
    variants = [("bare", bare), ("monitor", monitored), ("profiler", profiled)]
    for r in range(rounds):
        for name, fn in variants[r % 3:] + variants[: r % 3]:  # rotate the order: no variant always first
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) / steps)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [m / b - 1 for m, b in zip(times["monitor"], times["bare"])]
    fc = flop_count_cost()
    return {"step_s": med, "monitor_overhead": med["monitor"] / med["bare"] - 1,
            "monitor_overhead_spread": (min(ratios), max(ratios)),
            "profiler_overhead": med["profiler"] / med["bare"] - 1, "rounds": rounds, "steps": steps, "flop_count": fc,
            "faults_per_step": {k: statistics.median(v) for k, v in faults.items()}}  # fmt: skip


def _us(v: float) -> str:
    return f"{v * 1e6:,.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["cost", "capture", "overhead", "memory"], action="append")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    parts = set(a.only or ["cost", "capture", "overhead", "memory"])
    result: dict = {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None}
    if "cost" in parts:
        rows = result["cost"] = cost(rounds=a.rounds)
        print("monitor cost per step (defaults: triggers, board, samples every 1 s, scans every 10 s); "
              f"median [min-max] of {a.rounds} rounds, bare and monitored alternating")
        print("| step | wall added per step | CPU in step(): median call | mean call | background thread | "
              "total CPU | share of the step | reference snippet after a step (x back-to-back) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            w, md, mn, bg = r["added_wall_s"], r["step_cpu_median_s"], r["step_cpu_mean_s"], r["background_cpu_s"]
            print(f"| {r['step_ms']:g} ms ({r['steps']} steps) | {_us(w[0])} µs [{_us(w[1])}, {_us(w[2])}] | "
                  f"{_us(md[0])} µs [{_us(md[1])}, {_us(md[2])}] | {_us(mn[0])} µs [{_us(mn[1])}, {_us(mn[2])}] | "
                  f"{_us(bg[0])} µs | {_us(r['cpu_total_s'])} µs | {r['share']:.3%} | "
                  f"{_us(r['reference_after_step_s'])} µs ({r['machine_factor']:.1f}x) |")  # fmt: skip
        print(f"(the reference snippet: one getrusage call, a formatted line and a dict: {_us(rows[0]['reference_hot_s'])} "
              f"µs back-to-back; after a step of CPU work this machine runs it slower, and the monitor alike)")
    if "capture" in parts:
        rows = result["capture"] = capture()
        if rows is None:
            print("capture: torch not installed (pip install torch==2.13.0)")
        else:
            for r in rows:
                print(f"capture of {r['captured_steps']} steps of an MLP of width {r['width']} ({r['measured_step_ms']:.1f} ms "
                      f"a step unprofiled; torch.profiler, with_stack): the monitor's frames on the training thread "
                      f"{r['monitor_us']:,.0f} µs of {r['captured_us']:,.0f} µs = {r['share']:.2%} (median captured "
                      f"step {r['median_step_share']:.2%})")  # fmt: skip
    if "overhead" in parts:
        o = result["overhead"] = overhead()
        if o is None:
            print("overhead: torch not installed (pip install torch==2.13.0)")
        else:
            s = o["step_s"]
            lo, hi = o["monitor_overhead_spread"]
            print(f"MLP loop: bare {s['bare'] * 1e3:.2f} ms/step, monitor {s['monitor'] * 1e3:.2f} ms "
                  f"({o['monitor_overhead']:+.2%}; rounds {lo:+.1%} to {hi:+.1%}), torch.profiler always on "
                  f"{s['profiler'] * 1e3:.2f} ms ({o['profiler_overhead']:+.1%}); median of {o['rounds']} rotated rounds; "
                  f"minor faults per step {', '.join(f'{k} {v:.0f}' for k, v in o['faults_per_step'].items())}")  # fmt: skip
            fc = o["flop_count"]
            if fc:
                print(f"the one FLOP-counted step of a run (FlopCounterMode, {fc['flops_per_step']:,.0f} FLOPs): "
                      f"{fc['counted_step_s'] * 1e3:.2f} ms against a median step of {fc['median_step_s'] * 1e3:.2f} ms")  # fmt: skip
    if "memory" in parts:
        m = result["memory"] = memory()
        print(f"memory: RSS {m['rss_after_1k'] / 2**20:.1f} MB after 1k steps, {m['rss_after_all'] / 2**20:.1f} MB "
              f"after {m['steps']:,} steps (growth {m['growth_bytes'] / 2**10:.0f} KB); back-to-back step() "
              f"{m['step_call_s'] * 1e6:.1f} µs")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
