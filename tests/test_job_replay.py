"""The job graph (analyzers/whatif/job.py): ranks joined at their collectives.

Hand-made GPU traces with known answers. Every rank runs one step: a GEMM of ``c`` µs launched
at 25 µs that starts at 100 µs, then an all-reduce queued behind it on the same stream, and a
stream synchronisation from 90 µs until the all-reduce has ended (+5 µs), the step ending 5 µs
later. The all-reduce's transfer takes 200 µs once the last rank has arrived, so with the slowest
rank's GEMM c_max it ends at E = 100 + c_max + 200 on every rank and each step lasts E + 10.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X, needs_shared, write_trace
from hermes_kb.analyzers.whatif import job as jobmod

import hermes_kb
from hermes_kb.analysis.job import job_removed, job_state
from hermes_kb.analysis.rank import analyze_rank
from hermes_kb.analysis.replay import matching_amounts, replay_state
from hermes_kb.analysis.run import analyze_bundle

TRANSFER = 200.0
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"


def rank_events(c: float, c_max: float) -> list[dict]:
    e = 100.0 + c_max + TRANSFER  # the all-reduce ends when the slowest rank's GEMM is done + transfer
    arrive = 100.0 + c
    return [
        X("user_annotation", "ProfilerStep#1", 0, e + 10),
        X("cpu_op", "aten::mm", 20, 20, args={"External id": 1}),
        X("cuda_runtime", "cudaLaunchKernel", 25, 5, args={"External id": 1, "correlation": 1}),
        X("kernel", "void gemm_kernel", 100, c, pid=0, tid=7, args={"correlation": 1, "stream": 7, "device": 0}),
        X("cpu_op", "record_param_comms", 50, 30, args={
            "External id": 2, "Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 20,
            "Out msg nelems": 1 << 20, "Group size": 3, "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2]"}),
        X("cpu_op", "nccl:all_reduce", 55, 20, args={"External id": 3}),
        X("cuda_runtime", "cudaLaunchKernel", 60, 5, args={"External id": 3, "correlation": 2}),
        X("kernel", NCCL, arrive, e - arrive, pid=0, tid=7, args={"correlation": 2, "stream": 7, "device": 0}),
        X("cuda_runtime", "cudaStreamSynchronize", 90, e + 5 - 90),
    ]  # fmt: skip


def job_dir(tmp_path, gemms):
    c_max = max(gemms)
    for r, c in enumerate(gemms):
        write_trace(tmp_path / f"rank{r}.json", rank_events(c, c_max),
                    distributedInfo={"rank": r, "world_size": len(gemms), "backend": "nccl"})  # fmt: skip
    return tmp_path


def fact_of(tmp_path, gemms):
    facts = analyze_bundle(hermes_kb.load(job_dir(tmp_path, gemms)), max_workers=1)
    (f,) = [f for f in facts if f.kind == "job_replay"]
    return f


def test_join_reproduces_the_recording_and_prices_the_straggler(tmp_path):
    f = fact_of(tmp_path, (300, 400, 1000))
    assert f.ranks_count == 3 and f.instances_count == 1 and f.unmatched_count == 0
    # every rank's step is E + 10 = 1310 µs, and so is the join's
    assert f.recorded_step_us == pytest.approx(1310.0)
    assert f.modelled_step_us == pytest.approx(1310.0)
    assert f.model_error == pytest.approx(0.0, abs=1e-9)
    # had it never waited, a rank would take 100 + c + 200 + 10
    assert f.free_running_us == pytest.approx({2: 1310.0, 1: 710.0, 0: 610.0})
    assert f.slowest_rank == 2 and f.median_free_us == pytest.approx(710.0)
    # rank 2 at the median rank's pace (its free-running span 710 µs): the job's step is 710 µs
    assert f.straggler_cost_us == pytest.approx(600.0, abs=0.5)
    assert f.gpu_hours_per_1000_steps == pytest.approx(600e-6 * 3 * 1000 / 3600, rel=1e-3)
    assert f.top_holder_rank == 2 and f.top_holder_share_ratio == 1.0 and f.holders_count == {2: 1}
    assert f.group_holder == {"0/all_reduce": 2} and f.group_holder_share == {"0/all_reduce": 1.0}


def test_an_imbalanced_pipeline_names_its_stage(tmp_path):
    """Two stages of one pipeline group (the process-group table names it 'pp'), ranks 0 and 1:
    stage 1's GEMM takes 1,000 µs, stage 0's 300. Each stage's pace is its rank's free-running
    step: 610 and 1,310 µs; at the median of the two (960 µs) the step gets 350 µs shorter."""
    for r, c in enumerate((300, 1000)):
        write_trace(tmp_path / f"rank{r}.json", rank_events(c, 1000),
                    distributedInfo={"rank": r, "world_size": 2, "backend": "nccl",
                                     "pg_config": [{"pg_name": "1", "pg_desc": "pp", "ranks": [0, 1]}]})  # fmt: skip
    facts = analyze_bundle(hermes_kb.load(tmp_path), max_workers=1)
    (f,) = [f for f in facts if f.kind == "job_replay"]
    assert f.holding_stage == 1
    assert f.stage_free_us == pytest.approx({0: 610.0, 1: 1310.0})
    assert f.stage_balance_gain_us == pytest.approx(350.0, abs=0.5)
    assert f.straggler_cost_us == pytest.approx(350.0, abs=0.5)  # two ranks: the same question


def states_and_amounts(tmp_path, gemms):
    bundle = hermes_kb.load(job_dir(tmp_path, gemms))
    states, amounts = {}, {}
    for r in bundle.rank_ids:
        ctx, _ = analyze_rank(bundle[r])
        states[r] = replay_state(ctx.shared)
        amounts[r] = matching_amounts(ctx.shared, "gemm")[0]
    return states, amounts


def test_a_fix_counts_for_what_the_job_gains(tmp_path):
    states, amounts = states_and_amounts(tmp_path, (300, 800, 1000))
    js = job_state(states)
    assert js is not None and js.step_us == pytest.approx(1310.0)
    # the slowest rank's GEMM halved (1000 -> 500): it now arrives first; the next-slowest
    # (800) holds the all-reduce, so the job gains 200 µs, not the 500 its own replay removes
    assert job_removed(js, {2: [(amounts[2], 0.5, False)]}) == pytest.approx(200.0)
    # gone entirely: the same 200 (rank 1 holds)
    assert job_removed(js, {2: [(amounts[2], 1.0, False)]}) == pytest.approx(200.0)
    # on both slow ranks, halved: rank 1 arrives at 500, rank 2 at 600, rank 0 at 400: the last
    # arrival moves from 1100 to 600
    assert job_removed(js, {1: [(amounts[1], 0.5, False)], 2: [(amounts[2], 0.5, False)]}) == pytest.approx(500.0)
    # on a rank that waits: the job sees nothing
    assert job_removed(js, {0: [(amounts[0], 1.0, False)]}) == pytest.approx(0.0)


def test_the_rank_alone_credits_a_waiting_rank(tmp_path):
    """What the issue names: the rank's own replay counts its wait for peers as its own work, so a
    fix on a rank that waits seems to gain."""
    from hermes_kb.analysis.replay import removed_by

    states, amounts = states_and_amounts(tmp_path, (300, 800, 1000))
    # without its GEMM, rank 0's all-reduce starts the rank's launch latency (75 µs, the GEMM's)
    # after its launch at 60 µs: 400 - 135 = 265 µs earlier, and its recorded wait moves with it
    assert removed_by(states[0], amounts[0], 1.0) == pytest.approx(265.0)
    js = job_state(states)
    assert job_removed(js, {0: [(amounts[0], 1.0, False)]}) == pytest.approx(0.0)


def test_a_faster_transfer_shortens_the_instance(tmp_path):
    """A set holding the collective's kernel itself (a faster transfer): the instance's transfer
    shrinks by that share, on every member."""
    bundle = hermes_kb.load(job_dir(tmp_path, (300, 800, 1000)))
    states, amounts = {}, {}
    for r in bundle.rank_ids:
        ctx, _ = analyze_rank(bundle[r])
        states[r] = replay_state(ctx.shared)
        amounts[r] = matching_amounts(ctx.shared, "AllReduce")[0]
    js = job_state(states)
    # rank 2 arrived last, its all-reduce lasted just the transfer (200 µs): halved, 100 µs go
    assert job_removed(js, {2: [(amounts[2], 0.5, False)]}) == pytest.approx(100.0)


def test_steady_state_ignores_where_a_one_step_trace_cuts(tmp_path):
    """A rank that started its step early (it came early to the first collective) shows a longer
    step; the steady join measures the job's period, not that boundary."""
    c_max = 1000.0
    for r, c in enumerate((300, 1000)):
        ev = rank_events(c, c_max)
        if r == 0:  # rank 0's step began 400 µs earlier: everything on its clock is 400 later
            ev = [dict(e, ts=e["ts"] + 400) for e in ev]
            ev[0] = dict(ev[0], ts=0, dur=ev[0]["dur"] + 400)
            ev.append(X("cpu_op", "aten::zeros", 10, 300))
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})
    facts = analyze_bundle(hermes_kb.load(tmp_path), max_workers=1)
    (f,) = [f for f in facts if f.kind == "job_replay"]
    assert f.modelled_step_us == pytest.approx(1310.0, abs=1.0)


