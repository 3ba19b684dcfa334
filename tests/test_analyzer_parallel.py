"""parallel analyzer: imbalance across ranks and pipeline bubbles, with hand-worked values."""

from __future__ import annotations

import pytest

import hermes_kb
from hermes_kb.analyzers.comm import parallel
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, kineto_traces, needs_shared, write_trace
from hermes_kb.analysis.rank import digests_of
from test_analyzer_comm import collective, compute_kernel, three_ranks


def by_component(facts, pg=None):
    return {f.component: f for f in facts if f.kind == "rank_imbalance" and f.process_group == pg}


def test_imbalance_by_hand(tmp_path):
    # three ranks, one step [0, 2000) each; compute kernels of 100, 200, 600 µs;
    # collectives (union per rank): rank 0 300 + 400 = 700, rank 1 200 + 100 = 300, rank 2 100 + 250 = 350
    ctxs = three_ranks(tmp_path, compute=(100, 200, 600))
    comps = by_component(parallel.cross_rank(digests_of(ctxs), []))
    assert set(comps) == {"step_time", "compute", "communication", "non_communication"}
    st = comps["step_time"]
    assert st.max_us == st.min_us == 2000.0 and st.imbalance_ratio == 0.0 and st.steps_count == 1
    c = comps["compute"]
    # mean = 300, max = 600 (rank 2): imbalance = 1 - 300/600 = 0.5, excess 300
    assert (c.max_rank, c.min_rank) == (2, 0)
    assert c.mean_us == pytest.approx(300.0) and c.imbalance_ratio == pytest.approx(0.5)
    assert c.max_excess_us == pytest.approx(300.0)
    assert c.per_rank_us == {2: 600.0, 1: 200.0, 0: 100.0}
    m = comms = comps["communication"]
    assert comms.per_rank_us == {0: 700.0, 2: 350.0, 1: 300.0}
    assert m.max_rank == 0 and m.imbalance_ratio == pytest.approx(1 - 450 / 700)
    n = comps["non_communication"]
    # 2000 - comm: 1300, 1700, 1650 -> mean 1550, max 1700 (rank 1): 1 - 1550/1700
    assert n.max_rank == 1 and n.imbalance_ratio == pytest.approx(1 - 1550 / 1700)
    assert n.max_excess_us == pytest.approx(150.0)
    assert n.worst_step == 5 and n.worst_step_spread_us == pytest.approx(400.0)
    # all_reduce over [0, 1, 2] only: no proper sub-group, no pipeline
    assert not [
        f for f in parallel.cross_rank(digests_of(ctxs), []) if f.process_group is not None or f.kind == "pipeline_bubble"
    ]


def test_process_group_subset_gets_its_own_imbalance(tmp_path):
    # 3 ranks; ranks 0 and 1 also all_reduce in group "1" = [0, 1]
    for r, comp in enumerate((100, 300, 500)):
        ev = [X("user_annotation", "ProfilerStep#1", 0, 2000)]
        ev += compute_kernel(100, comp, corr=1)
        ev += collective(1000, 100, ext=10, corr=2, nelems=256, ranks="[0, 1, 2]", size=3)
        if r < 2:
            ev += collective(1500, 100, ext=20, corr=3, nelems=256, pg="1", ranks="[0, 1]", size=2)
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 3})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    sub = by_component(parallel.cross_rank(digests_of(ctxs), []), pg="1")
    assert set(sub) == {"compute", "non_communication"}
    # compute in group [0, 1]: 100 and 300 -> mean 200, max 300 (rank 1)
    assert sub["compute"].ranks_count == 2 and sub["compute"].max_rank == 1
    assert sub["compute"].imbalance_ratio == pytest.approx(1 - 200 / 300)


