"""Cases checked on the real traces they were fixed after (issue 20): C-PAR-003 on the Qwen3 PP=2
Ascend set, C-COMM-004 on a single rank's trace. The numbers compared are read from the raw files."""

from __future__ import annotations

import csv

import pytest

import hermes_kb
from conftest import needs_shared, SHARED

PP2 = SHARED / "ascend/msinsight_st_level2_4rank_qwen3_0.6b_pp2"
MI300 = SHARED / "tracelens/mi300__resnet_act_checkpoint.json.gz"


@needs_shared()
def test_pipeline_case_fires_on_the_pp2_run_without_host_data():
    rep = hermes_kb.advise(PP2)
    f = next(x for x in rep.findings if x.case_id == "C-PAR-003")
    assert f.ranks == [0, 2]  # ranks 1 and 3 keep no device compute data: no bubble, no match
    p = next(e for e in f.evidence if e.fact == "pipeline_bubble")
    with (PP2 / f"rank_{p.scope.split()[1]}_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert p.values["bubble_ratio"] == pytest.approx(1 - float(row["Computing"]) / float(row["Stage"]), abs=0.01)
    assert "host side was not recorded" in f.explanation


@needs_shared()
def test_low_bandwidth_case_does_not_claim_peers_were_on_time_from_one_rank():
    rep = hermes_kb.advise(MI300)
    f = next(x for x in rep.findings if x.case_id == "C-COMM-004")
    assert "cannot exclude" in f.explanation and "late for every one of them" in f.explanation
    c = next(e for e in f.evidence if e.fact == "comm_stats")
    assert c.values["best_busbw_to_peak_ratio"] <= 0.2
