"""Monitor additions: other processes, marked events, lazily read device times, CPU time, GC
generations, the hand-formatted records, the log reader, and the framework callbacks."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest

from hermes_kb.monitor import Monitor
from hermes_kb.monitor.device import DeviceTimer
from hermes_kb.monitor.integrations import StepDriver
from hermes_kb.monitor.procs import ProcessSampler, descendants, read_procs
from hermes_kb.monitor.reader import read_rank_log, read_run


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _stat(proc: Path, pid: int, name: str, ppid: int, ticks: int, threads: int = 1, start: int = 100) -> None:
    # /proc/<pid>/stat: pid (comm) state ppid ... utime(14) stime(15) ... num_threads(20) ... starttime(22)
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 4 + [str(threads), "0", str(start)] + ["0"] * 5
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(rest)}\n")


def test_process_sampler_cores_and_relations(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # non-numeric entries are ignored
    # me=10 (parent 1), my worker 11 and its child 12, a sibling rank 20 (same parent, same name),
    # a stress process 30, a process 40 that will be replaced by another with the same pid
    first = {10: ("python", 1, 100), 11: ("pt_data_worker", 10, 0), 12: ("helper", 11, 0),
             20: ("python", 1, 500), 30: ("stress", 1, 1000), 40: ("old", 1, 900)}  # fmt: skip
    for pid, (name, ppid, ticks) in first.items():
        _stat(proc, pid, name, ppid, ticks, threads=4 if pid == 10 else 1)
    s = ProcessSampler(pid=10, proc=str(proc))
    s.hz = 100
    assert s.sample(now=0.0) is None  # nothing to diff against yet
    # 2 s later: worker +100 ticks (0.5 core), helper +20, sibling +200 (1 core), stress +380 (1.9),
    # pid 40 reused by a new process that has run 30 ticks (all inside the interval: 0.15 core)
    later = {10: 300, 11: 100, 12: 20, 20: 700, 30: 1380}
    for pid, ticks in later.items():
        name, ppid, _ = first[pid]
        _stat(proc, pid, name, ppid, ticks, threads=4 if pid == 10 else 1)
    _stat(proc, 40, "new", 1, 30, start=5000)
    out = s.sample(now=2.0)
    assert out["children_cores"] == pytest.approx(0.6)  # (100 + 20) / 100 / 2
    assert out["siblings_cores"] == pytest.approx(1.0)
    assert out["others_cores"] == pytest.approx(1.9 + 0.15)
    assert out["children_count"] == 2 and out["threads_count"] == 4 + 1 + 1
    assert [(p["pid"], p["rel"], p["cores"]) for p in out["top_procs"]] == [(30, "other", 1.9), (20, "sibling", 1.0),
                                                                           (40, "other", 0.15)]  # fmt: skip
    assert descendants(read_procs(str(proc)), 10) == {11, 12}


def test_process_sampler_without_proc(tmp_path):
    s = ProcessSampler(proc=str(tmp_path / "absent"))
    assert s.sample(0.0) is None and s.sample(1.0) is None


def test_events_land_in_the_step_that_holds_them(tmp_path):
    with Monitor(tmp_path, rank=0, capture=False) as mon:
        mon.step()
        with mon.event("checkpoint"):
            time.sleep(0.05)
        mon.mark("eval", 0.25)
        mon.mark("eval", 0.5)
        mon.step()
        mon.step()
    steps = [x for x in _lines(tmp_path / "rank0.jsonl") if x["type"] == "step"]
    assert "events" not in steps[0] and "events" not in steps[2]
    ev = steps[1]["events"]
    assert 0.05 <= ev["checkpoint"] <= steps[1]["wall_s"] and ev["eval"] == 0.75


class FakeEvent:
    """Stands in for torch.cuda.Event: the 'device' reaches an event when the test says so."""

    clock = 0.0
    done_until = -1.0
    created = 0

    def __init__(self):
        FakeEvent.created += 1
        self.t = None

    def record(self):
        self.t = FakeEvent.clock

    def query(self):
        return self.t is not None and self.t <= FakeEvent.done_until

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # ms, as torch


def test_device_timer_reads_finished_events_lazily():
    FakeEvent.clock, FakeEvent.done_until, FakeEvent.created = 0.0, -1.0, 0
    dt = DeviceTimer(FakeEvent)
    dt.start()  # event at t=0
    got = []
    for step, t in enumerate([0.010, 0.030, 0.060]):  # boundaries: device steps of 10, 20, 30 ms
        FakeEvent.clock = t
        got.append(dt.boundary(step))
    assert got == [[], [], []]  # the device has not reached any event: nothing read, nothing waited for
    FakeEvent.done_until = 0.030
    FakeEvent.clock = 0.100
    done = dt.boundary(3)
    assert [s for s, _ in done] == [0, 1] and [round(v, 6) for _, v in done] == [0.010, 0.020]
    FakeEvent.done_until = 1.0
    done = dt.boundary(4)
    assert [(s, round(v, 6)) for s, v in done] == [(2, 0.030), (3, 0.040), (4, 0.0)]
    created = FakeEvent.created
    for step in range(5, 50):
        FakeEvent.clock += 0.01
        dt.boundary(step)
    assert FakeEvent.created - created <= 2  # events are reused from the pool


def test_device_timer_drops_what_the_device_never_reaches():
    FakeEvent.clock, FakeEvent.done_until = 0.0, -1.0
    dt = DeviceTimer(FakeEvent, max_pending=4)
    dt.start()
    for step in range(20):
        FakeEvent.clock += 0.01
        assert dt.boundary(step) == []
    assert len(dt._pending) == 4


def test_monitor_records_device_times_and_reader_maps_them(tmp_path):
    FakeEvent.clock, FakeEvent.done_until = 0.0, 10.0  # every event finishes at once
    with Monitor(tmp_path, rank=2, capture=False, device_events=FakeEvent) as mon:
        for i in range(5):
            FakeEvent.clock += 0.002 * (i + 1)
            mon.step()
    log = read_rank_log(tmp_path / "rank2.jsonl", 2)
    assert {s: round(v, 6) for s, v in log.device_s.items()} == {0: 0.002, 1: 0.004, 2: 0.006, 3: 0.008, 4: 0.010}


def test_cpu_time_gc_generation_and_records_are_valid_json(tmp_path):
    with Monitor(tmp_path, rank=0, capture=False, samples_per_step=8, flops_per_step=1e9, peak_flops=1e12) as mon:
        recs = []
        for i in range(6):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.02:  # 20 ms of CPU work
                pass
            if i == 3:
                gc.collect()  # a full (generation 2) collection
            recs.append(mon.step(tag=f"s{i}"))
    lines = [x for x in _lines(tmp_path / "rank0.jsonl") if x["type"] == "step"]
    # the hand-formatted line is the returned record, its times to 6 significant digits (the clock to the µs)
    assert [set(x) for x in lines] == [set(r) for r in recs]
    for line, rec in zip(lines, recs):
        for k, v in rec.items():
            assert line[k] == (pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v), k
    assert recs[3]["gc_gen2"] == 1 and "gc_gen2" not in recs[2]
    for r in recs[1:]:
        # a busy loop: CPU time close to wall time (a loaded machine can only lower it)
        assert 0.2 * r["wall_s"] <= r["cpu_s"] <= r["wall_s"] * 1.05 + 0.002
        assert r["mfu"] == pytest.approx(1e9 / r["wall_s"] / 1e12) and r["tag"] == f"s{recs.index(r)}"


def test_reader_skips_damaged_lines(tmp_path):
    with Monitor(tmp_path, rank=0, capture=False) as mon:
        for _ in range(4):
            mon.step()
    p = tmp_path / "rank0.jsonl"
    lines = p.read_text().splitlines()
    lines.insert(2, '{"type":"step","rank":0,"step"')  # cut by a crash
    lines.insert(3, "[1, 2]")  # valid JSON, not a record
    p.write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path)
    assert run.ranks[0].steps_count == 4 and run.ranks[0].bad_lines == 2
    assert run.warnings == [f"{p}: skipped 2 damaged line(s) (first at line 3): line 3: not a JSON object; "
                            "line 4: not a JSON object"]


def test_resource_sample_has_runqueue_and_processes(tmp_path):
    with Monitor(tmp_path, rank=0, capture=False, sample_every=2, procs_every_s=0.0001) as mon:
        for _ in range(5):
            time.sleep(0.01)
            mon.step()
    steps = [x for x in _lines(tmp_path / "rank0.jsonl") if x["type"] == "step"]
    sampled = [s for s in steps if "process_cpu_cores" in s]
    assert [s["step"] for s in sampled] == [0, 2, 4]
    if Path("/proc/self/schedstat").exists():
        assert all(0.0 <= s["runqueue_wait_ratio"] <= 1.0 for s in sampled)
        # the loop sleeps 10 ms a step: its main thread is on a CPU a small share of the time
        assert all(0.0 <= s["main_run_ratio"] <= 0.9 for s in sampled[1:])
    if Path("/proc").is_dir():
        assert all("top_procs" in s and s["threads_count"] >= 1 for s in sampled)


def test_step_driver_data_wait_excludes_marked_events(tmp_path):
    d = StepDriver(tmp_path, rank=0, capture=False)
    d.start()
    d.begin()
    d.end(samples=4)
    time.sleep(0.02)  # fetching the next batch
    d.event_start("checkpoint")
    time.sleep(0.05)  # saving
    d.begin()  # closes the open checkpoint event
    d.end(samples=4)
    d.close()
    steps = [x for x in _lines(tmp_path / "rank0.jsonl") if x["type"] == "step"]
    s = steps[1]
    assert 0.05 <= s["events"]["checkpoint"] < s["wall_s"]
    assert 0.02 <= s["data_wait_s"] < 0.05  # the save is not counted as data wait
    assert s["samples_per_s"] == pytest.approx(4 / s["wall_s"], rel=1e-5)  # the line holds 6 significant digits


def test_lightning_callback():
    pl = pytest.importorskip("lightning.pytorch", reason="lightning is an optional extra (hermes-kb[lightning])")
    from hermes_kb.monitor.integrations import lightning_callback

    assert isinstance(lightning_callback("unused"), pl.Callback)


def test_hf_callback():
    transformers = pytest.importorskip("transformers", reason="transformers is an optional extra (hermes-kb[hf])")
    from hermes_kb.monitor.integrations import hf_callback

    assert isinstance(hf_callback("unused"), transformers.TrainerCallback)


def test_integrations_import_no_framework():
    import subprocess
    import sys

    code = ("import sys, hermes_kb.monitor.integrations; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch', 'pandas') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _FakeOptimizerHooks:
    """Stands in for torch.optim.optimizer's global step hooks (the monitor never imports torch)."""

    def __init__(self) -> None:
        self.pre, self.post = [], []

    def _handle(self, lst, fn):
        lst.append(fn)
        return type("Handle", (), {"remove": lambda _self: lst.remove(fn)})()

    def register_optimizer_step_pre_hook(self, fn):
        return self._handle(self.pre, fn)

    def register_optimizer_step_post_hook(self, fn):
        return self._handle(self.post, fn)

    def step(self, work) -> None:  # what Optimizer.step does around its body
        for h in list(self.pre):
            h(None, (), {})
        work()
        for h in list(self.post):
            h(None, (), {})


