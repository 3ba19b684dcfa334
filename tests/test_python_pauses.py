"""Irregular pauses of ordinary Python code (analyzers/io/untraced.py, C-CPU-028): garbage collection
seen without GC events, told apart from regular I/O and regular Python work."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import hermes_kb
from conftest import X, write_trace

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "recorded"


def untraced(path):
    return next(f for f in hermes_kb.analyze(path) if f.kind == "untraced_host_time" and f.step is None)


def test_a_frame_far_above_its_median_is_a_pause(tmp_path):
    # 4 steps of 10 ms; parse() takes 1 ms in three steps and 6 ms in the last one, its extra 5 ms
    # a gap with no operator: a pause of 6 - 1 = 5 ms (the median of its calls is 1 ms)
    ev = []
    for i in range(4):
        t0 = i * 10_000
        d = 6_000 if i == 3 else 1_000
        ev += [X("user_annotation", f"ProfilerStep#{i}", t0, 10_000),
               X("python_function", "train.py(10): parse", t0, d),
               X("cpu_op", "aten::add", t0 + d, 2_000)]  # fmt: skip
    u = untraced(write_trace(tmp_path / "t.json", ev))
    assert u.irregular_pause_count == 1
    assert u.irregular_pause_us == pytest.approx(5_000.0)
    assert u.irregular_frames == ["train.py(10): parse"]


def test_io_frames_and_regular_work_are_not_pauses(tmp_path):
    ev = []
    for i in range(4):
        t0 = i * 10_000
        ev += [X("user_annotation", f"ProfilerStep#{i}", t0, 10_000),
               X("python_function", "<built-in method write of _io.BufferedWriter object at 0x1>", t0, 5_000 if i == 3 else 100),
               X("python_function", "train.py(20): work", t0 + 5_000, 3_000),
               X("cpu_op", "aten::add", t0 + 8_000, 1_000)]  # fmt: skip
    u = untraced(write_trace(tmp_path / "t.json", ev))
    assert u.irregular_pause_us == 0.0 and u.irregular_pause_count == 0


def _without_gc(src: Path, dst: Path) -> Path:
    d = json.load(gzip.open(src))
    gc = [e for e in d["traceEvents"] if e.get("name") == "Python GC"]
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("name") != "Python GC"]
    dst.write_text(json.dumps(d))
    return dst, gc


@pytest.mark.skipif(not ZOO.is_dir(), reason="scenario recordings absent")
def test_gc_pressure_without_gc_events_is_told_from_io(tmp_path):
    path, gc = _without_gc(ZOO / "gc_pressure/bad/rank0.capture-profile.json.gz", tmp_path / "gc.json")
    longest = max(e["dur"] for e in gc)  # 146.7 ms: the one full collection of the profile
    u = untraced(path)
    assert u.irregular_pause_us == pytest.approx(longest, rel=0.05)
    report = hermes_kb.advise(path)
    assert report.findings[0].case_id == "C-CPU-028" and report.findings[0].cause == "gc_pauses"
    for sc in ("checkpoint_stalls", "sync_logging"):  # regular I/O every step or every other step
        p, _ = _without_gc(ZOO / sc / "bad/rank0.capture-profile.json.gz", tmp_path / f"{sc}.json")
        assert untraced(p).irregular_pause_us == 0.0
        assert "C-CPU-028" not in {f.case_id for f in hermes_kb.advise(p).findings}
