"""npu_byte_alignment (analyzers/npu/transfers.py) and C-COMM-005: HCCL transfer tasks judged one by one,
as msprof-analyze's byte-alignment check does, with the cost measured against aligned tasks."""

from __future__ import annotations

import pytest

import hermes_kb
from conftest import SHARED, needs_shared

L1 = SHARED / "ascend/msinsight_pt_text_level1_2rank"
ADVISOR_HTML = SHARED / "ascend_advisor_outputs/advisor_all_l1_rank0.html"

# msprof-analyze 26.2.0's byte-alignment table for rank 0 of the level-1 run (advisor_all_l1_rank0.html):
# op name, total size (B), duration (us), abnormal duration (us)
MSPROF = [("hcom_allReduce__586_0_1", 28647232, 1816.8363, 237.9447),
          ("hcom_allReduce__586_3_1", 17267200, 1204.6041, 159.0632)]  # fmt: skip


def _fact(path, rank):
    return next(f for f in hermes_kb.analyze(path) if f.kind == "npu_byte_alignment" and f.rank == rank)


@needs_shared()
def test_level1_matches_msprof_analyze():
    html = ADVISOR_HTML.read_text()
    for name, size, dur, abnormal in MSPROF:  # the reference really says this
        assert name in html and str(size) in html and f"{abnormal}" in html and f"{dur}" in html
    f = _fact(L1, 0)
    assert f.unaligned_ops_count == 2 and sorted(f.evidence.events) == [m[0] for m in MSPROF]
    assert f.unaligned_time_us == pytest.approx(sum(m[3] for m in MSPROF), abs=0.01)
    # the 4 operations of the step, 14 SDMA transfer tasks each off the chip (msprof's sizes are
    # the two flagged operations' totals)
    assert f.ops_count == 4 and f.tasks_count == 56
    assert f.unaligned_count == 4
    # measured excess: the unaligned tasks are about as fast as the aligned ones beside them
    assert 0 < f.excess_us < 0.1 * f.unaligned_time_us


@needs_shared()
def test_level1_finding_is_low():
    rep = hermes_kb.advise(L1)
    f = next(x for x in rep.findings if x.case_id == "C-COMM-005")
    assert f.severity == "low"
    assert f.removable_us.high < 100.0  # tens of µs, not the collectives' 100 ms of exposed time
    assert "2 of 4 communication operations" in f.explanation


def test_no_task_data_no_fact(tmp_path):
    # a Kineto trace has no HCCL task table
    from conftest import EXAMPLE

    assert not [f for f in hermes_kb.analyze(EXAMPLE) if f.kind == "npu_byte_alignment"]
