"""The what-if replay (analyzers/whatif/replay.py): hand-made traces whose replayed step times are worked
out below, the exact replay of an unchanged graph on real traces, and the critical-path bound."""

from __future__ import annotations

import numpy as np
import pytest

import hermes_kb
from conftest import ROOT, SHARED, X, needs_shared, write_trace
from hermes_kb.analysis.rank import analyze_rank
from hermes_kb.analyzers.whatif.replay import (
    analysed_time,
    baseline_time,
    evaluate,
    node_amounts,
    removed_at,
    removed_together,
    replay,
)
from hermes_kb.analyzers.whatif.sets import WhatIfSet

ZOO = ROOT / "benchmarks" / "scenarios" / "recorded"  # this checkout's recordings, whatever its folder is called


def K(name, ts, dur, corr, stream=7):
    return X("kernel", name, ts, dur, pid=0, tid=stream, args={"device": 0, "stream": stream, "correlation": corr})


def R(name, ts, dur, corr, tid=1):
    return X("cuda_runtime", name, ts, dur, tid=tid, args={"correlation": corr})


def ctx_of(path):
    bundle = hermes_kb.load(path)
    ctx, facts = analyze_rank(bundle[bundle.rank_ids[0]])
    return ctx, facts


def whatif(facts, target):
    return next(f for f in facts if f.kind == "whatif" and f.target == target)


def test_data_loading_hidden_under_queued_device_work_removes_nothing(tmp_path):
    # step [0, 300): launch a 200 µs kernel, then load the next batch on the host (100 µs) while
    # the kernel runs, then wait for the kernel, then an op. The loader is hidden under the kernel:
    # the step cannot get shorter by removing it (Amdahl on its own time would say 100 µs).
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 300),
        X("cpu_op", "aten::mm", 0, 10),
        R("cudaLaunchKernel", 2, 6, 1),  # [2, 8)
        K("gemm", 15, 200, 1),  # [15, 215)
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 100),
        X("cpu_op", "aten::to", 12, 95),  # [12, 107) inside the loader
        R("cudaDeviceSynchronize", 110, 110, 2),  # [110, 220): returns 5 µs after the kernel
        X("cpu_op", "aten::add", 220, 80),  # [220, 300)
    ]
    ctx, facts = ctx_of(write_trace(tmp_path / "t.json", ev))
    w = whatif(facts, "dataloader")
    assert w.own_us == pytest.approx(100.0)
    assert w.critical_us == pytest.approx(0.0)
    assert w.removed_all_us == pytest.approx(0.0) and w.removed_half_us == pytest.approx(0.0)


def test_data_loading_the_device_waits_for_is_removed_in_full(tmp_path):
    # the loader runs before the launch: everything after it moves 100 µs earlier
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 400),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100),
        X("cpu_op", "aten::to", 0, 100),
        X("cpu_op", "aten::mm", 100, 10),
        R("cudaLaunchKernel", 102, 6, 1),  # [102, 108)
        K("gemm", 113, 200, 1),  # [113, 313)
        R("cudaDeviceSynchronize", 110, 208, 2),  # [110, 318)
        X("cpu_op", "aten::add", 318, 82),  # [318, 400)
    ]
    ctx, facts = ctx_of(write_trace(tmp_path / "t.json", ev))
    w = whatif(facts, "dataloader")
    assert w.own_us == pytest.approx(100.0) and w.critical_us == pytest.approx(100.0)
    assert w.removed_all_us == pytest.approx(100.0) and w.removed_half_us == pytest.approx(50.0)


def test_dropping_a_sync_lets_the_host_run_ahead(tmp_path):
    # launch A (300 µs), sync on it, then launch B (300 µs) and wait at the end: the host's 100 µs
    # of work between the two kernels (op after the sync) was serialised behind A. Without the
    # first sync the host does that work while A runs: B is queued behind A and the step loses
    # the 100 µs op plus the sync's return latency (5 µs).
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 720),
        R("cudaLaunchKernel", 0, 10, 1),  # [0, 10)
        K("a", 15, 300, 1),  # [15, 315)
        R("cudaStreamSynchronize", 10, 310, 2),  # [10, 320): waits for A, returns 5 µs after
        X("cpu_op", "aten::add", 320, 100),  # [320, 420): host work
        R("cudaLaunchKernel", 420, 10, 3),  # [420, 430)
        K("b", 435, 280, 3),  # [435, 715)
        R("cudaDeviceSynchronize", 430, 290, 4),  # [430, 720)
    ]
    ctx, facts = ctx_of(write_trace(tmp_path / "t.json", ev))
    m = ctx.shared["whatif_model"]
    g = ctx.shared["graph"]
    s = WhatIfSet.of_intervals("x", "the first sync", 1, [10.0], [320.0], drop_waits=True)
    r = node_amounts(g, s, len(ctx.trace.kernels))
    # without the first sync: the op runs [10, 110), B launched at [110, 120) starts after A
    # (315) and ends at 595; the final sync returns 5 µs later: 600 instead of 720
    assert evaluate(m, r, 1.0, True) == pytest.approx(120.0)


