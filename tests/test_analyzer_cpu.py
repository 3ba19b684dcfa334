"""The cpu analyzer: launch cost, host/device busy, synchronisations, GC and compilation.

Hand-made traces with every expected value worked out in the comments, the bundled example,
launch-bound real traces, and a run over every real Kineto trace in ../shared/data.
"""

from __future__ import annotations

import pytest

import hermes_kb
from hermes_kb.analyzers.host import cpu as A
from hermes_kb.analyzers.host import syncs
from hermes_kb.analyzers.selection import MAX_STEP_FACTS
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import EXAMPLE, SHARED, X, kineto_traces, needs_shared, write_trace


def contexts(path):
    return [step_context(t)[0] for t in hermes_kb.load(path)]


def facts_of(ctx, kind, step="any"):
    fs = [f for f in A.per_rank(ctx) if f.kind == kind]
    return fs if step == "any" else [f for f in fs if f.step == step]


def K(name, ts, dur, corr, stream=7):
    return X(
        "kernel", name, ts, dur, pid=0, tid=stream, args={"device": 0, "stream": stream, "correlation": corr}
    )


def RT(name, ts, dur, corr, ext=None):
    args = {"correlation": corr}
    if ext is not None:
        args["External id"] = ext
    return X("cuda_runtime", name, ts, dur, args=args)


def OP(name, ts, dur, ext):
    return X("cpu_op", name, ts, dur, args={"External id": ext})


# Step 1 = [0, 1000): four ops, each launching one tiny kernel (launch 20 µs, kernel 5 µs).
# Step 2 = [1000, 2000): tensor.item() -> blocking DtoH copy + stream sync; a bare device sync.
LAUNCH_TRACE = [
    X("user_annotation", "ProfilerStep#1", 0, 1000),
    X("user_annotation", "ProfilerStep#2", 1000, 1000),
]
for i in range(4):
    t0 = 100 + 200 * i
    LAUNCH_TRACE += [OP("aten::add", t0, 50, 10 + i), RT("cudaLaunchKernel", t0 + 10, 20, 100 + i, 10 + i),
                     K("add_kernel", t0 + 35, 5, 100 + i)]  # fmt: skip
