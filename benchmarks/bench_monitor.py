"""Monitor overhead and memory, measured against the bare loop in the same run.

    python benchmarks/bench_monitor.py            # needs torch for the overhead part (torch==2.13.0)

- overhead: a real CPU training loop (an MLP sized for ~10 ms steps), bare vs with the
  Monitor vs with torch.profiler always on; rounds alternate and the median round is kept;
- memory: 100k Monitor.step() calls; RSS after 1k steps vs after 100k (must stay flat).
"""

from __future__ import annotations

import statistics
import tempfile
import time


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        import os

        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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
        with tempfile.TemporaryDirectory() as d, Monitor(d, samples_per_step=64) as mon:
            for _ in range(steps):
                train_step()
                mon.step()

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
    # the loop frees and reallocates 4 MB gradients every step: whether glibc hands them back to
    # the OS (and the step faults them in again) depends on the heap's history, so print the faults
    return {"step_s": med, "monitor_overhead": med["monitor"] / med["bare"] - 1,
            "profiler_overhead": med["profiler"] / med["bare"] - 1, "rounds": rounds, "steps": steps,
            "faults_per_step": {k: statistics.median(v) for k, v in faults.items()}}  # fmt: skip


def main() -> None:
    m = memory()
    print(f"memory: RSS {m['rss_after_1k'] / 2**20:.1f} MB after 1k steps, {m['rss_after_all'] / 2**20:.1f} MB after "
          f"{m['steps']:,} steps (growth {m['growth_bytes'] / 2**10:.0f} KB)")  # fmt: skip
    print(f"cost of one Monitor.step(): {m['step_call_s'] * 1e6:.1f} µs = {m['step_call_s'] / 0.010:.3%} of a 10 ms step")
    o = overhead()
    if o is None:
        print("overhead: torch not installed (pip install torch==2.13.0)")
        return
    s = o["step_s"]
    print(f"overhead: bare {s['bare'] * 1e3:.2f} ms/step, monitor {s['monitor'] * 1e3:.2f} ms "
          f"({o['monitor_overhead']:+.2%}), torch.profiler always on {s['profiler'] * 1e3:.2f} ms "
          f"({o['profiler_overhead']:+.1%}); median of {o['rounds']} rounds, order rotated; minor faults per step "
          f"{', '.join(f'{k} {v:.0f}' for k, v in o['faults_per_step'].items())}")  # fmt: skip


if __name__ == "__main__":
    main()
