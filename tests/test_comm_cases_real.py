"""Communication cases C-COMM-020 / 021 on the real trace they were written from: the Qwen3-0.6B
PP=2 Ascend set (MindSpeed, distributed optimizer, tied embeddings). Skips without ../shared."""

from __future__ import annotations

import pytest

import hermes_kb
from conftest import needs_shared, SHARED

PP2 = SHARED / "ascend/msinsight_st_level2_4rank_qwen3_0.6b_pp2"
# Qwen3-0.6B: vocabulary 151936, hidden 1024; the tied embedding's gradient in fp32
EMBEDDING_GRAD_BYTES = 151936 * 1024 * 4  # 622_329_856


@pytest.fixture(scope="module")
def report():
    return hermes_kb.advise(PP2)


@needs_shared()
def test_tied_embedding_allreduce_found_on_the_ranks_that_arrive_last(report):
    f = next(x for x in report.findings if x.case_id == "C-COMM-020")
    # ranks 0 and 1 (first stage) arrive last at the embedding all-reduce; ranks 2 and 3 wait
    # ~86 ms in it for them, which is the stage imbalance, not this transfer
    assert f.ranks == [0, 1]
    c = next(e for e in f.evidence if e.fact == "comm_stats" and e.values.get("collective") == "all_reduce")
    assert c.values["mean_message_bytes"] == EMBEDDING_GRAD_BYTES
    assert c.values["per_step_count"] == 1.0
    assert report.findings[0].case_id != "C-COMM-020"


@needs_shared()
def test_exposed_parameter_all_gather_of_the_distributed_optimizer(report):
    f = next(x for x in report.findings if x.case_id == "C-COMM-021")
    c = next(e for e in f.evidence if e.fact == "comm_stats" and e.values.get("collective") == "all_gather")
    assert c.values["mean_message_bytes"] >= 1024 * 1024 and c.values["exposed_ratio"] == pytest.approx(1.0)
    assert report.findings[0].case_id != "C-COMM-021"
