"""The overlap analyzer: multi-component step breakdown and HTA 0.5.0's definitions.

Hand-made traces with every expected value worked out below, a cross-check against numbers
HolisticTraceAnalysis 0.5.0 computed itself (tests/data/hta_reference.json), and a run over
every real Kineto trace in ../shared/data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hermes_kb
from hermes_kb.analyzers import intervals as iv
from hermes_kb.analyzers.timeline import device_events as E
from hermes_kb.analyzers.timeline import hta as H
from hermes_kb.analyzers.timeline import overlap as A
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import SHARED, X, kineto_traces, needs_shared, write_trace
from hermes_kb.facts.steps import AnalyzerError

REFERENCE = Path(__file__).parent / "data" / "hta_reference.json"
PARTS = ("compute_only_us", "comm_only_us", "host_only_us", "compute_comm_overlap_us", "compute_host_overlap_us", "free_us")  # fmt: skip


def run(path):
    bundle = hermes_kb.load(path)
    out = {}
    for trace in bundle:
        ctx, _ = step_context(trace)
        out[trace.rank] = (ctx, A.per_rank(ctx))
    return out


def by_kind(facts, kind):
    return [f for f in facts if f.kind == kind]


def K(name, ts, dur, stream, corr, cat="kernel"):
    return X(cat, name, ts, dur, pid=0, tid=stream, args={"device": 0, "stream": stream, "correlation": corr})


def R(name, ts, dur, corr, tid=1):
    return X("cuda_runtime", name, ts, dur, tid=tid, args={"correlation": corr})


NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"

# Two ProfilerSteps. Step 1 = [0, 100), step 2 = [100, 200).
TRACE_A = [
    X("user_annotation", "ProfilerStep#1", 0, 100),
    X("user_annotation", "ProfilerStep#2", 100, 100),
    X("cpu_op", "aten::mm", 0, 30),  # host [0, 30)
    R("cudaLaunchKernel", 10, 2, 1),
    R("cudaLaunchKernel", 12, 2, 5),
    R("cudaLaunchKernel", 16, 2, 2),
    X("cpu_op", "aten::item", 60, 20),  # host [60, 80) ...
    R("cudaMemcpyAsync", 62, 2, 3),
    R("cudaStreamSynchronize", 65, 15, 6),  # ... minus the blocked [65, 80)
    K("volta_sgemm_128x64_nn", 20, 30, 7, 1),  # compute [20, 50)
    K(NCCL, 40, 30, 8, 2),  # communication [40, 70)
    K("Memcpy DtoH (Device -> Pageable)", 70, 5, 7, 3, cat="gpu_memcpy"),  # memory [70, 75)
    K("elementwise_kernel", 80, 10, 7, 5),  # compute [80, 90)
    X("cpu_op", "aten::relu", 100, 10),  # host [100, 110)
    R("cudaLaunchKernel", 105, 2, 4),
    K("elementwise_kernel", 120, 30, 7, 4),  # compute [120, 150), launched in step 2
]


def test_partition_by_hand(tmp_path):
    ctx, facts = run(write_trace(tmp_path / "a.json", TRACE_A))[0]
    steps = {f.step: f for f in by_kind(facts, "step_overlap")}
    assert set(steps) == {1, 2, None}
    s1 = steps[1]
    # C = [20,50) ∪ [70,75) ∪ [80,90); M = [40,70); H = [0,30) ∪ [60,65)
    # [0,20) H only 20 | [20,30) C+H 10 | [30,40) C 10 | [40,50) C+M 10 | [50,60) M 10
    # [60,65) M+H 5 (counts as communication only) | [65,70) M 5 | [70,75) C 5 | [75,80) free 5
    # [80,90) C 10 | [90,100) free 10
    assert (s1.start_us, s1.end_us, s1.duration_us) == (0.0, 100.0, 100.0)
    assert s1.compute_only_us == pytest.approx(10 + 5 + 10)
    assert s1.comm_only_us == pytest.approx(10 + 5 + 5)
    assert s1.host_only_us == pytest.approx(20)
    assert s1.compute_comm_overlap_us == pytest.approx(10)
    assert s1.compute_host_overlap_us == pytest.approx(10)
    assert s1.free_us == pytest.approx(5 + 10)
    assert sum(getattr(s1, p) for p in PARTS) == pytest.approx(100.0, abs=1e-9)
    assert s1.free_ratio == pytest.approx(0.15)
    # the sets: |C| = 30+5+10, |M| = 30, |H| = 30+5, memcpy 5, |C ∪ M| = [20,75) ∪ [80,90) = 65
    assert (s1.compute_us, s1.comm_us, s1.host_us, s1.memory_us, s1.device_busy_us) == pytest.approx((45, 30, 35, 5, 65))
    # overlap = |C ∩ (M ∪ H)| = 10 + 10; |M ∪ H| = [0,30) ∪ [40,70) = 60
    assert s1.overlap_us == pytest.approx(20)
    assert s1.overlap_ratio == pytest.approx(20 / 60)
    assert s1.comm_hidden_ratio == pytest.approx(10 / 30)
    # HTA temporal breakdown on the window: GPU busy 65, HTA compute = the two kernels = 40,
    # non-compute = nccl-only + memcpy = 25, idle = 100 - 65
    assert (s1.gpu_idle_us, s1.gpu_compute_us, s1.gpu_non_compute_us) == pytest.approx((35, 40, 25))
    assert s1.gpu_idle_ratio == pytest.approx(0.35)

    s2 = steps[2]
    # [100,110) host only, [110,120) free, [120,150) compute only, [150,200) free
    assert (s2.host_only_us, s2.compute_only_us, s2.free_us) == pytest.approx((10, 30, 60))
    assert s2.comm_hidden_ratio is None  # no communication in step 2
    assert s2.overlap_ratio == pytest.approx(0.0)  # host work never under device compute

    agg = steps[None]
    assert agg.duration_us == pytest.approx(200)
    assert agg.compute_only_us == pytest.approx(25 + 30)
    assert agg.free_us == pytest.approx(15 + 60)
    assert agg.overlap_ratio == pytest.approx(20 / (60 + 10))
    assert NCCL in agg.evidence.events

    # sets handed to later analyzers
    assert iv.length(ctx.shared["device_busy"][1]) == pytest.approx(65)
    assert iv.length(ctx.shared["host_busy"][1]) == pytest.approx(35)
    assert iv.length(ctx.shared["device_comm"][1]) == pytest.approx(30)
    assert iv.length(ctx.shared["device_compute"][2]) == pytest.approx(30)
    assert ctx.shared["overlap_components"][1]["free_us"] == pytest.approx(15)


def test_hta_definitions_by_hand(tmp_path):
    _, facts = run(write_trace(tmp_path / "a.json", TRACE_A))[0]
    # two ProfilerStep names: HTA keeps what was launched before ProfilerStep#2 starts (100):
    # correlations 1, 2, 3, 5; the kernel launched at 105 (running [120,150)) is dropped.
    (t,) = by_kind(facts, "hta_temporal_breakdown")
    assert t.last_step_filter and t.last_step_start_us == 100.0 and t.events_count == 4
    # interval [20, 90): 70; busy [20,75) ∪ [80,90) = 65; compute 30 + 10; non-compute 65 - 40
    assert (t.interval_start_us, t.interval_end_us, t.kernel_time_us) == (20.0, 90.0, 70.0)
    assert (t.idle_us, t.compute_us, t.non_compute_us) == pytest.approx((5, 40, 25))
    assert (t.idle_ratio, t.compute_ratio, t.non_compute_ratio) == pytest.approx((5 / 70, 40 / 70, 25 / 70))
    (o,) = by_kind(facts, "hta_comm_comp_overlap")
    # comm [40,70) = 30; compute [20,50) ∪ [80,90); both at once [40,50) = 10
    assert (o.comm_us, o.compute_us, o.overlap_us, o.overlap_ratio) == pytest.approx((30, 40, 10, 1 / 3))
    idle = {f.stream: f for f in by_kind(facts, "hta_idle_breakdown")}
    # stream 7 in start order: [20,50) launched 10; memcpy [70,75) launched 62 > 50: host_wait 20;
    # [80,90) launched 12 < 75, gap 5 < 30: kernel_wait 5
    s7 = idle[7]
    assert (s7.host_wait_us, s7.kernel_wait_us, s7.other_us, s7.idle_us) == pytest.approx((20, 5, 0, 25))
    assert (s7.host_wait_ratio, s7.kernel_wait_ratio, s7.other_ratio) == pytest.approx((0.8, 0.2, 0.0))
    assert (s7.host_wait_count, s7.kernel_wait_count, s7.other_count, s7.events_count) == (1, 1, 0, 3)
    # stream 8 has one event: no gap, ratios undefined (HTA: NaN)
    assert idle[8].idle_us == 0 and idle[8].host_wait_ratio is None


# No ProfilerStep: HTA keeps every event. One stream, launches at 0, 2, 4, 90, 6.
TRACE_B = [
    R("cudaLaunchKernel", 0, 1, 1),
    R("cudaLaunchKernel", 2, 1, 2),
    R("cudaLaunchKernel", 4, 1, 3),
    R("cudaLaunchKernel", 6, 1, 5),
    R("cudaLaunchKernel", 90, 1, 4),
    K("k1", 10, 10, 7, 1),  # [10,20)
    K("k2", 25, 5, 7, 2),  # [25,30): gap 5, launched before 20 -> kernel_wait 5
    K("k3", 70, 10, 7, 3),  # [70,80): gap 40 >= 30 -> other 40
    K("k4", 100, 10, 7, 4),  # [100,110): launched at 90 > 80 -> host_wait 20
    K("k5", 108, 12, 7, 5),  # [108,120): gap -2 (overlaps k4), launched early -> kernel_wait -2
    K("Context Sync", 130, 10, 7, 6, cat="cuda_sync"),  # [130,140): HTA OTHER, not in the idle breakdown
]


def test_idle_breakdown_threshold_and_unit(tmp_path):
    _, facts = run(write_trace(tmp_path / "b.json", TRACE_B))[0]
    (s,) = by_kind(facts, "hta_idle_breakdown")
    assert s.threshold_us == 30.0
    assert (s.host_wait_us, s.kernel_wait_us, s.other_us, s.idle_us) == pytest.approx((20, 3, 40, 63))
    assert (s.host_wait_count, s.kernel_wait_count, s.other_count, s.events_count) == (1, 2, 1, 5)
    trace = hermes_kb.load(tmp_path / "b.json")[0]
    ev = E.device_events(trace)
    # threshold 50 µs: the 40 µs gap becomes kernel_wait
    row = H.hta_idle_breakdown(ev, 50.0).iloc[0]
    assert (row.host_wait, row.kernel_wait, row.other) == pytest.approx((20, 43, 0))
    # HTA's documented "30 ns" taken literally (0.03 µs): only the negative gap is kernel_wait
    row = H.hta_idle_breakdown(ev, 0.03).iloc[0]
    assert (row.host_wait, row.kernel_wait, row.other) == pytest.approx((20, -2, 45))
    # temporal: interval [10,140) = 130; busy 10+5+10+20+10 = 55; compute = the kernels 45;
    # the Context Sync is busy but not compute
    (t,) = by_kind(facts, "hta_temporal_breakdown")
    assert not t.last_step_filter
    assert (t.kernel_time_us, t.idle_us, t.compute_us, t.non_compute_us) == pytest.approx((130, 75, 45, 10))
    assert not by_kind(facts, "hta_comm_comp_overlap")  # no communication: HTA gives NaN


def test_hta_kernel_types():
    import pandas as pd

    names = pd.Series(
        ["ncclKernel_AllReduce_RING_LL_Sum_float(x)", "ncclDevKernel_Generic(x)", "void ncclKernel_x",
         "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "dma_copy", "Stream Wait Event", "Context Sync",
         "my_Memcpy_kernel", "volta_sgemm", "Event Sync"],
        dtype="category",
    )  # fmt: skip
    c, m, mem, o = E.COMPUTATION, E.COMMUNICATION, E.MEMORY, E.OTHER
    # HTA quirks: "void nccl..." is compute (anchored match), "Stream Wait Event" is compute,
    # a name containing Memcpy not at the start is OTHER
    assert E.hta_kernel_type(names).tolist() == [m, m, c, mem, mem, mem, c, o, o, c, o]


def test_cpu_only_trace(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::add", 10, 20),  # host [10,30)
        X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 40, 20),  # host [40,60)
        X("user_annotation", "gloo:all_reduce", 50, 30, tid=9),  # host-side communication [50,80)
    ]
    _, facts = run(write_trace(tmp_path / "c.json", ev))[0]
    assert {f.kind for f in facts} == {"step_overlap"}
    f = [x for x in facts if x.step == 1][0]
    # H = [10,30) ∪ [40,60); M = [50,80) (gloo); C = {}
    # [0,10) free | [10,30) H | [30,40) free | [40,50) H | [50,60) M+H -> comm only | [60,80) M | [80,100) free
    assert (f.host_only_us, f.comm_only_us, f.free_us, f.compute_only_us) == pytest.approx((30, 30, 40, 0))
    assert f.overlap_ratio is None and f.comm_hidden_ratio is None  # no device at all
    assert f.gpu_idle_us is None and f.gpu_idle_ratio is None


def test_gpu_only_trace(tmp_path):
    ev = [K("k1", 0, 10, 7, -1), K("k2", 30, 10, 7, -1)]
    _, facts = run(write_trace(tmp_path / "g.json", ev))[0]
    agg = [f for f in facts if f.kind == "step_overlap" and f.step is None][0]
    # whole trace [0,40): compute 20, free 20, no host at all
    assert (agg.compute_only_us, agg.free_us, agg.host_us) == pytest.approx((20, 20, 0))
    assert agg.overlap_ratio is None  # no communication and no host work to hide
    (t,) = by_kind(facts, "hta_temporal_breakdown")
    assert (t.idle_us, t.compute_us) == pytest.approx((20, 20))


def test_partition_matches_a_grid():
    rng = np.random.default_rng(3)
    for _ in range(20):
        sets = []
        grid = np.zeros((3, 200), dtype=bool)
        for j in range(3):
            s = rng.integers(0, 200, 15)
            e = s + rng.integers(1, 30, 15)
            a = iv.union(s, np.minimum(e, 200))
            sets.append(a)
            for lo, hi in zip(*a):
                grid[j, int(lo) : int(hi)] = True
        got = A.partition(sets, 0.0, 200.0)
        code = grid[0] * 1 + grid[1] * 2 + grid[2] * 4
        assert got.tolist() == np.bincount(code, minlength=8).astype(float).tolist()


# ------------------------------------------------------------------ against HTA 0.5.0 itself


def _reference_cases():
    if not REFERENCE.exists():
        return []
    ref = json.loads(REFERENCE.read_text())
    return sorted(k for k in ref if k.startswith("hta/"))


@needs_shared()
@pytest.mark.parametrize("key", _reference_cases())
def test_matches_hta_reference(key):
    ref = json.loads(REFERENCE.read_text())[key]
    # hermes keeps fractional timestamps as they are: compare with HTA run without its ns rounding
    ref = ref.get("ns_rounding_disabled", ref)
    results = run(SHARED / key)
    checked = 0
    for row in ref["temporal_breakdown"]:
        _, facts = results[row["rank"]]
        (t,) = by_kind(facts, "hta_temporal_breakdown")
        assert 100 * t.idle_ratio == pytest.approx(row["idle_time_pctg"], abs=1.0)
        assert 100 * t.compute_ratio == pytest.approx(row["compute_time_pctg"], abs=1.0)
        assert 100 * t.non_compute_ratio == pytest.approx(row["non_compute_time_pctg"], abs=1.0)
        assert t.kernel_time_us == pytest.approx(row["kernel_time(us)"], rel=0.01)
        checked += 1
    for row in ref["comm_comp_overlap"]:
        _, facts = results[row["rank"]]
        got = by_kind(facts, "hta_comm_comp_overlap")
        if row["comp_comm_overlap_pctg"] is None:
            assert not got
        else:
            assert 100 * got[0].overlap_ratio == pytest.approx(row["comp_comm_overlap_pctg"], abs=1.0)
        checked += 1
    totals: dict = {}
    for row in ref["idle_time_breakdown"]:
        totals[(row["rank"], row["stream"])] = totals.get((row["rank"], row["stream"]), 0.0) + row["idle_time"]
    for row in ref["idle_time_breakdown"]:
        _, facts = results[row["rank"]]
        mine = {f.stream: f for f in by_kind(facts, "hta_idle_breakdown")}
        f = mine[row["stream"]]
        cat = row["idle_category"]
        total = totals[(row["rank"], row["stream"])]
        if row["idle_time_ratio"] is None:
            assert getattr(f, f"{cat}_ratio") is None
        else:
            assert getattr(f, f"{cat}_ratio") == pytest.approx(row["idle_time"] / total, abs=0.01)
            assert getattr(f, f"{cat}_ratio") == pytest.approx(row["idle_time_ratio"], abs=0.01 + 0.005)
        # the µs themselves, within 1% of the stream's idle time
        assert getattr(f, f"{cat}_us") == pytest.approx(row["idle_time"], abs=max(0.01 * total, 1.0))
        checked += 1
    assert checked


# ------------------------------------------------------------------ every real trace


@needs_shared()
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: str(p.relative_to(SHARED)))
def test_every_real_trace(path):
    bundle = hermes_kb.load(path)
    for trace in bundle:
        ctx, _ = step_context(trace)
        from hermes_kb.analysis.rank import _guarded

        facts = _guarded("overlap", trace.rank, A.per_rank, ctx)
        assert not [f for f in facts if isinstance(f, AnalyzerError)], facts
        steps = by_kind(facts, "step_overlap")
        assert steps and len(steps) == len(ctx.windows) + 1
        assert len(facts) <= len(ctx.windows) + 1 + 2 + H.MAX_STREAMS
        for f in steps:
            assert sum(getattr(f, p) for p in PARTS) == pytest.approx(f.duration_us, rel=1e-9, abs=1e-6)
            assert all(getattr(f, p) >= -1e-6 for p in PARTS)
            assert f.device_busy_us <= f.duration_us + 1e-6
            if f.gpu_idle_us is not None:
                assert f.gpu_idle_us + f.gpu_compute_us + f.gpu_non_compute_us == pytest.approx(f.duration_us, rel=1e-9)
        for f in by_kind(facts, "hta_temporal_breakdown"):
            assert f.idle_ratio + f.compute_ratio + f.non_compute_ratio == pytest.approx(1.0, abs=1e-6)
        for f in by_kind(facts, "hta_idle_breakdown"):
            if f.host_wait_ratio is not None and f.kernel_wait_us >= 0:
                assert f.host_wait_ratio + f.kernel_wait_ratio + f.other_ratio == pytest.approx(1.0, abs=1e-6)