DTOH_ARGS = {"device": 0, "stream": 7, "correlation": 200, "bytes": 4}
LAUNCH_TRACE += [
    OP("aten::item", 1100, 300, 20),
    OP("aten::_local_scalar_dense", 1105, 290, 21),
    OP("aten::copy_", 1110, 280, 22),
    RT("cudaMemcpyAsync", 1120, 10, 200, 22),
    X("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 1125, 2, pid=0, tid=7, args=DTOH_ARGS),
    RT("cudaStreamSynchronize", 1135, 250, 201, 22),
    RT("cudaDeviceSynchronize", 1500, 100, 202),  # outside every op
]


def test_launch_overhead_of_tiny_kernels(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", LAUNCH_TRACE))
    (f,) = facts_of(ctx, "launch_overhead")
    assert f.step is None and f.launches_count == 4 and f.kernels_count == 4 and f.graph_launches_count == 0
    assert f.launch_call_mean_us == 20 and f.kernel_mean_us == 5
    assert f.short_kernels_count == 4 and f.short_kernels_ratio == 1.0  # every kernel (5) < its launch (20)
    # launch delay: kernel start - launch call end = (t0 + 35) - (t0 + 30) = 5 for each
    assert f.queue_p50_us == 5 and f.queue_p95_us == 5
    # host_wait (HTA): kernels 2..4 were launched (t0 + 10) after the previous kernel ended (t0 - 160);
    # the memcpy in step 2 also, after the last kernel: 4 of the 4 activities with a predecessor
    assert f.host_wait_kernels_count == 4 and f.host_wait_kernels_ratio == 1.0
    # host busy: 4 x 50 (step 1) + item 300 minus the blocked copy (10) and sync (250) calls = 240
    assert f.host_us_per_kernel == pytest.approx((200 + 40) / 4)


def test_stalled_launch_on_a_kernels_first_use(tmp_path):
    # one step [0, 10000): five launches of 20 µs and one of 5000 µs (its kernel's first use,
    # nothing running on the device meanwhile); then the same kernel launched again quickly
    ev = [X("user_annotation", "ProfilerStep#1", 0, 10000)]
    for i, (t0, ldur, name) in enumerate([(100, 20, "a"), (300, 20, "b"), (500, 5000, "loaded"), (5600, 20, "loaded"),
                                          (5800, 20, "a"), (6000, 20, "b")]):  # fmt: skip
        ev += [OP("aten::add", t0, ldur + 30, 10 + i), RT("cudaLaunchKernel", t0 + 10, ldur, 100 + i, 10 + i),
               K(name, t0 + ldur + 15, 5, 100 + i)]  # fmt: skip
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "launch_overhead")
    # median launch 20 µs: only the 5000 µs call passes max(1 ms, 50 x 20 µs)
    assert f.stalled_launches_count == 1 and f.stalled_launch_us == 5000.0
    assert f.stalled_launch_ratio == pytest.approx(5000 / 10000)
    assert f.stalled_device_idle_ratio == 1.0  # kernels end at 140 and start at 5525
    assert f.stalled_first_use_count == 1 and f.stalled_first_use_ratio == 1.0
    assert f.stalled_kernels == ["loaded"]


def test_stalled_launch_while_the_device_is_busy_is_not_idle(tmp_path):
    # the long launch waits while a 6 ms kernel runs (a full queue), on a kernel seen before
    ev = [X("user_annotation", "ProfilerStep#1", 0, 10000), OP("aten::mm", 50, 40, 1), RT("cudaLaunchKernel", 60, 20, 99, 1),
          K("gemm", 90, 6000, 99)]  # fmt: skip
    for i, (t0, ldur) in enumerate([(200, 20), (400, 20), (600, 3000), (3800, 20), (4000, 20)]):
        ev += [OP("aten::add", t0, ldur + 30, 10 + i), RT("cudaLaunchKernel", t0 + 10, ldur, 100 + i, 10 + i),
               K("add", 6100 + 10 * i, 5, 100 + i)]  # fmt: skip
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "launch_overhead")
    assert f.stalled_launches_count == 1 and f.stalled_device_idle_ratio == 0.0
    assert f.stalled_first_use_count == 0  # "add" ran first at 6100, before this launch's kernel at 6120


