"""npu_allocation: time in CANN device-memory allocation calls inside the steps, and the case
(C-CPU-025) that advises allocator settings only when that time is a meaningful share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hermes_kb
from conftest import SHARED, ascend_x
from hermes_kb.trace.ascend.build import runtime_kind_npu

ASCEND = SHARED / "ascend"
needs_ascend = pytest.mark.skipif(not ASCEND.is_dir(), reason="../shared/data/ascend is absent")


def _export(tmp: Path, cann: list[tuple[str, float, float]], alloc_conf: str = "") -> Path:
    """Two steps of 1000 µs (ProfilerStep#1 at 1000, #2 at 2000) and the given CANN calls."""
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "Python"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "CANN"}},
          ascend_x(1, "ProfilerStep#1", 1000, 1000, "cpu_op"), ascend_x(1, "ProfilerStep#2", 2000, 1000, "cpu_op"),
          ascend_x(1, "aten::add", 1010, 5, "cpu_op")]  # fmt: skip
    ev += [ascend_x(2, n, ts, d) for n, ts, d in cann]
    out = tmp / "rank0_ascend_pt"
    (out / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (out / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(ev))
    (out / "profiler_metadata.json").write_text(json.dumps({"ENV_VARIABLES": {"PYTORCH_NPU_ALLOC_CONF": alloc_conf}}))
    return out


@pytest.mark.parametrize("name,kind", [
    ("AscendCL@aclrtMalloc", "malloc"), ("AscendCL@aclrtMallocHost", "malloc"), ("AscendCL@aclMallocMemInner", "malloc"),
    ("AscendCL@aclrtMallocPhysical", "malloc"), ("AscendCL@aclrtReserveMemAddress", "malloc"),
    ("AscendCL@aclrtMapMem", "malloc"), ("AscendCL@aclrtFree", "free"), ("AscendCL@aclrtFreeHost", "free"),
    ("AscendCL@aclrtUnmapMem", "free"), ("AscendCL@aclrtReleaseMemAddress", "free"),
    ("AscendCL@aclrtMemcpy", "memcpy"), ("AscendCL@aclCreateTensorDesc", "other"),
])  # fmt: skip
def test_allocation_calls_are_recognised(name, kind):
    assert runtime_kind_npu(name) == kind


def test_allocation_time_by_hand_and_the_case_fires(tmp_path):
    root = _export(tmp_path, [
        ("AscendCL@aclrtMalloc", 500, 100),          # before the first step: not counted
        ("AscendCL@aclrtMalloc", 1100, 30),          # step 1
        ("AscendCL@aclrtFree", 1500, 10),
        ("Node@launch", 1600, 5),
        ("AscendCL@aclrtMallocHost", 2100, 20),      # step 2
        ("AscendCL@aclrtMapMem", 2200, 5),
        ("AscendCL@aclrtUnmapMem", 2300, 5),
    ])  # fmt: skip
    facts = hermes_kb.analyze(root)
    (a,) = [f for f in facts if f.kind == "npu_allocation"]
    # malloc 30 + 20 + 5 = 55 µs in 3 calls, free 10 + 5 = 15 µs in 2 calls, two 1000 µs steps
    assert (a.steps_count, a.window_us) == (2, 2000.0)
    assert (a.malloc_count, a.malloc_us, a.free_count, a.free_us) == (3, 55.0, 2, 15.0)
    assert (a.alloc_us, a.per_step_us) == (70.0, 35.0)
    assert a.alloc_ratio == pytest.approx(0.035)
    assert a.alloc_conf is None and not a.expandable_segments
    report = hermes_kb.advise(root)
    (f,) = [f for f in report.findings if f.case_id == "C-CPU-025"]
    assert "PYTORCH_NPU_ALLOC_CONF not set" in f.explanation
    # the gain never exceeds the time in the calls: at best 70 µs of the 2000 µs window leave,
    # speedup 2000 / (2000 - 70); at the low end half of it, 2000 / (2000 - 35)
    assert f.share_of_step_ratio == pytest.approx(0.035)
    assert f.expected_speedup.model_high == pytest.approx(2000 / 1930, abs=1e-3)
    assert f.expected_speedup.model_low == pytest.approx(2000 / 1965, abs=1e-3)


def test_small_allocation_time_stays_silent(tmp_path):
    # 30 µs of 2000 µs = 1.5%: below R-NPU-008's 2%, so no advice on the allocator
    root = _export(tmp_path, [("AscendCL@aclrtMalloc", 1100, 30)], alloc_conf="expandable_segments:True")
    facts = hermes_kb.analyze(root)
    (a,) = [f for f in facts if f.kind == "npu_allocation"]
    assert a.alloc_ratio == pytest.approx(0.015) and a.expandable_segments
    assert a.alloc_conf == "expandable_segments:True"
    assert not [f for f in hermes_kb.advise(root).findings if f.case_id == "C-CPU-025"]


@needs_ascend
@pytest.mark.parametrize("path,alloc_us", [
    ("msinsight_pt_text_level1_2rank", 0.0),                               # no allocation call in the step
    ("msprof_analyze_ut/test/ut/advisor/timeline_advice", 72.83),          # one aclMallocMemInner
])  # fmt: skip
def test_real_exports_show_negligible_allocation_time(path, alloc_us):
    facts = hermes_kb.analyze(ASCEND / path)
    allocs = [f for f in facts if f.kind == "npu_allocation"]
    assert allocs and all(f.alloc_us == pytest.approx(alloc_us, abs=0.01) for f in allocs)
    assert all(f.alloc_ratio < 0.01 for f in allocs)
    assert not [f for f in hermes_kb.advise(ASCEND / path).findings if f.case_id == "C-CPU-025"]


@needs_ascend
def test_level0_has_no_cann_layer_and_no_allocation_fact():
    facts = hermes_kb.analyze(ASCEND / "msinsight_pt_text_level0_2rank")
    assert not [f for f in facts if f.kind == "npu_allocation"]