def test_unchanged_graph_replays_the_recorded_times_exactly(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 720),
        R("cudaLaunchKernel", 0, 10, 1),
        K("a", 15, 300, 1),
        R("cudaStreamSynchronize", 10, 310, 2),
        X("cpu_op", "aten::add", 320, 100),
        R("cudaLaunchKernel", 420, 10, 3),
        K("b", 435, 280, 3),
        R("cudaDeviceSynchronize", 430, 290, 4),
    ]
    ctx, _ = ctx_of(write_trace(tmp_path / "t.json", ev))
    m = ctx.shared["whatif_model"]
    S, E = replay(m)
    assert np.array_equal(np.array(S), m.start0) and np.array_equal(np.array(E), m.end0)
    assert analysed_time(m, S, E) == pytest.approx(baseline_time(m))


REAL = [
    "kineto_2021/resnet50_num_workers_0.pt.trace.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "param/linear_kineto.json.gz",
    "param/dlrm_kineto_8rank/worker1_step_12.1694128201556.pt.trace.json.gz",
    "ascend/msinsight_pt_text_level0_2rank",
    "tracelens/h100__facebook_timesformer-base-finetuned-k400__1016002.json.gz",
]


@needs_shared()
@pytest.mark.parametrize("rel", REAL)
def test_real_traces_replay_exactly_and_respect_the_critical_path_bound(rel):
    ctx, facts = ctx_of(SHARED / rel)
    m = ctx.shared["whatif_model"]
    S, E = replay(m)
    assert np.abs(np.array(S) - m.start0).max() == 0.0 and np.abs(np.array(E) - m.end0).max() == 0.0
    wf = [f for f in facts if f.kind == "whatif"]
    assert wf
    for f in wf:
        # shortening events by d removes at most d from the critical path they are on (the bound
        # is exact for the max-plus replay; removing waits is not a shortening)
        assert 0.0 <= f.removed_half_us <= f.removed_all_us + 1e-6
        if not f.drop_waits:
            assert f.removed_all_us <= f.critical_us * 1.02 + 1.0, f.target
        assert f.removed_all_us <= f.step_us


def test_cpu_only_trace_replay_is_amdahl_on_the_main_thread():
    path = ZOO / "loader_heavy_transform" / "bad" / "rank0.capture-profile.json.gz"
    if not path.exists():
        pytest.skip("scenario recording absent")
    ctx, facts = ctx_of(path)
    w = whatif(facts, "dataloader")
    assert w.critical_us == pytest.approx(w.own_us, rel=1e-6)
    assert w.removed_all_us == pytest.approx(w.own_us, rel=1e-6)
    assert w.removed_half_us == pytest.approx(0.5 * w.own_us, rel=1e-6)


def test_removed_at_interpolates_the_replayed_points():
    assert removed_at(50.0, 120.0, 0.0) == 0.0
    assert removed_at(50.0, 120.0, 0.25) == pytest.approx(25.0)
    assert removed_at(50.0, 120.0, 0.5) == pytest.approx(50.0)
    assert removed_at(50.0, 120.0, 0.75) == pytest.approx(85.0)
    assert removed_at(50.0, 120.0, 1.5) == pytest.approx(120.0)


@needs_shared()
def test_fixes_on_the_same_events_compound_instead_of_adding():
    ctx, facts = ctx_of(SHARED / "param/linear_kineto.json.gz")
    m = ctx.shared["whatif_model"]
    a = ctx.shared["whatif_amounts"]["host_work"]
    one = removed_together(m, [(a, 0.5, False)])
    two = removed_together(m, [(a, 0.5, False), (a, 0.5, False)])
    # twice "remove half" of the same work is 75% of it, not 100%
    assert one == pytest.approx(whatif(facts, "host_work").removed_half_us, rel=1e-6)
    assert one < two <= removed_together(m, [(a, 0.75, False)]) + 1e-6


def test_half_of_the_sync_calls_go_whole(tmp_path):
    # two blocking DtoH copies, each split into a launch part and a waiting part: removing half of
    # the calls drops one call (both of its parts), not one part of each
    copy = "Memcpy DtoH (Device -> Pageable)"
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    for i, t0 in enumerate((0, 500)):
        ev += [R("cudaLaunchKernel", t0, 10, 10 + i), K("k", t0 + 15, 200, 10 + i),
               R("cudaMemcpyAsync", t0 + 20, 220, 20 + i),
               X("gpu_memcpy", copy, t0 + 215, 20, pid=0, tid=7,
                 args={"device": 0, "stream": 7, "correlation": 20 + i, "bytes": 8})]  # fmt: skip
    ctx, _ = ctx_of(write_trace(tmp_path / "t.json", ev))
    from hermes_kb.analyzers.whatif.replay import _drops

    m, g = ctx.shared["whatif_model"], ctx.shared["graph"]
    s = WhatIfSet.of_intervals("x", "the copies", 1, [20.0, 520.0], [240.0, 740.0], drop_waits=True)
    r = node_amounts(g, s, len(ctx.trace.kernels))
    parts = np.flatnonzero(r > 0)
    assert len(parts) == 4  # two parts per call
    half = np.flatnonzero(_drops(m, r, 0.5))
    assert len(half) == 2 and g.start[half].max() - g.start[half].min() < 300  # one call, both parts
    assert np.flatnonzero(_drops(m, r, 1.0)).tolist() == parts.tolist()