def test_host_device_busy(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", LAUNCH_TRACE))
    (s1,) = facts_of(ctx, "host_device_busy", step=1)
    assert s1.window_us == 1000 and s1.host_busy_us == 200 and s1.host_busy_ratio == pytest.approx(0.2)
    assert s1.device_busy_us == 20 and s1.device_idle_us == 980
    # the kernels run inside the ops ([t0+35, t0+40) within [t0, t0+50)): idle while host busy = 200 - 20
    assert s1.device_idle_host_busy_us == 180 and s1.launches_count == 4
    assert s1.host_active_us == 200  # no annotations other than the step, no Python
    (s2,) = facts_of(ctx, "host_device_busy", step=2)
    # item [1100, 1400) minus [1120, 1130) and [1135, 1385) = 40 µs of real host work
    assert s2.host_busy_us == 40 and s2.device_busy_us == 2


def test_syncs_and_the_ops_behind_them(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", LAUNCH_TRACE))
    assert facts_of(ctx, "host_sync", step=1) == []  # no sync in step 1
    (s2,) = facts_of(ctx, "host_sync", step=2)
    assert s2.sync_calls_count == 2 and s2.sync_calls_us == 350 and s2.longest_sync_us == 250
    assert s2.dtoh_count == 1 and s2.dtoh_bytes == 4
    assert s2.dtoh_blocking_count == 1 and s2.dtoh_blocking_us == 10  # pageable destination blocks
    assert s2.blocking_us == 360 and s2.window_us == 1000 and s2.blocking_ratio == pytest.approx(0.36)
    assert s2.top_sources == []  # only on the aggregate
    (agg,) = facts_of(ctx, "host_sync", step=None)
    src = {(s.op, s.outer_op): (s.count, s.host_us) for s in agg.top_sources}
    # copy_ -> _local_scalar_dense -> item: the outermost known sync op is aten::item
    assert src == {("aten::item", "aten::item"): (2, 260.0), ("(no op)", "(no op)"): (1, 100.0)}
    assert agg.evidence.counts == {"cudaStreamSynchronize": 1, "cudaDeviceSynchronize": 1}


def test_no_gc_events_no_gc_fact(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", LAUNCH_TRACE))
    assert facts_of(ctx, "gc_pauses") == [] and facts_of(ctx, "compilation") == []


def PY(name, ts, dur, pid_, parent=None):
    args = {"Python id": pid_}
    if parent is not None:
        args["Python parent id"] = parent
    return X("python_function", name, ts, dur, args=args)


COMPILE_TRACE = [
    X("user_annotation", "ProfilerStep#1", 0, 1000),
    X("user_annotation", "ProfilerStep#2", 1000, 1000),
    # step 1: Dynamo compiles [100, 600) (Inductor nested inside), then runs the compiled region
    PY("torch/_dynamo/convert_frame.py(100): _compile", 100, 500, 1),
    PY("torch/_inductor/compile_fx.py(50): compile_fx_inner", 200, 300, 2, parent=1),
    X("cpu_op", "TorchDynamo Cache Lookup", 690, 5),
    X("cpu_op", "Torch-Compiled Region: 0/1", 700, 100),
    # step 2: a guard check, the region again, a Triton autotune run and a GC pause
    X("cpu_op", "TorchDynamo Cache Lookup", 1090, 5),
    X("cpu_op", "Torch-Compiled Region: 0/1", 1100, 100),
    PY("triton/runtime/autotuner.py(120): run", 1300, 100, 3),
    X("python_function", "Python GC", 1500, 30),
]


def test_compilation_and_recompile_ids(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", COMPILE_TRACE))
    (s1,) = facts_of(ctx, "compilation", step=1)
    assert s1.compile_us == 500 and s1.compile_count == 1 and s1.autotune_us == 0
    assert s1.compile_ratio == pytest.approx(0.5)
    assert s1.compiled_region_count == 1 and s1.compiled_region_us == 100
    assert s1.cache_lookup_count == 1 and s1.cache_lookup_us == 5
    assert s1.compiled_frames == ["0/1"] and s1.max_compile_id == 1 and s1.recompiled
    (s2,) = facts_of(ctx, "compilation", step=2)
    assert s2.compile_us == 0 and s2.autotune_us == 100 and s2.autotune_count == 1
    (agg,) = facts_of(ctx, "compilation", step=None)
    assert (agg.compile_us, agg.autotune_us, agg.compiled_region_count, agg.cache_lookup_count) == (
        500,
        100,
        2,
        2,
    )
    assert agg.compile_ratio == pytest.approx(600 / 2000)


def test_gc_pauses(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", COMPILE_TRACE))
    (g,) = facts_of(ctx, "gc_pauses")
    assert g.gc_count == 1 and g.gc_us == 30 and g.longest_us == 30
    assert g.steps_with_gc == [2] and g.steps_with_gc_ratio == 0.5
    assert g.step_time_ratio == pytest.approx(30 / 2000) and g.max_step_ratio == pytest.approx(0.03)
    assert g.in_dataloader_count == 0


def test_bundled_example_cpu_only():
    (ctx,) = contexts(EXAMPLE)
    # README: 6 'Python GC' events, all inside DataLoader.__next__, 2.59 ms in total
    (g,) = facts_of(ctx, "gc_pauses")
    assert g.gc_count == 6 and g.in_dataloader_count == 6 and g.gc_us == pytest.approx(2593, abs=1)
    assert facts_of(ctx, "launch_overhead") == [] and facts_of(ctx, "host_sync") == []
    (busy,) = facts_of(ctx, "host_device_busy", step=None)
    # CPU only: no device fields; ops are a small part of the host time, Python fills the rest
    assert busy.device_busy_us is None and busy.host_busy_ratio < 0.1 and busy.host_active_ratio > 0.95


@needs_shared()
def test_launch_bound_bert_small():
    (ctx,) = contexts(SHARED / "tracelens" / "h100__gaunernst_bert-small-uncased__1016001.json.gz")
    (f,) = facts_of(ctx, "launch_overhead")
    # README: GPU busy 6-9%, 97% of kernels < 10 µs: the device waits for every launch
    assert f.kernels_count == 60 and f.short_kernels_ratio > 0.5 and f.host_wait_kernels_ratio > 0.95
    assert f.queue_p50_us < 10
    (busy,) = facts_of(ctx, "host_device_busy", step=None)
    assert busy.device_busy_ratio < 0.1 and busy.device_idle_host_busy_ratio > 0.3


@needs_shared()
def test_launch_bound_linear_vs_device_bound_owlv2():
    (lin,) = contexts(SHARED / "param" / "linear_kineto.json.gz")
    (f,) = facts_of(lin, "launch_overhead")
    (busy,) = facts_of(lin, "host_device_busy", step=None)
    # the steps are inferred from optimizer steps (the first window, 1 s of set-up, left out)
    assert f.host_wait_kernels_ratio > 0.5 and busy.device_idle_host_busy_ratio > 0.45
    (owl,) = contexts(SHARED / "tracelens" / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz")
    (g,) = facts_of(owl, "launch_overhead")
    assert g.queue_p50_us > 1000 and g.host_wait_kernels_ratio < 0.1  # kernels queue up behind the device
    (s,) = facts_of(owl, "host_sync", step=None)
    assert s.top_sources[0].op == "aten::to" and s.blocking_ratio > 0.2


@needs_shared()
def test_torch_compile_traces():
    (ctx,) = contexts(SHARED / "tracelens" / "b200__eager_trace.json.gz")
    (agg,) = facts_of(ctx, "compilation", step=None)
    assert agg.compiled_frames == ["0/1"] and agg.recompiled and agg.compile_us == 0
    (ctx,) = contexts(SHARED / "tracelens" / "torch_compile_triton__trace.json.gz")
    (agg,) = facts_of(ctx, "compilation", step=None)
    assert agg.compiled_frames == ["0/0"] and not agg.recompiled and agg.compiled_region_count == 1


@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: str(p.relative_to(SHARED)))
def test_every_real_trace(path):
    for ctx in contexts(path):
        facts = A.per_rank(ctx)
        for f in facts:
            type(f).model_validate(f.model_dump())  # ratios within 0..1, types hold
            assert f.rank == ctx.rank
            if f.kind == "host_device_busy":
                assert f.host_busy_us <= f.window_us + 1e-6 and f.host_busy_us <= f.host_active_us + 1e-6
                if f.device_busy_us is not None:
                    assert f.device_idle_host_busy_us <= min(f.host_busy_us, f.device_idle_us) + 1e-6
            elif f.kind == "launch_overhead":
                assert f.short_kernels_count <= f.kernels_count
                if f.queue_p50_us is not None:
                    assert f.queue_p50_us <= f.queue_p95_us
            elif f.kind == "host_sync":
                assert f.longest_sync_us <= f.sync_calls_us + 1e-6 and len(f.top_sources) <= syncs.TOP_SOURCES
                assert f.dtoh_blocking_count <= f.dtoh_count or f.dtoh_count == 0
            elif f.kind == "compilation":
                assert f.compile_us <= f.window_us + 1e-6
        assert sum(1 for f in facts if f.step is not None) <= 3 * MAX_STEP_FACTS
