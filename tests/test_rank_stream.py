"""Per-rank work streams (hermes_kb/scale/stream.py): a rank read, analysed, digested and
released, the cross-rank stage on the digests. The reference is the in-memory path
(trace.load + analysis.analyze_with_replay), which holds every rank's frames at once."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hermes_kb.scale import jobs
from hermes_kb.analysis.run import analyze_with_replay
from hermes_kb.analyzers.context import StepWindow
from hermes_kb.analyzers.comm.digest import COLLECTIVE_COLUMNS, RankDigest
from hermes_kb.facts.shift import shift_facts
from hermes_kb.facts.base import Evidence
from hermes_kb.facts.steps import StepTime
from hermes_kb.trace import discover, load

from conftest import SHARED

DLRM = SHARED / "param" / "dlrm_kineto_8rank"
needs_dlrm = pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/data is absent (outside the project's CI)")


def _dumps(facts) -> list[str]:
    return [f.model_dump_json() for f in facts]


def _link_ranks(tmp_path: Path, n: int) -> list[Path]:
    files = sorted(DLRM.iterdir())[:n]
    out = []
    for f in files:
        (tmp_path / f.name).symlink_to(f)
        out.append(tmp_path / f.name)
    return out


@needs_dlrm
def test_streamed_facts_equal_the_in_memory_analysis():
    facts, replay = analyze_with_replay(load(str(DLRM), max_workers=1), max_workers=1)
    job = jobs.analyse_files(discover(str(DLRM)), workers=2)
    try:
        assert _dumps(job.facts) == _dumps(facts)
        assert sorted(job.replay) == sorted(replay)
        # a replay state read back from its spill file is the rank's model
        assert len(job.replay[3].amounts) == len(replay[3].amounts)
    finally:
        job.replay.close()
    assert job.bundle.rank_ids == list(range(8))
    assert not job.bundle.problems


@needs_dlrm
def test_a_damaged_rank_is_reported_by_name_and_the_rest_analysed(tmp_path):
    _link_ranks(tmp_path, 3)
    bad = tmp_path / "worker7_step_12.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    job = jobs.analyse_files(discover(str(tmp_path)), workers=2)
    job.replay.close()
    assert job.bundle.rank_ids == [0, 1, 2]
    (problem,) = job.bundle.problems
    assert problem.path == str(bad) and str(bad) in problem.message
    assert {f.rank for f in job.facts if f.rank is not None} == {0, 1, 2}


_KILL_RANK1 = """
import json, os, signal, sys
from hermes_kb.core import workers
from hermes_kb.scale import local

assert workers.can_fork()
files, real, parent = sys.argv[1:], local.analyse_rank_file, os.getpid()

def dies_on_rank_1(path):
    if path == files[1] and os.getpid() != parent:  # in a forked worker, never this process
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path)

local.analyse_rank_file = dies_on_rank_1
job = local.analyse_local(files, workers=2)
job.replay.close()
print(json.dumps({"ranks": job.bundle.rank_ids, "problems": [[p.path, p.message] for p in job.bundle.problems]}))
"""


@needs_dlrm
def test_a_worker_that_dies_costs_its_rank_only(tmp_path):
    # in a fresh process: threads other tests leave behind (Dask's) make forking unsafe here, and
    # the ranks then run in-process, where the kill would end the test run itself
    files = [str(p) for p in _link_ranks(tmp_path, 3)]
    out = subprocess.run([sys.executable, "-c", _KILL_RANK1, *files], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ranks"] == [0, 2]
    ((path, message),) = got["problems"]
    assert path == files[1] and "SIGKILL" in message


def test_digest_shift_moves_every_absolute_time_and_nothing_else():
    row = {"pg": "0", "pg_ranks": "[0,1]", "kind": "all_reduce", "source": "kernel", "step": 3, "ts": 100.0,
           "dur": 20.0, "seq": 7, "n": 2, "name": "nccl:all_reduce", "msg_bytes": 1024}
    coll = pd.DataFrame([{c: row[c] for c in COLLECTIVE_COLUMNS}])
    d = RankDigest(rank=1, windows=[StepWindow(3, 50.0, 150.0, 140.0)], span=(0.0, 200.0), collectives=coll,
                   components=None, device_compute=True)  # fmt: skip
    s = d.shifted(1000.0)
    assert s.windows == [StepWindow(3, 1050.0, 1150.0, 1140.0)]
    assert s.span == (1000.0, 1200.0)
    assert s.collectives["ts"].tolist() == [1100.0] and s.collectives["dur"].tolist() == [20.0]
    assert d.collectives["ts"].tolist() == [100.0]  # the original is left as it was


def test_fact_shift_moves_a_shared_sub_model_once():
    ev = Evidence(time_ranges_us=[(10.0, 30.0)])
    a = StepTime(rank=0, step=1, evidence=ev, start_us=10.0, end_us=30.0, duration_us=20.0, cpu_duration_us=20.0)
    b = StepTime(rank=0, step=2, evidence=ev, start_us=30.0, end_us=55.0, duration_us=25.0, cpu_duration_us=25.0)
    shift_facts([a, b], 5.0)
    assert ev.time_ranges_us == [(15.0, 35.0)]
    assert (a.start_us, a.end_us, a.duration_us) == (15.0, 35.0, 20.0)
    assert (b.start_us, b.end_us, b.duration_us) == (35.0, 60.0, 25.0)


@needs_dlrm
def test_ranks_without_a_rank_number_are_numbered_by_file_order(tmp_path):
    # distributedInfo removed and file names without a rank: numbered 0, 1 in file order
    for i, src in enumerate(sorted(DLRM.iterdir())[:2]):
        doc = json.loads(gzip.decompress(src.read_bytes()))
        doc.pop("distributedInfo")
        (tmp_path / f"trace_{'ab'[i]}.json").write_text(json.dumps(doc))
    ref = load(str(tmp_path), max_workers=1)
    job = jobs.analyse_files(discover(str(tmp_path)), workers=1)
    job.replay.close()
    assert job.bundle.rank_ids == ref.rank_ids == [0, 1]
    assert job.bundle.warnings == ref.warnings
    assert _dumps(job.facts) == _dumps(analyze_with_replay(ref, max_workers=1)[0])


@needs_dlrm
def test_a_replay_state_read_back_replays_as_the_original():
    import numpy as np

    from hermes_kb.analysis.rank import analyze_rank
    from hermes_kb.analyzers.whatif.replay import removed_together
    from hermes_kb.analysis.replay_store import SpilledReplay, pack

    trace = load(str(sorted(DLRM.iterdir())[0]), max_workers=1)[0]
    ctx, _ = analyze_rank(trace)
    model, amounts = ctx.shared["whatif_model"], ctx.shared["whatif_amounts"]
    from hermes_kb.analysis.replay import ReplayState

    store = SpilledReplay()
    try:
        store.put(0, pack(ReplayState(model, amounts, ctx.shared["whatif_drops"])))
        back = store[0]
    finally:
        store.close()
    assert back.drop_waits == ctx.shared["whatif_drops"]
    assert sorted(back.amounts) == sorted(amounts)
    for name in ("order", "lane_prev", "xstart", "launch", "launch_off", "xend", "xend_off", "anchors"):
        assert getattr(back.model, name) == getattr(model, name), name
    assert np.array_equal(back.model.slack, model.slack, equal_nan=True)
    assert np.array_equal(back.model.own, model.own) and back.model.last_end == model.last_end
    target = sorted(amounts)[0]
    assert removed_together(back.model, [(back.amounts[target], 0.5, False)]) == \
        removed_together(model, [(amounts[target], 0.5, False)])  # fmt: skip