def test_forms_reproduce_the_rank_replay(tmp_path):
    """With every collective ending when it ended, a rank's forms give back its recorded span."""
    states, _ = states_and_amounts(tmp_path, (300, 800, 1000))
    js = job_state(states)
    for r, f in js.forms.items():
        spans = jobmod.recorded_spans(js.job, {r: f} | {k: v for k, v in js.forms.items() if k != r})
        assert spans[r] == pytest.approx(1310.0)


@needs_shared()
def test_dlrm_join_reproduces_its_spans(shared):
    facts = analyze_bundle(hermes_kb.load(shared / "param" / "dlrm_kineto_8rank"))
    (f,) = [f for f in facts if f.kind == "job_replay"]
    assert f.ranks_count == 8 and f.instances_count == 8 and f.unmatched_count == 0
    assert f.chain_ranks_count == 0
    # the slowest rank's free-running span is the steady join's step: one barrier per step
    assert f.modelled_step_us == pytest.approx(f.slowest_free_us)
    assert 0 <= f.straggler_cost_us <= f.slowest_free_us - f.median_free_us + 1e-6
    # rank 1 waited 7.6 ms in its first all-to-all (3.1 -> 10.7 ms) for the others; the kernels
    # after it on the compute stream waited for it through an event, not for their launch, so
    # free of that wait rank 1's step loses most of it (it kept all of it when a kernel's lag
    # after its launch was taken as launch latency whatever held it)
    free = {int(k): v for k, v in f.free_running_us.items()}
    assert free[1] < 19901.0 - 5000.0
    assert np.isfinite(f.model_error)