@needs_shared()
def test_replays_split_over_two_processes_give_the_sequential_facts():
    """The what-if replays of a rank run in two processes where a core is free: the same facts.
    In a fresh interpreter (a process where Dask has run no longer forks)."""
    from conftest import in_fresh_process

    in_fresh_process("""
import os
from conftest import SHARED
from hermes_kb import load
from hermes_kb.core import workers
from hermes_kb.analysis.rank import analyze_rank
forks = []
real = os.fork
os.fork = lambda: forks.append(1) or real()
bundle = load(str(SHARED / "hta/df_index_resolver/df_index_resolver.json.gz"), max_workers=1)
trace = bundle[bundle.rank_ids[0]]
def whatif(split):
    workers.core_free = lambda: split
    forks.clear()
    _, facts = analyze_rank(trace)
    assert bool(forks) == split
    return [f.model_dump() for f in facts if f.kind == "whatif"]
a, b = whatif(True), whatif(False)
assert a == b and sum(f["replayed"] for f in a) >= 3
""")


@needs_shared()
@pytest.mark.parametrize("rel", [REAL[1], REAL[0]])
def test_deferred_replays_give_the_eager_report_and_the_eager_facts_they_replay(rel):
    """advise replays only the sets a matched case names (hermes_kb/advisor/on_demand.py): the
    report is the one the eager analysis gives, the replayed facts are its facts, the others
    carry their critical-path bound and say they were not replayed."""
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.analysis.run import analyze_with_replay

    bundle = hermes_kb.load(str(SHARED / rel))
    lazy = advise_bundle_full(bundle)
    facts, replay = analyze_with_replay(bundle)
    eager = advise_bundle_full(bundle, facts=facts, replay=replay)
    assert lazy.report.model_dump_json() == eager.report.model_dump_json()
    mine = {(f.rank, f.target): f for f in lazy.facts if f.kind == "whatif"}
    theirs = {(f.rank, f.target): f for f in eager.facts if f.kind == "whatif"}
    assert mine.keys() == theirs.keys()
    used = {(r, f.whatif_target) for f in lazy.report.findings if f.whatif_target for r in (f.ranks or [None])}
    replayed = {k for k, f in mine.items() if f.replayed}
    assert replayed and replayed < {k for k, f in theirs.items() if f.replayed}
    for k in replayed:
        assert mine[k] == theirs[k]
    for k in mine.keys() - replayed:
        f = mine[k]
        assert f.removed_all_us == f.critical_us and f.removed_half_us == 0.5 * f.critical_us
    assert {k for k in used if k in theirs and theirs[k].replayed} <= replayed


def test_a_fix_that_removes_kernels_removes_their_launching_operators_too(tmp_path):
    # a host-bound step: four operators back to back, each launching short kernels. aten::add and
    # aten::mul launch only element-wise kernels; aten::foo launches an element-wise kernel and a
    # GEMM; aten::mm a GEMM. Fusing the element-wise kernels removes the calls of add and mul (100
    # µs of host work), not foo's (it still launches its GEMM) nor mm's.
    ew = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float*)"
    gemm = "ampere_sgemm_128x64_nn"
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 210),
        X("cpu_op", "aten::add", 0, 50), R("cudaLaunchKernel", 40, 5, 1), K(ew, 46, 2, 1),
        X("cpu_op", "aten::mul", 50, 50), R("cudaLaunchKernel", 90, 5, 2), K(ew, 96, 2, 2),
        X("cpu_op", "aten::foo", 100, 50), R("cudaLaunchKernel", 120, 5, 3), K(ew, 126, 2, 3),
        R("cudaLaunchKernel", 140, 5, 4), K(gemm, 146, 3, 4),
        X("cpu_op", "aten::mm", 150, 50), R("cudaLaunchKernel", 190, 5, 5), K(gemm, 196, 3, 5),
        X("cpu_op", "aten::relu", 200, 10),
    ]  # fmt: skip
    ctx, facts = ctx_of(write_trace(tmp_path / "t.json", ev))
    w = whatif(facts, "fusable")
    # the three element-wise kernels (6 µs) and the host segments of add and mul (2 x 50 µs)
    assert w.launch_host_us == pytest.approx(100.0)
    assert w.own_us == pytest.approx(106.0)
    # everything after mul starts 100 µs earlier; the kernels are too short to hold anything up
    assert w.removed_all_us == pytest.approx(100.0, abs=0.5)
    # a set without the flag holds the kernels alone
    g = ctx.shared["graph"]
    plain = WhatIfSet("x", "kernels only", kernels=np.array([0, 1, 2]))
    r = node_amounts(g, plain, len(ctx.trace.kernels))
    assert r[: g.n_host].sum() == 0.0 and r.sum() == pytest.approx(6.0)
