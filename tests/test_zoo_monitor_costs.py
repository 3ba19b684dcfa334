"""The monitor-measured costs on the recorded scenario zoo (benchmarks/scenarios/recorded): page
faults (C-MON-012), the oversubscribed main thread's barrier sleeps (C-MON-008's high end), and
periodic checkpoint steps (C-CPU-019's high end). Numbers from the 2026-11-24 recordings; the
hand-made versions of each formula are in test_monitor_advise.py and test_analyzer_io.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analysis.run_dir import analyze_run_dir

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "recorded"


def fact(run: Path, kind: str):
    return next(f for f in analyze_run_dir(run).facts if f.kind == kind and f.step is None)


def test_for_loop_adamw_faults_its_temporaries_in_every_step_and_the_fused_twin_does_not():
    bad = fact(ZOO / "optimizer_for_loop" / "bad", "monitor_page_faults")
    # two 20k x 64 tables and their AdamW states: ~29 MB mapped and zeroed again per step, at ~1 us a fault
    assert bad.faults_per_step > 5000 and bad.sys_us_per_fault < 2.0 and bad.sys_ratio > 0.3
    assert bad.optimizer_faults_per_step > 0.5 * bad.faults_per_step  # most of them inside step()
    fixed = fact(ZOO / "optimizer_for_loop" / "fixed", "monitor_page_faults")
    assert fixed.faults_per_step < 10 and fixed.sys_ratio < 0.05
    found = {f.case_id: f for f in hermes_kb.advise(ZOO / "optimizer_for_loop" / "bad").findings}
    s = found["C-MON-012"].expected_speedup
    t, r = bad.mean_step_us, bad.sys_us
    assert s.model_low == pytest.approx(t / (t - 0.5 * r), abs=1e-3) and s.model_high == pytest.approx(t / (t - r), abs=1e-3)
    assert "C-MON-012" not in {f.case_id for f in hermes_kb.advise(ZOO / "optimizer_for_loop" / "fixed").findings}


def test_oversubscribed_main_thread_sleeps_at_barriers():
    c = fact(ZOO / "thread_oversubscription" / "bad", "monitor_cpu")
    # 8 torch threads + 2 workers on 2 cores: the main thread is on a CPU about a quarter of the time
    assert c.main_run_ratio < 0.4 and c.main_sleep_us > 5000
    assert c.own_stall_us == pytest.approx(c.wait_from_own_us + c.main_sleep_us * c.wait_from_own_us / c.runqueue_wait_us)
    (f,) = [x for x in hermes_kb.advise(ZOO / "thread_oversubscription" / "bad").findings if x.case_id == "C-MON-008"]
    t = c.mean_step_us
    assert f.expected_speedup.model_low == pytest.approx(t / (t - 0.5 * c.wait_from_own_us), abs=1e-3)
    assert f.expected_speedup.model_high == pytest.approx(t / (t - c.own_stall_us), abs=1e-3)
    fixed = fact(ZOO / "thread_oversubscription" / "fixed", "monitor_cpu")  # 1 thread: nothing to add
    assert fixed.own_stall_us == pytest.approx(fixed.wait_from_own_us)


def test_checkpoint_steps_add_more_than_their_io_frames():
    u = fact(ZOO / "checkpoint_stalls" / "bad", "untraced_host_time")
    # torch.save + fsync in 3 of the 6 profiled steps
    assert u.io_steps_count == 3 and u.io_step_excess_us > u.python_io_us > 0
    assert u.blocking_io_us == u.io_step_excess_us
    (f,) = [x for x in hermes_kb.advise(ZOO / "checkpoint_stalls" / "bad").findings if x.case_id == "C-CPU-019"]
    # a CPU-only trace: the replay of the graph with the host gaps shortened removes exactly what
    # the fix takes off the measured time (the low end: the I/O frames, the high end: the excess),
    # reported per step (the fact and the replay span the n analysed steps)
    steps = [x for x in analyze_run_dir(ZOO / "checkpoint_stalls" / "bad").facts if x.kind == "step_time" and x.rank == u.rank]
    n = len(steps)
    assert n > 1
    assert f.replayed and f.removable_us.model_low == pytest.approx(0.7 * u.python_io_us / n, rel=1e-3)
    assert f.removable_us.model_high == pytest.approx(0.95 * u.blocking_io_us / n, rel=1e-3)
    t = f.step_time_us
    assert t == pytest.approx(sum(x.duration_us for x in steps) / n, rel=1e-3)
    assert f.expected_speedup.model_high == pytest.approx(t / (t - 0.95 * u.blocking_io_us / n), abs=1e-3)
    assert fact(ZOO / "checkpoint_stalls" / "fixed", "untraced_host_time").io_steps_count == 0