def test_report_states_the_job(tmp_path):
    from hermes_kb.advisor.run import advise_bundle

    rep = advise_bundle(hermes_kb.load(job_dir(tmp_path, (300, 400, 1000))))
    assert rep.job is not None
    assert rep.job.slowest_rank == 2 and rep.job.straggler_cost_us == pytest.approx(600.0, abs=0.5)
    assert "Rank 2 is the slowest" in rep.job.statement and "0.60 ms shorter" in rep.job.statement
    from hermes_kb.render.report import render_markdown

    md = render_markdown(rep)
    assert "rank 2, which sets the job's pace" in md and "The job: its 3 ranks" in md


def test_a_spilled_state_keeps_its_part_of_the_job(tmp_path):
    """The streamed path writes replay states to disk (numbers only) and reads them back: the
    job's join from them equals the one from the states in memory."""
    from hermes_kb.analysis.replay_store import SpilledReplay, pack

    states, amounts = states_and_amounts(tmp_path, (300, 800, 1000))
    spilled = SpilledReplay()
    try:
        for r, st in states.items():
            spilled.put(r, pack(st))
        back = {r: spilled[r] for r in spilled}
        assert all(b.job is not None for b in back.values())
        js, js2 = job_state(states), job_state(back)
        assert js2.step_us == pytest.approx(js.step_us)
        assert job_removed(js2, {2: [(back[2].amounts.get("device_compute", amounts[2]), 0.5, False)]}) == \
            pytest.approx(job_removed(js, {2: [(states[2].amounts.get("device_compute", amounts[2]), 0.5, False)]}))
    finally:
        spilled.close()


def test_a_failing_join_costs_the_job_view_not_the_report(tmp_path, monkeypatch):
    """A bug in the join must not take the report with it: findings keep the median rank's gain and
    the report says why."""
    import importlib

    from hermes_kb.advisor.run import advise_bundle

    diag = importlib.import_module("hermes_kb.advisor.diagnose")  # the package's name is the function

    def broken(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(diag, "job_state", broken)
    rep = advise_bundle(hermes_kb.load(job_dir(tmp_path, (300, 400, 1000))))
    assert all(f.job is None for f in rep.findings)
    assert any("could not be joined" in w and "injected" in w for w in rep.warnings)
    assert rep.job is not None  # the job_replay fact is the analyzer's, guarded there
