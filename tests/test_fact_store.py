"""A streamed job's facts kept on disk (hermes_kb/facts/store.py). The reference for every
number is the in-memory path the store replaces: the typed facts renumbered and shifted in
place (fact_shift.shift_facts) and flattened by kb.engine.prepare."""

from __future__ import annotations

import copy

import pytest

from hermes_kb.facts.shift import shift_facts
from hermes_kb.facts.store import SpilledFacts, of_kinds
from hermes_kb.facts.base import Evidence
from hermes_kb.facts.steps import AnalyzerError, StepTime
from hermes_kb.kb.matches import prepare

from conftest import SHARED

DLRM = SHARED / "param" / "dlrm_kineto_8rank"
needs_dlrm = pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/data is absent (outside the project's CI)")


def _step(rank: int | None, step: int, start: float, dur: float) -> StepTime:
    return StepTime(rank=rank, step=step, evidence=Evidence(time_ranges_us=[(start, start + dur)], events=["ProfilerStep#3"]),
                    start_us=start, end_us=start + dur, duration_us=dur, cpu_duration_us=dur - 1.0)  # fmt: skip


def _rank_facts(rank: int) -> list:
    a = _step(rank, 3, 0.00005, 10.0)  # an absolute time below 1e-4: sanitised only after the shift
    return [a, _step(rank, 4, 10.0, 12.5), copy.deepcopy(a),  # the same fact twice: one flat copy
            AnalyzerError(rank=rank, analyzer="io", message=f"boom on {rank}"),
            AnalyzerError(rank=None, analyzer="loader", message="same")]  # a rank-less fact: one copy for the job


def _reference(blocks: list[tuple[list, int, int, float]]) -> list:
    """What rank_stream did before the store: renumber, shift, concatenate in placement order."""
    out = []
    for facts, was, rank, delta in blocks:
        facts = copy.deepcopy(facts)
        for f in facts:
            if f.rank == was:
                f.rank = rank
        shift_facts(facts, delta)
        out.extend(facts)
    return out


def test_spilled_facts_read_back_renumbered_shifted_and_flattened_as_in_memory():
    # two ranks arriving in the opposite order to their placement, analysed as rank 0 each
    first, second = _rank_facts(0), _rank_facts(0)
    store = SpilledFacts()
    b_second = store.spill(copy.deepcopy(second))
    b_first = store.spill(copy.deepcopy(first))
    store.place(b_first, 0, 0, 0.0)
    store.place(b_second, 0, 1, 250.0)
    cross = [AnalyzerError(rank=None, analyzer="parallel", message="job-wide")]
    store.add(cross)
    ref = _reference([(first, 0, 0, 0.0), (second, 0, 1, 250.0)]) + cross

    assert len(store) == len(ref) == 11
    assert [f.model_dump_json() for f in store] == [f.model_dump_json() for f in ref]
    assert [store[i].model_dump_json() for i in (0, 5, -1)] == [ref[i].model_dump_json() for i in (0, 5, -1)]
    assert store[5].start_us == pytest.approx(250.00005) and store[5].rank == 1
    assert store[5].evidence.time_ranges_us == [(250.00005, 260.00005)]

    originals: dict = {}
    flat = prepare(ref, originals)
    assert store.flats_of({"step_time", "analyzer_error"}) == flat and store.n_ids == len(flat)
    # by rank, and a group of ranks at a time (the rank-less ones last), as the engine reads them
    assert store.rank_flats(1) == [f for f in flat if f.get("rank") == 1]
    assert store.rank_flats(None) == [f for f in flat if "rank" not in f]
    assert list(store.flat_groups(1)) == [(frozenset([0]), [f for f in flat if f.get("rank") == 0]),
                                         (frozenset([1]), [f for f in flat if f.get("rank") == 1]),
                                         (frozenset([None]), [f for f in flat if "rank" not in f])]  # fmt: skip
    assert [(sorted(r), len(g)) for r, g in store.flat_groups(64)] == [([0, 1], 6), ([None], 2)]
    # the duplicate is flattened once; the rank-less fact of both ranks once for the job
    assert len(flat) == 8 and flat[4]["rank"] == 1 and flat[4]["step"] == 3
    # a flat start below 1e-4 is 0.0; shifted first, it is not
    assert [f["start_us"] for f in flat if f["kind"] == "step_time" and f.get("rank") is not None] == \
        [0.0, 10.0, 250.00005, 260.0]  # fmt: skip
    by_id = store.by_id()
    assert {i: by_id[i].model_dump_json() for i in range(len(flat))} == \
        {i: f.model_dump_json() for i, f in originals.items()}  # fmt: skip

    # the kinds asked for, duplicates kept, in order; a list filtered the same way
    want = ("analyzer_error",)
    expect = [(0, "boom on 0"), (None, "same"), (1, "boom on 0"), (None, "same"), (None, "job-wide")]
    assert [(f.rank, f.message) for f in store.of_kinds(want)] == expect
    assert [(f.rank, f.message) for f in of_kinds(ref, want)] == expect

    # a fact set by _id (a replay) is what is read back; an _id past the measured ones is held aside
    by_id[4] = _step(1, 3, 1.0, 99.0)
    assert by_id[4].duration_us == 99.0 and store[5].duration_us == 99.0
    by_id[len(flat)] = cross[0]
    assert by_id[len(flat)] == cross[0] and len(by_id) == len(flat) + 1
    with pytest.raises(KeyError):
        by_id[len(flat) + 1]
    store.close()


def test_the_store_holds_no_typed_fact_of_a_spilled_rank():
    store = SpilledFacts()
    block = store.spill(_rank_facts(3))
    store.place(block, 3, 3, 0.0)
    assert not store._held and not store._cache
    assert store._file.tell() > 0
    list(store)
    assert len(store._cache) == len(store)  # decoded on the way, kept only in the bounded cache
    store.close()


@needs_dlrm
def test_a_report_from_the_store_equals_one_from_the_fact_list():
    from hermes_kb.scale import jobs
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.render.details import with_details
    from hermes_kb.trace import discover

    job = jobs.analyse_files(discover(str(DLRM)), workers=1)
    try:
        listed = list(job.facts)
        a = advise_bundle_full(job.bundle, facts=job.facts, replay=job.replay)
        b = advise_bundle_full(job.bundle, facts=listed, replay=job.replay)
    finally:
        job.replay.close()
    assert a.report.findings, "DLRM's 8 ranks have findings"
    assert with_details(a.report, a.facts).model_dump_json() == with_details(b.report, b.facts).model_dump_json()


@needs_dlrm
@pytest.mark.parametrize("engine", ["durable", "python"])
def test_inference_a_group_of_ranks_at_a_time_equals_one_on_every_fact(monkeypatch, engine):
    # groups of 3 of the 8 DLRM ranks (plus the job-wide facts): the matches of the whole list
    from hermes_kb.scale import jobs
    from hermes_kb.advisor.knowledge import knowledge_base
    from hermes_kb.kb import matches
    from hermes_kb.kb.engine import durable_available, infer
    from hermes_kb.trace import discover

    if engine == "durable" and not durable_available():
        pytest.skip("durable-rules is not importable here")
    monkeypatch.setattr(matches, "PARTITION_RANKS", 3)
    kb = knowledge_base(None)
    job = jobs.analyse_files(discover(str(DLRM)), workers=1)
    job.replay.close()
    spilled = infer(kb, job.facts, engine)
    whole = infer(kb, list(job.facts), engine)
    assert len(list(job.facts.flat_groups(3))) == 4  # ranks 0-2, 3-5, 6-7, then the rank-less facts
    assert spilled.cases and [m.key() for m in spilled.cases] == [m.key() for m in whole.cases]
    assert [m.bindings for m in spilled.cases] == [m.bindings for m in whole.cases]
    assert [m.bindings for m in spilled.bottlenecks] == [m.bindings for m in whole.bottlenecks]
    # what the advisor reads for every rank is there; a rank's facts as the whole list has them
    kinds = {f["kind"] for f in spilled.facts}
    assert {"step_time", "step_breakdown", "bottleneck"} <= kinds and "whatif" not in kinds
    assert spilled.rank_facts(5) == whole.rank_facts(5)