def _touch_fresh_pages(n_pages: int) -> None:
    import mmap

    m = mmap.mmap(-1, n_pages * 4096)  # anonymous: every page faults on first write
    for i in range(n_pages):
        m[i * 4096] = 1
    m.close()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="minor faults are a Linux counter")
def test_page_faults_system_time_and_optimizer_share(tmp_path, monkeypatch):
    import sys

    fake = _FakeOptimizerHooks()
    monkeypatch.setitem(sys.modules, "torch.optim.optimizer", fake)
    with Monitor(tmp_path, rank=0, capture=False) as mon:
        assert len(fake.pre) == 1 and len(fake.post) == 1
        for i in range(4):
            _touch_fresh_pages(512)  # 2 MiB outside the optimizer: >= 512 faults
            if i != 2:  # step 2 accumulates gradients: no optimizer step
                fake.step(lambda: (_touch_fresh_pages(1024), time.sleep(0.005)))  # 4 MiB inside
            mon.step()
    assert fake.pre == [] and fake.post == []  # hooks removed on close
    recs = [x for x in _lines(tmp_path / "rank0.jsonl") if x["type"] == "step"]
    for i, r in enumerate(recs):
        assert r["sys_s"] >= 0.0 and r["sys_s"] <= r["cpu_s"] + 1e-6
        if i == 2:
            assert "optimizer_s" not in r and r["minflt"] >= 512
            continue
        assert r["minflt"] >= 1024 + 512 and r["optimizer_minflt"] >= 1024
        assert r["minflt"] - r["optimizer_minflt"] >= 512
        assert 0.005 <= r["optimizer_s"] <= r["wall_s"]
    log = read_run(tmp_path).ranks[0]
    assert log.minflt[0] == recs[0]["minflt"] and log.optimizer_s[0] == recs[0]["optimizer_s"]
    assert log.optimizer_s[2] != log.optimizer_s[2]  # NaN: no optimizer step recorded there


def test_reader_leaves_unrecorded_fault_fields_nan(tmp_path):
    p = tmp_path / "rank0.jsonl"
    p.write_text('{"type":"step","rank":0,"step":0,"wall_s":0.1,"cpu_s":0.1}\n')
    log = read_rank_log(p, 0)
    assert all(v != v for v in (log.sys_s[0], log.minflt[0], log.optimizer_s[0], log.optimizer_minflt[0]))
