"""The CLI's path (hermes_kb/advisor/run.py) gives the library's Report exactly, and keeps the
facts of that same analysis for the HTML report, diff and annotate."""

from __future__ import annotations

from pathlib import Path

import hermes_kb
from conftest import EXAMPLE, SHARED, needs_shared
from hermes_kb.advisor.run import advise_bundle
from hermes_kb.advisor.run import advise_bundle_full, advise_run_dir_full
from hermes_kb.render.details import slow_ranks, with_details
from hermes_kb.advisor.run import advise_run_dir

RUN = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/checkpoint_stalls/bad"


def test_same_report_as_the_library_on_a_trace():
    b = hermes_kb.load(EXAMPLE)
    adv = advise_bundle_full(b)
    assert adv.report.model_dump() == advise_bundle(b).model_dump()
    assert {f.kind for f in adv.facts} >= {"step_time", "critical_path", "step_breakdown"}


def test_same_report_as_the_library_on_a_run_dir():
    adv = advise_run_dir_full(RUN)
    assert adv.report.model_dump() == advise_run_dir(RUN).model_dump()
    assert adv.run is not None and adv.bundle is not None


def test_details_for_a_trace():
    adv = advise_bundle_full(hermes_kb.load(EXAMPLE))
    r = with_details(adv.report, adv.facts)
    (s,) = r.summary
    assert [p.step for p in s.series] == [x.step for x in s.steps]
    assert s.critical_path_ops and s.critical_path_ops[0].name.startswith("enumerate(DataLoader)")
    cp = next(f for f in adv.facts if f.kind == "critical_path")
    assert s.critical_path_us * cp.steps_count == __import__("pytest").approx(cp.path_length_us, rel=1e-6)
    assert adv.report.summary[0].series == []  # the input report is left as it was


@needs_shared()
def test_slow_rank_of_the_8_rank_dlrm():
    adv = advise_bundle_full(hermes_kb.load(SHARED / "param/dlrm_kineto_8rank"))
    found = slow_ranks(adv.facts)
    imb = next(f for f in adv.facts if f.kind == "rank_imbalance" and f.component == "non_communication"
               and f.process_group is None)  # fmt: skip
    top = next(s for s in found if s.source == "rank_imbalance")
    assert top.rank == imb.max_rank and top.domain == "all"
    assert any(s.source == "comm_sync_wait" for s in found)
