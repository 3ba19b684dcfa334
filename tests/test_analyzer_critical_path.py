"""The critical-path analyzer: hand-made traces whose path is worked out below, a comparison with
the critical path HolisticTraceAnalysis computed on its own test trace (simple_add), and a run
over every real Kineto trace in ../shared/data."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

import hermes_kb
from hermes_kb.analyzers.timeline import critical_path as A
from hermes_kb.analyzers.timeline.graph import CATEGORIES, UNTRACED
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import SHARED, X, kineto_traces, needs_shared, write_trace
from hermes_kb.facts.critical_path import CriticalPath, CriticalPathStep

CATS = CATEGORIES


def run(path, rank=None):
    bundle = hermes_kb.load(path)
    trace = bundle[rank if rank is not None else bundle.rank_ids[0]]
    ctx, _ = step_context(trace)
    return ctx, A.per_rank(ctx)


def step_facts(facts):
    return [f for f in facts if isinstance(f, CriticalPathStep)]


def segs(ctx, step):
    s = ctx.shared["critical_path"][step]
    return [(r.start_us, r.end_us, r.category, r.name) for r in s.itertuples()]


def K(name, ts, dur, stream, corr, cat="kernel"):
    return X(cat, name, ts, dur, pid=0, tid=stream, args={"device": 0, "stream": stream, "correlation": corr})


def R(name, ts, dur, corr, tid=1):
    return X("cuda_runtime", name, ts, dur, tid=tid, args={"correlation": corr})


GEMM = "volta_sgemm_128x64_nn"


def test_gpu_bound_step_launch_kernel_sync(tmp_path):
    # CPU op -> launch -> long kernel -> cudaDeviceSynchronize -> CPU op, one step [0, 600)
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 600),
        X("cpu_op", "aten::mm", 10, 40),  # [10, 50)
        R("cudaLaunchKernel", 30, 10, 1),  # [30, 40) inside aten::mm
        K(GEMM, 45, 500, 7, 1),  # [45, 545)
        R("cudaDeviceSynchronize", 60, 500, 2),  # [60, 560), returns 15 µs after the kernel ended
        X("cpu_op", "aten::add", 570, 30),  # [570, 600)
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    # Backwards from aten::add (ends 600): the untraced gap [560, 570); the sync call, released by
    # the kernel at 545 (later than its thread predecessor, the gap [50, 60)); the kernel, released
    # by its launch at 40 (no earlier kernel on the stream) -> 5 µs device idle; the launch; the
    # part of aten::mm before the launch; the step's own host time before aten::mm (the driving
    # thread's timeline is cut at the step's start).
    assert segs(ctx, 1) == [
        (0.0, 10.0, "host_gap", UNTRACED),
        (10.0, 30.0, "cpu_op", "aten::mm"),
        (30.0, 40.0, "launch", "cudaLaunchKernel"),
        (40.0, 45.0, "device_idle", ""),
        (45.0, 545.0, "kernel", GEMM),
        (545.0, 560.0, "sync_wait", "cudaDeviceSynchronize"),
        (560.0, 570.0, "host_gap", UNTRACED),
        (570.0, 600.0, "cpu_op", "aten::add"),
    ]
    (f,) = step_facts(facts)
    assert f.path_length_us == 600.0
    assert f.path_start_us == 0.0 and f.path_end_us == 600.0 and f.overrun_us == 0.0
    assert f.path_in_step_ratio == pytest.approx(1.0)
    assert f.kernel_us == 500.0 and f.kernel_ratio == pytest.approx(500 / 600)
    assert f.cpu_op_us == 50.0  # 20 of aten::mm + 30 of aten::add
    assert (f.launch_us, f.sync_wait_us, f.host_gap_us, f.device_idle_us) == (10.0, 15.0, 20.0, 5.0)
    assert f.host_ratio == pytest.approx((50 + 10 + 20) / 600)
    assert f.device_ratio == pytest.approx(500 / 600)
    assert f.dominant_category == "kernel"
    top = {(o.category, o.name): (o.time_us, o.instances_count) for o in f.top_ops}
    # host segments are labelled by their top-level op: the launch counts for aten::mm
    assert top[("kernel", GEMM)] == (500.0, 1)
    assert top[("cpu_op", "aten::mm")] == (20.0, 1)
    assert top[("launch", "aten::mm")] == (10.0, 1)
    assert top[("sync_wait", "cudaDeviceSynchronize")] == (15.0, 1)
    assert f.top_ops[0].name == GEMM
    (agg,) = [x for x in facts if isinstance(x, CriticalPath)]
    assert agg.step is None and agg.steps_count == 1 and agg.path_length_us == 600.0


def test_cpu_bound_step_without_sync_is_all_host(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 300),
        X("cpu_op", "aten::a", 0, 100),
        R("cudaLaunchKernel", 20, 10, 1),  # [20, 30)
        K(GEMM, 35, 10, 7, 1),  # [35, 45): long finished when the step ends
        X("cpu_op", "aten::b", 120, 180),  # [120, 300)
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    # root = aten::b (ends 300 > kernel end 45); thread order all the way back
    assert segs(ctx, 1) == [
        (0.0, 20.0, "cpu_op", "aten::a"),
        (20.0, 30.0, "launch", "cudaLaunchKernel"),
        (30.0, 100.0, "cpu_op", "aten::a"),
        (100.0, 120.0, "host_gap", UNTRACED),
        (120.0, 300.0, "cpu_op", "aten::b"),
    ]
    (f,) = step_facts(facts)
    assert f.path_length_us == 300.0 and f.path_in_step_ratio == 1.0
    assert f.cpu_op_us == 270.0 and f.cpu_op_ratio == pytest.approx(0.9)  # 20 + 70 + 180
    assert f.host_ratio == 1.0 and f.device_ratio == 0.0 and f.kernel_us == 0.0
    top = {(o.category, o.name): (o.time_us, o.instances_count) for o in f.top_ops}
    assert top[("cpu_op", "aten::a")] == (90.0, 1)  # two pieces of one op instance


def test_blocking_memcpy_is_split_at_its_copy(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 200),
        X("cpu_op", "aten::item", 0, 200),
        R("cudaLaunchKernel", 5, 10, 10),  # [5, 15) -> kernel [20, 100)
        K(GEMM, 20, 80, 7, 10),
        R("cudaMemcpyAsync", 50, 130, 11),  # [50, 180): blocks until its copy [100, 150) is done
        K("Memcpy DtoH (Device -> Pageable)", 100, 50, 7, 11, cat="gpu_memcpy"),
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    # The memcpy call is split at 100: [50, 100) launch part, [100, 180) waiting part. Root: the
    # last piece of aten::item [180, 200). Its thread predecessor (the waiting part) is released by
    # the copy at 150; the copy [100, 150) is released by the kernel before it on the stream (ends
    # 100, tie with the launch part -> stream order); the kernel by its launch at 15 (5 µs idle).
    assert segs(ctx, 1) == [
        (0.0, 5.0, "cpu_op", "aten::item"),
        (5.0, 15.0, "launch", "cudaLaunchKernel"),
        (15.0, 20.0, "device_idle", ""),
        (20.0, 100.0, "kernel", GEMM),
        (100.0, 150.0, "memcpy", "Memcpy DtoH (Device -> Pageable)"),
        (150.0, 180.0, "sync_wait", "cudaMemcpyAsync"),
        (180.0, 200.0, "cpu_op", "aten::item"),
    ]
    (f,) = step_facts(facts)
    assert f.path_length_us == 200.0
    assert (f.kernel_us, f.memcpy_us, f.sync_wait_us) == (80.0, 50.0, 30.0)
    assert f.device_ratio == pytest.approx(130 / 200)


def test_blocking_memcpy_split_depends_on_what_held_the_copy_back(tmp_path):
    copy = "Memcpy DtoH (Device -> Pageable)"
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 400),
        # (a) the stream is busy when the call begins: kernel [20, 90), call [50, 180), copy [100, 150)
        R("cudaLaunchKernel", 5, 10, 10),
        K(GEMM, 20, 70, 7, 10),
        R("cudaMemcpyAsync", 50, 130, 11),
        K(copy, 100, 50, 7, 11, cat="gpu_memcpy"),
        # (b) the stream is idle: call [200, 300), copy [240, 260): the call's own set-up held it
        R("cudaMemcpyAsync", 200, 100, 12),
        K(copy, 240, 20, 7, 12, cat="gpu_memcpy"),
        X("cpu_op", "aten::add", 300, 100),  # [300, 400)
    ]
    ctx, _ = run(write_trace(tmp_path / "t.json", ev))
    # (a) split at 90 (the kernel's end, inside the call): [50, 90) launch part, off the path;
    # the copy's candidates tie at 90 -> stream order: the kernel; 10 µs DMA start-up = idle.
    # (b) split at 240 (the copy's start): [200, 240) is launch time on the path.
    assert segs(ctx, 1) == [
        (0.0, 5.0, "host_gap", UNTRACED),
        (5.0, 15.0, "launch", "cudaLaunchKernel"),
        (15.0, 20.0, "device_idle", ""),
        (20.0, 90.0, "kernel", GEMM),
        (90.0, 100.0, "device_idle", ""),
        (100.0, 150.0, "memcpy", copy),
        (150.0, 180.0, "sync_wait", "cudaMemcpyAsync"),
        (180.0, 200.0, "host_gap", UNTRACED),
        (200.0, 240.0, "launch", "cudaMemcpyAsync"),
        (240.0, 260.0, "memcpy", copy),
        (260.0, 300.0, "sync_wait", "cudaMemcpyAsync"),
        (300.0, 400.0, "cpu_op", "aten::add"),
    ]


def test_stream_wait_event_links_streams(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 20),
        R("cudaLaunchKernel", 0, 5, 1),  # kernel A on stream 7, [10, 200)
        K("kernel_a", 10, 190, 7, 1),
        R("cudaEventRecord", 6, 2, 2),  # records after A
        R("cudaStreamWaitEvent", 9, 2, 3),  # stream 20 waits for that event
        X("cuda_sync", "Stream Wait Event", 9, 2, pid=0, tid=20,
          args={"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7, "device": 0,
                "wait_on_cuda_event_record_corr_id": 2, "stream": 20, "correlation": 3}),  # fmt: skip
        R("cudaLaunchKernel", 12, 3, 4),  # kernel B on stream 20 runs only once A is done
        K("kernel_b", 200, 50, 20, 4),
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    # window [0, 250): the step ends with the last device activity it launched. Root = kernel B;
    # its candidates: launch (ends 15), event wait on A (ends 200) -> A; A's launch ends at 5.
    assert segs(ctx, 1) == [
        (0.0, 5.0, "launch", "cudaLaunchKernel"),
        (5.0, 10.0, "device_idle", ""),
        (10.0, 200.0, "kernel", "kernel_a"),
        (200.0, 250.0, "kernel", "kernel_b"),
    ]
    (f,) = step_facts(facts)
    assert f.step_duration_us == 250.0 and f.path_in_step_ratio == 1.0
    assert f.kernel_ratio == pytest.approx(240 / 250)
    assert f.evidence.counts["graph_event_wait_edges"] == 1


def test_autograd_thread_fork_and_join(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 450),
        X("cpu_op", "forward", 0, 100),  # main thread [0, 100), then waits in backward()
        X("cpu_op", "backward_op", 150, 240, tid=2),  # autograd thread [150, 390)
        X("cpu_op", "optimizer", 400, 50),  # main thread again [400, 450)
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    # The main thread's gap [100, 400) is joined to backward_op (ended 10 µs before the gap's end,
    # within 1000 µs); backward_op, the first event of its thread, is joined to forward (ended 50 µs
    # before it started). The waits in between are untraced host time.
    assert segs(ctx, 1) == [
        (0.0, 100.0, "cpu_op", "forward"),
        (100.0, 150.0, "host_gap", UNTRACED),
        (150.0, 390.0, "cpu_op", "backward_op"),
        (390.0, 400.0, "host_gap", UNTRACED),
        (400.0, 450.0, "cpu_op", "optimizer"),
    ]
    (f,) = step_facts(facts)
    assert f.cpu_op_us == 390.0 and f.host_gap_us == 60.0 and f.path_length_us == 450.0
    assert f.evidence.counts["graph_join_edges"] == 2


def test_cpu_only_gaps_named_by_annotation_and_main_thread_root(tmp_path):
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 300),
        X("cpu_op", "aten::a", 0, 50),
        X("user_annotation", loader, 60, 140),  # [60, 200): no ops inside
        X("cpu_op", "aten::b", 200, 100),  # [200, 300)
        X("cpu_op", "worker_op", 10, 10, tid=9),  # another thread, done long before
        X("cpu_op", "late_op", 250, 60, tid=9),  # ends at 310, after the step: not the root
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    assert segs(ctx, 1) == [
        (0.0, 50.0, "cpu_op", "aten::a"),
        (50.0, 60.0, "host_gap", UNTRACED),
        (60.0, 200.0, "host_gap", loader),
        (200.0, 300.0, "cpu_op", "aten::b"),
    ]
    (f,) = step_facts(facts)
    assert f.host_gap_ratio == pytest.approx(150 / 300) and f.cpu_op_ratio == pytest.approx(150 / 300)
    assert f.top_ops[0].name == loader and f.top_ops[0].time_us == 140.0


def test_shared_frames_tile_the_path(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("user_annotation", "ProfilerStep#2", 100, 100),
        X("cpu_op", "aten::a", 0, 60),
        X("cpu_op", "aten::b", 110, 80),
    ]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    shared = ctx.shared["critical_path"]
    assert sorted(shared) == [1, 2]
    s2 = shared[2]
    assert list(s2.columns) == ["start_us", "end_us", "category", "name", "op"]
    assert isinstance(s2["category"].dtype, pd.CategoricalDtype)
    # the driving thread is cut at each step start and at the last step's end: step 1 ends with
    # the gap [60, 100), step 2 = [100, 200) is the gap [100, 110), aten::b and the gap [190, 200)
    assert segs(ctx, 1) == [(0.0, 60.0, "cpu_op", "aten::a"), (60.0, 100.0, "host_gap", UNTRACED)]
    assert segs(ctx, 2) == [(100.0, 110.0, "host_gap", UNTRACED), (110.0, 190.0, "cpu_op", "aten::b"),
                            (190.0, 200.0, "host_gap", UNTRACED)]  # fmt: skip
    agg = [f for f in facts if isinstance(f, CriticalPath)][0]
    assert agg.steps_count == 2 and agg.path_length_us == 200.0
    assert agg.step_duration_us == 200.0


def test_walker_follows_chain_stops_at_window_and_cuts_cycles():
    from types import SimpleNamespace

    # chain 5 -> 4 -> 3 -> 2 -> 1 -> 0 (pred of 0: none); ends 60, 50, ..., 10
    g = SimpleNamespace(pred=np.array([-1, 0, 1, 2, 3, 4]), end=np.array([10.0, 20, 30, 40, 50, 60]))
    w = A.Walker(g)
    assert w.walk(5, 0.0).tolist() == [5, 4, 3, 2, 1, 0]
    assert w.walk(5, 25.0).tolist() == [5, 4, 3, 2]  # node 2 ends at 30 > 25: kept; node 1 (20): not
    assert w.walk(5, 30.0).tolist() == [5, 4, 3]  # a predecessor must end after the window start
    # a cycle 0 -> 2 -> 1 -> 0 (clock skew) is cut at the first repeat
    g = SimpleNamespace(pred=np.array([2, 0, 1, 2]), end=np.array([10.0, 20, 30, 40]))
    assert A.Walker(g).walk(3, 0.0).tolist() == [3, 2, 1, 0]


def test_empty_trace_parts_give_no_facts(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("user_annotation", "other", 0, 10, tid=3)]
    ctx, facts = run(write_trace(tmp_path / "t.json", ev))
    assert facts == [] and ctx.shared["critical_path"] == {}


# ---- HTA's expected critical path on simple_add -----------------------------------------------


@needs_shared()
def test_simple_add_agrees_with_hta_overlay():
    base = SHARED / "hta" / "critical_path" / "end_to_end" / "simple_add"
    ctx, _ = run(base / "input" / "trace.json.gz")
    seg = ctx.shared["critical_path"][0]
    origin = ctx.trace.meta.origin_us
    doc = json.loads(gzip.decompress((base / "output" / "overlaid_critical_path_trace.json.gz").read_bytes()))
    ev = pd.DataFrame([
        {"cat": e["cat"], "name": e["name"], "ts": e["ts"] - origin, "end": e["ts"] + e["dur"] - origin,
         "critical": e.get("args", {}).get("critical", 0) == 1}
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op")
    ])  # fmt: skip
    name = seg["name"].astype(str).to_numpy()
    op = seg["op"].astype(str).to_numpy()
    s, e, cat = seg["start_us"].to_numpy(), seg["end_us"].to_numpy(), seg["category"].astype(str).to_numpy()

    def ours(rows, col, cats):
        # an event is on our path when a segment of it (by name / enclosing op) lies inside it
        return np.array([bool(((col == r.name) & np.isin(cat, cats) & (s >= r.ts) & (e <= r.end)).any())
                         for r in rows.itertuples()])  # fmt: skip

    dev = ev[ev["cat"] != "cpu_op"]
    d_ours = ours(dev, name, ["kernel", "memcpy", "communication"])
    d_hta = dev["critical"].to_numpy()
    # HTA flags 22 device activities (16 HtoD copies of the model set-up + the last 6 kernels and
    # memset before the final sync); we agree on the 16 copies and flag nothing HTA does not.
    assert d_hta.sum() == 22 and d_ours.sum() == 16
    assert (d_ours & d_hta).sum() == 16 and (d_ours & ~d_hta).sum() == 0
    top = ctx.trace.cpu_ops[ctx.trace.cpu_ops["depth"] == 0]
    cpu = ev[ev["cat"] == "cpu_op"].merge(top[["name", "ts"]].assign(name=lambda x: x["name"].astype(str)),
                                          on=["name", "ts"])  # fmt: skip
    c_ours = ours(cpu, op, ["cpu_op", "launch", "runtime", "sync_wait"])
    c_hta = cpu["critical"].to_numpy()
    # 145 of the 147 top-level ops are HTA-critical and all 145 are on our path too; we add the
    # last two (aten::relu_, aten::linear), where HTA went through their kernels instead.
    assert len(cpu) == 147 and c_hta.sum() == 145
    assert (c_ours & c_hta).sum() == 145 and (c_ours & ~c_hta).sum() == 2
    assert set(cpu.loc[c_ours & ~c_hta, "name"]) == {"aten::relu_", "aten::linear"}


@needs_shared()
def test_event_sync_waits_for_the_spin_kernel():
    ctx, _ = run(SHARED / "hta" / "critical_path" / "cuda_event_sync" / "event_sync_trace.json.gz")
    (step,) = ctx.shared["critical_path"]
    s = segs(ctx, step)
    i = next(k for k, x in enumerate(s) if x[2] == "kernel" and "spin_kernel" in x[3])
    # cudaEventSynchronize waited on the event recorded after spin_kernel: it takes over when the
    # kernel ends; the blocking DtoH copy before it is split into launch / memcpy / sync_wait
    assert s[i + 1][2:] == ("sync_wait", "cudaEventSynchronize") and s[i + 1][0] == s[i][1]
    cats = [x[2] for x in s]
    j = cats.index("memcpy")
    assert cats[j - 1 : j + 2] == ["launch", "memcpy", "sync_wait"]


# ---- every real trace ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: str(p.relative_to(SHARED))[:60])
def test_real_traces_run_and_stay_sane(path):
    from hermes_kb.analysis.rank import _guarded

    bundle = hermes_kb.load(path)
    for trace in bundle:
        ctx, _ = step_context(trace)
        facts = _guarded("critical_path", trace.rank, A.per_rank, ctx)  # as the driver runs it
        errors = [f for f in facts if f.kind == "analyzer_error"]
        assert not errors, errors
        mine = [f for f in facts if isinstance(f, (CriticalPath, CriticalPathStep))]
        assert len(mine) <= len(ctx.windows) + 1
        for f in mine:
            total = f.path_length_us
            assert total >= 0 and 0 <= f.path_in_step_ratio <= 1 and f.overrun_us >= 0
            shares = sum(getattr(f, f"{c}_ratio") for c in CATS)
            assert shares == pytest.approx(1.0, abs=1e-6) if total > 0 else shares == 0
            assert sum(getattr(f, f"{c}_us") for c in CATS) == pytest.approx(total)
            assert len(f.top_ops) <= 10
            assert all(o.time_us <= total + 1e-6 for o in f.top_ops)
        for step, seg in ctx.shared.get("critical_path", {}).items():
            st, en = seg["start_us"].to_numpy(), seg["end_us"].to_numpy()
            assert (en > st).all()
            assert (st[1:] >= en[:-1] - 1e-6).all()  # in time order, no overlap
            f = next(x for x in mine if isinstance(x, CriticalPathStep) and x.step == step)
            assert (en - st).sum() == pytest.approx(f.path_length_us)


def test_a_profiler_step_recorded_as_a_cpu_op_is_not_an_operator(tmp_path):
    # issue 36 item 3: hermes' monitor opens a capture's "ProfilerStep#N" with
    # torch._C._profiler._RecordFunctionFast (RecordScope::FUNCTION), which Kineto writes as a
    # cpu_op, not a user_annotation. Read as an op it wrapped every op of the step: the critical
    # path's top "operators" were ProfilerStep#2..#6 (a monitored run's table led with
    # ProfilerStep#332) and the steps were inferred (0-4). It is the step's annotation, as
    # record_function's user_annotation is: the same steps, path and table as the original trace.
    from conftest import EXAMPLE

    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    moved = 0
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation":
            e["cat"] = "cpu_op"
            moved += 1
    assert moved == 5
    fast = tmp_path / "fast_step.json"
    fast.write_text(json.dumps(doc))
    t = hermes_kb.load(fast)[0]
    assert not t.cpu_ops["name"].astype(str).str.startswith("ProfilerStep#").any()
    assert sorted(t.annotations.loc[t.annotations["kind"] == "step", "step"].tolist()) == [2, 3, 4, 5, 6]
    ctx0, facts0 = run(EXAMPLE)
    ctx1, facts1 = run(fast)
    assert [w.step for w in ctx1.windows] == [w.step for w in ctx0.windows] == [2, 3, 4, 5, 6]
    (whole0,) = [f for f in facts0 if isinstance(f, CriticalPath)]
    (whole1,) = [f for f in facts1 if isinstance(f, CriticalPath)]
    assert not any(o.name.startswith("ProfilerStep#") for f in facts1 for o in f.top_ops)
    assert [(o.name, o.category) for o in whole1.top_ops] == [(o.name, o.category) for o in whole0.top_ops]
    assert whole1.path_length_us == pytest.approx(whole0.path_length_us)


def test_monitored_run_critical_path_table_has_no_profiler_step(tmp_path):
    # the same on a monitored run: a recorded zoo run whose capture's steps are cpu_op spans (as
    # the monitor's own captures are); the report's critical-path table (summary[].critical_path_ops)
    from pathlib import Path
    import shutil

    from hermes_kb.advisor.run import advise_run_dir_full
    from hermes_kb.render.details import with_details

    src = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/checkpoint_stalls/bad"
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    (cap,) = run_dir.glob("rank0.capture*.json.gz")
    doc = json.loads(gzip.decompress(cap.read_bytes()))
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
    cap.write_bytes(gzip.compress(json.dumps(doc).encode()))
    got, want = (with_details(a.report, a.facts, a.run).summary[0]
                 for a in (advise_run_dir_full(run_dir), advise_run_dir_full(src)))  # fmt: skip
    assert got.critical_path_ops and not any(o.name.startswith("ProfilerStep#") for o in got.critical_path_ops)
    assert [o.name for o in got.critical_path_ops] == [o.name for o in want.critical_path_ops]