def pipeline_rank(tmp_path, kind="send", ranks="[0, 1]", size=2, pg="2"):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    ev += compute_kernel(100, 300, corr=1)  # compute [100, 400)
    # a point-to-point exchange [400, 600) with the next stage
    ev += collective(
        400,
        200,
        ext=10,
        corr=2,
        nelems=1024,
        name=kind,
        ranks=ranks,
        size=size,
        pg=pg,
        kernel="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    )
    p = write_trace(tmp_path / "rank0.json", ev, distributedInfo={"rank": 0, "world_size": 2})
    return {0: step_context(hermes_kb.load(p)[0])[0]}


def test_pipeline_bubble_by_hand(tmp_path):
    facts = [f for f in parallel.cross_rank(digests_of(pipeline_rank(tmp_path)), []) if f.kind == "pipeline_bubble"]
    assert len(facts) == 1
    b = facts[0]
    assert b.rank == 0 and b.p2p_count == 1 and b.p2p_time_us == 200.0 and b.peers == [1]
    # step 1000 µs, compute 300: bubble = 1 - 300/1000 = 0.7; busy = compute + send 500: idle = 0.5
    assert b.step_time_us == 1000.0 and b.compute_us == 300.0
    assert b.bubble_ratio == pytest.approx(0.7) and b.idle_ratio == pytest.approx(0.5)


def test_sendrecv_in_a_big_group_is_not_pipeline(tmp_path):
    # SendRecv kernels used for all_to_all among 8 ranks (as in dlrm): no pipeline fact
    ctxs = pipeline_rank(tmp_path, kind="all_to_all", ranks="[0, 1, 2, 3, 4, 5, 6, 7]", size=8, pg="0")
    assert not [f for f in parallel.cross_rank(digests_of(ctxs), []) if f.kind == "pipeline_bubble"]


@needs_shared()
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name[:40])
def test_every_kineto_trace(path):
    bundle = hermes_kb.load(path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    for f in parallel.cross_rank(digests_of(ctxs), []):
        assert f.kind == "pipeline_bubble" or f.min_us <= f.mean_us <= f.max_us


@pytest.mark.parametrize("sub", ["param/dlrm_kineto_8rank", "hta/trace_filter"])
def test_multi_rank_jobs(shared, sub):
    bundle = hermes_kb.load(shared / sub)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    comps = by_component(parallel.cross_rank(digests_of(ctxs), []))
    assert set(comps) == {"step_time", "compute", "communication", "non_communication"}
    for f in comps.values():
        assert f.ranks_count == len(bundle.rank_ids) and f.min_us <= f.mean_us <= f.max_us
        assert f.imbalance_ratio == pytest.approx(1 - f.mean_us / f.max_us)
    # dlrm's SendRecv kernels carry no process group (all_to_all among 8 ranks): no pipeline
    assert not [f for f in parallel.cross_rank(digests_of(ctxs), []) if f.kind == "pipeline_bubble"]


def test_rank_without_device_compute_gets_no_bubble(tmp_path):
    # a pipeline rank whose trace holds the send but no compute kernel at all (device data not
    # recorded): its compute is unknown, so no bubble figure, and it is left out of the compute
    # comparison (it is not a rank with zero compute)
    for r in (0, 1):
        ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
        if r == 0:
            ev += compute_kernel(100, 300, corr=1)
        ev += collective(400, 200, ext=10, corr=2, nelems=1024, name="send", ranks="[0, 1]", size=2, pg="2",
                         kernel="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")  # fmt: skip
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    facts = parallel.cross_rank(digests_of(ctxs), [])
    bubbles = {f.rank: f for f in facts if f.kind == "pipeline_bubble"}
    assert set(bubbles) == {0} and bubbles[0].bubble_ratio == pytest.approx(0.7)
    comps = by_component(facts)
    assert "compute" not in comps  # one rank with compute data: nothing to compare
    assert comps["step_time"].ranks_count == 2 and comps["communication"].ranks_count == 2


def test_ascend_pp2_ranks_without_kernel_data(shared):
    # ranks 1 and 3 of the Qwen3 PP=2 run keep only their communication files (README): no
    # bubble for them; ranks 0 and 2 get 1 - computing / step from their kernel_details.csv
    import csv

    root = shared / "ascend/msinsight_st_level2_4rank_qwen3_0.6b_pp2"
    bundle = hermes_kb.load(root)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    facts = parallel.cross_rank(digests_of(ctxs), [])
    bubbles = {f.rank: f for f in facts if f.kind == "pipeline_bubble"}
    assert set(bubbles) == {0, 2}
    for r, b in bubbles.items():
        # step_trace_time.csv: Computing (us) and Stage (us) of the rank, read directly
        path = root / f"rank_{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv"
        with path.open() as fh:
            row = next(csv.DictReader(fh))
        computing = float(row["Computing"])
        assert b.compute_us == pytest.approx(computing, rel=0.02)
    comps = by_component(facts)
    assert set(comps["compute"].per_rank_us) == {0, 2}


def test_pipeline_stage_balance_by_hand(tmp_path):
    # 4 ranks, pipeline groups [0, 2] and [1, 3] (stage 0 = ranks 0, 1; stage 1 = ranks 2, 3), one
    # step [0, 2000); device compute 100, 200, 500, 300 µs.
    #   group [0, 2]: stages 100 and 500 -> mean 300, max 500: imbalance 1 - 300/500 = 0.4,
    #     excess 200 of a 2000 µs step = 0.1; the last stage is the heaviest
    #   group [1, 3]: 200 and 300 -> mean 250: imbalance 1 - 250/300, excess 50, heaviest rank 3
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
           {"pg_name": "5", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": [0, 2]},
           {"pg_name": "6", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": [1, 3]}]  # fmt: skip
    for r, comp in enumerate((100, 200, 500, 300)):
        ev = [X("user_annotation", "ProfilerStep#1", 0, 2000)]
        ev += compute_kernel(100, comp, corr=1)
        ev += collective(1000, 100, ext=10, corr=2, nelems=256, ranks="[0, 1, 2, 3]", size=4)
        write_trace(tmp_path / f"rank{r}.json", ev,
                    distributedInfo={"rank": r, "world_size": 4, "backend": "nccl", "pg_config": pgs})  # fmt: skip
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    from hermes_kb.analyzers.comm import comm

    per_rank = [f for r in sorted(ctxs) for f in comm.per_rank(ctxs[r])]
    stages = {f.rank: f for f in per_rank if f.kind == "pipeline_stage"}
    assert {r: (f.stage_index, f.pp_ranks) for r, f in stages.items()} == {
        0: (0, [0, 2]), 1: (0, [1, 3]), 2: (1, [0, 2]), 3: (1, [1, 3])}
    bal = {tuple(f.pp_ranks): f for f in parallel.cross_rank(digests_of(ctxs), per_rank) if f.kind == "pipeline_stage_balance"}
    a, b = bal[(0, 2)], bal[(1, 3)]
    assert a.per_stage_compute_us == {0: 100.0, 1: 500.0} and a.compared_count == 2
    assert a.imbalance_ratio == pytest.approx(0.4) and a.excess_us == pytest.approx(200.0)
    assert (a.heaviest_stage, a.heaviest_rank, a.lightest_stage, a.last_stage_heaviest) == (1, 2, 0, True)
    assert a.step_us == pytest.approx(2000.0) and a.excess_share_ratio == pytest.approx(0.1)
    assert b.imbalance_ratio == pytest.approx(1 - 250 / 300) and b.heaviest_rank == 3
    # the same from digests as the streamed path's workers send them (pickled, without the frames)
    import pickle

    again = [f for f in parallel.cross_rank(pickle.loads(pickle.dumps(digests_of(ctxs))), per_rank)
             if f.kind == "pipeline_stage_balance"]  # fmt: skip
    assert sorted(f.excess_us for f in again) == pytest.approx([50.0, 200.0])


def test_pipeline_stages_compared_within_a_stage(tmp_path):
    # the three ranks of test_imbalance_by_hand, ranks 0 and 1 in pipeline stage 0, rank 2 in
    # stage 1: stage 1 does other work by design, so the imbalance is found inside stage 0 only
    from hermes_kb.facts.parallel import PipelineStage

    ctxs = three_ranks(tmp_path, compute=(100, 200, 600))
    stages = [
        PipelineStage(rank=r, process_group=f"pp{r % 2}", pp_ranks=[r % 2, 2], stage_index=s, stages_count=2)
        for r, s in ((0, 0), (1, 0), (2, 1))
    ]
    facts = parallel.cross_rank(digests_of(ctxs), stages)
    assert not {c for c in by_component(facts)} - {"step_time"}  # only the step time job-wide
    inside = by_component(facts, pg="pipeline stage 0")
    assert set(inside) == {"compute", "communication", "non_communication"}
    # compute 100 and 200 -> mean 150, max 200 (rank 1); communication 700 and 300 -> max rank 0;
    # non-communication 2000 - comm = 1300 and 1700 -> max rank 1
    assert inside["compute"].max_rank == 1 and inside["compute"].imbalance_ratio == pytest.approx(1 - 150 / 200)
    assert inside["communication"].max_rank == 0 and inside["communication"].imbalance_ratio == pytest.approx(1 - 500 / 700)
    assert inside["non_communication"].max_rank == 1
    assert inside["non_communication"].imbalance_ratio == pytest.approx(1 - 1500 / 1700)
    assert not by_component(facts, pg="pipeline stage 1")  # one rank: nothing to compare
