"""The always-on monitor: light import, one JSON line per step, GC and data wait, fluctuations."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_kb.monitor import Monitor, RollingDetector


def test_monitor_imports_without_heavy_dependencies():
    code = "import sys, hermes_kb.monitor; print(sorted(m for m in ('pandas', 'durable', 'numpy', 'jinja2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_records_steps_data_wait_gc_and_a_fluctuation(tmp_path):
    def slow_loader():
        for i in range(40):
            time.sleep(0.004)  # 4 ms blocked in next() per batch
            yield i

    # flops=False: with torch imported (another test), the FLOP count would take the step after the
    # warm-up, which may be the spike's
    with Monitor(tmp_path, rank=3, samples_per_step=32, sample_every=10, flops=False) as mon:
        for i in mon.wrap(slow_loader()):
            time.sleep(0.12 if i == 30 else 0.01)  # 10 ms steps, one 120 ms spike
            if i == 10:
                gc.collect()
            mon.step()
    lines = [json.loads(x) for x in (tmp_path / "rank3.jsonl").read_text().splitlines()]
    env, steps, end = lines[0], lines[1:-1], lines[-1]
    assert env["type"] == "environment" and env["rank"] == 3 and "gc_thresholds" in env and "python" in env["versions"]
    assert [s["step"] for s in steps] == list(range(40)) and end["steps"] == 40
    assert all(0.0035 <= s["data_wait_s"] <= s["wall_s"] for s in steps)
    assert steps[10]["gc_count"] >= 1 and steps[10]["gc_pause_s"] > 0
    # the spike is flagged (how many other steps scheduling noise flags on a shared machine is not
    # asserted here: the detector's false-positive behaviour is tested deterministically below)
    assert steps[30]["fluctuation"]
    # the line holds 6 significant digits
    assert steps[5]["samples_per_s"] == pytest.approx(32 / steps[5]["wall_s"], rel=1e-5)
    assert "rss_bytes" in steps[10] and "process_cpu_cores" in steps[10] and "rss_bytes" not in steps[11]


def test_data_wait_cpu_time_tells_in_process_loading_from_waiting():
    # a loader that computes its batch in the process (busy 6 ms) against one that blocks (sleeps
    # 6 ms, as on a worker queue): the same data wait, CPU time only in the first. The monitor reads
    # the process's CPU clock, which also counts other threads: the loaders run in a new interpreter,
    # since threads an earlier test started (Dask's) stay in this one and would tick that clock.
    import tempfile

    from conftest import in_fresh_process

    got = json.loads(in_fresh_process("""
        import json, tempfile, time
        from pathlib import Path
        from hermes_kb.monitor import Monitor

        def busy():
            for i in range(12):
                t, w = time.thread_time(), time.perf_counter()
                # this thread's CPU and the wall clock both 6 ms on, however the machine shares its cores
                while time.thread_time() - t < 0.006 or time.perf_counter() - w < 0.006:
                    pass
                yield i

        def blocked():
            for i in range(12):
                time.sleep(0.006)
                yield i

        got = {}
        for name, loader in (("busy", busy), ("blocked", blocked)):
            with tempfile.TemporaryDirectory() as d:
                with Monitor(d, rank=0, flops=False) as mon:
                    for _ in mon.wrap(loader()):
                        mon.step()
                got[name] = [json.loads(x) for x in (Path(d) / "rank0.jsonl").read_text().splitlines()][1:-1]
        print(json.dumps(got))
    """))
    assert len(got["busy"]) >= 10 and len(got["blocked"]) >= 10
    assert all(s["data_wait_cpu_s"] >= 0.006 and s["data_wait_s"] >= 0.006 for s in got["busy"])
    assert all(s["data_wait_cpu_s"] < 0.002 and s["data_wait_s"] >= 0.006 for s in got["blocked"])
    # a step without wrap() records no data-wait CPU at all (unknown, not zero)
    with tempfile.TemporaryDirectory() as d:
        with Monitor(d, rank=0, flops=False) as mon:
            mon.add_data_wait(0.001)
            mon.step()
        (step,) = [json.loads(x) for x in (Path(d) / "rank0.jsonl").read_text().splitlines()][1:-1]
    assert "data_wait_cpu_s" not in step and step["data_wait_s"] == pytest.approx(0.001)


def test_detector_is_robust_and_bounded():
    d = RollingDetector(window=16, k=5.0)
    flags = [d.update(0.010 + 0.0001 * (i % 3))[0] for i in range(100_000)]
    assert not any(flags) and len(d.times) == 16
    assert d.update(0.030)[0]


def test_monitor_status_cli(tmp_path):
    with Monitor(tmp_path, rank=0) as mon:
        for _ in range(12):
            mon.step()
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "monitor", "status", str(tmp_path), "-f", "json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    assert rows[0]["steps"] == 12 and rows[0]["last_step"] == 11 and rows[0]["finished"]
    missing = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "monitor", "status", str(tmp_path / "nope")],
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 3 and "no such directory" in missing.stderr


class FakeProfiler:
    """Stands in for torch.profiler.profile (torch is not a test dependency)."""

    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("start")
        return self

    def step(self):
        self.log.append("step")

    def __exit__(self, *a):
        self.log.append("stop")

    def export_chrome_trace(self, path):
        with open(path, "w") as fh:
            json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5,
                                        "pid": 1, "tid": 1}]}, fh)  # fmt: skip


def test_capture_on_request_without_restart(tmp_path):
    from hermes_kb.monitor.capture import write_request

    calls: list[str] = []
    with Monitor(tmp_path, rank=1, poll_s=0.01, profiler_factory=lambda: FakeProfiler(calls)) as mon:
        for _ in range(3):
            mon.step()
        req = write_request(tmp_path, steps=2)
        time.sleep(0.1)  # the watcher thread notices the request
        for _ in range(5):
            mon.step()
    # started at the boundary after step 3, one profiler step mark per captured step (4 and 5),
    # stopped after 2 steps, trace written next to the log
    assert calls == ["start", "step", "step", "stop"]
    trace = tmp_path / f"rank1.capture{req['id']}.json.gz"
    assert trace.is_file()
    import hermes_kb

    assert len(next(iter(hermes_kb.load(trace))).cpu_ops) == 1  # a trace hermes reads
    lines = [json.loads(x) for x in (tmp_path / "rank1.jsonl").read_text().splitlines()]
    caps = [x for x in lines if x["type"] == "capture"]
    assert len(caps) == 1 and caps[0]["trace"] == str(trace) and caps[0]["step"] == 5


def test_auto_capture_planned_on_recurring_slow_steps_within_budget(tmp_path, monkeypatch):
    # a fixed 10-step warm-up, then 60 ms spikes at steps 20, 40, 60 and 80 among 10 ms steps: the third
    # (step 60) shows the period, and the capture covers steps 79-81, around the next one (issue 22: a
    # capture right after a slow step never holds one). The recorder's clock is stepped by the test,
    # so that a loaded machine stretching real sleeps cannot add spikes of its own.
    from hermes_kb.monitor import recorder
    from test_monitor_triggers import _SteppedClock

    clock = _SteppedClock()
    monkeypatch.setattr(recorder, "time", clock)
    calls: list[str] = []
    with Monitor(tmp_path, rank=0, warmup=10, captures_per_hour=1, poll_s=5,
                 profiler_factory=lambda: FakeProfiler(calls)) as mon:  # fmt: skip
        for i in range(90):
            clock.t += 0.06 if i in (20, 40, 60, 80) else 0.01
            mon.step()
    lines = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    caps = [x for x in lines if x["type"] == "capture"]
    assert steps[20]["fluctuation"] and steps[40]["fluctuation"] and steps[60]["fluctuation"]
    assert not steps[80]["fluctuation"]  # profiled: the monitor does not judge the steps it slows itself
    (cap,) = caps  # the budget (1 per hour) allows one
    assert cap["reason"].startswith("slow step 60: ") and "recur every 20 steps" in cap["reason"]
    assert (cap["first_step"], cap["step"], cap["kind"]) == (79, 81, "slow_step")
    assert calls == ["start", "step", "step", "step", "stop"]
    notes = [json.loads(x) for x in (tmp_path / "rank0.monitor.jsonl").read_text().splitlines()]
    (held,) = [x for x in notes if x["type"] == "captured"]
    assert held["slowest_step"] == 80 and held["caught"] is True


def test_capture_without_torch_is_reported_not_raised(tmp_path):
    from hermes_kb.monitor.capture import write_request

    def broken():
        raise ModuleNotFoundError("No module named 'torch'")

    with Monitor(tmp_path, rank=0, poll_s=0.01, profiler_factory=broken) as mon:
        mon.step()
        write_request(tmp_path, steps=1)
        time.sleep(0.1)
        mon.step()
        mon.step()
    lines = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert any(x["type"] == "capture" and "torch" in x.get("error", "") for x in lines)


def test_real_torch_capture(tmp_path):
    import pytest

    torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install 'hermes-kb[torch]')")
    from hermes_kb.monitor.capture import write_request

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(tmp_path, rank=0, poll_s=0.01) as mon:
        for i in range(8):
            if i == 2:
                write_request(tmp_path, steps=2)
                time.sleep(0.1)
            loss = model(torch.randn(32, 64)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step()
    import hermes_kb

    (trace,) = tmp_path.glob("rank0.capture*.json.gz")
    t = next(iter(hermes_kb.load(trace)))
    assert len(t.cpu_ops) > 0
