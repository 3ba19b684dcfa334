"""``--sample K`` (hermes_kb/scale/sample.py): the cheap first pass and the choice of ranks."""

from __future__ import annotations

import gzip
import json

import pytest

from hermes_kb.scale.sample import FirstLook, choose, first_look, sample_notes, uncovered_domains

from conftest import SHARED, X, write_trace

DLRM = SHARED / "param" / "dlrm_kineto_8rank"


def _look(rank: int, step_ms: float | None, domains=()) -> FirstLook:
    return FirstLook(path=f"rank{rank}.json", rank=rank, step_us=None if step_ms is None else step_ms * 1e3,
                     steps=3, domains=list(domains))  # fmt: skip


def test_first_look_reads_step_times_rank_and_process_groups(tmp_path):
    events = [X("user_annotation", "ProfilerStep#4", 100, 30), X("user_annotation", "ProfilerStep#5", 130, 50),
              X("cpu_op", "aten::mm", 110, 5), X("kernel", "ProfilerStep#9-ish kernel", 120, 7),
              X("gpu_user_annotation", "ProfilerStep#4", 105, 40)]  # the device's copy of a step: not counted
    dist = {"rank": 5, "world_size": 8, "pg_config": [{"pg_name": "0", "ranks": [0, 1, 2, 3, 4, 5, 6, 7]},
                                                      {"pg_name": "1", "ranks": [4, 5]}, {"ranks": [5]}]}  # fmt: skip
    path = write_trace(tmp_path / "t.json.gz", events, gz=True, distributedInfo=dist)
    look = first_look(str(path))
    assert look.rank == 5 and look.steps == 2
    assert look.step_us == pytest.approx((30 + 50) / 2)
    assert look.domains == [tuple(range(8)), (4, 5)]  # a one-rank group is no domain


def test_first_look_of_a_damaged_file_is_a_look_with_its_error(tmp_path):
    bad = tmp_path / "rank3.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [1, 2'))
    look = first_look(str(bad))
    assert look.rank == 3 and look.step_us is None and look.error


@pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/data is absent (outside the project's CI)")
def test_first_look_on_a_real_rank_matches_its_profiler_step():
    path = sorted(DLRM.iterdir())[2]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    durs = [e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    look = first_look(str(path))
    assert look.rank == doc["distributedInfo"]["rank"] == 2
    assert look.step_us == pytest.approx(sum(durs) / len(durs))


def test_choice_takes_slowest_fastest_then_every_domain_then_slowest():
    # 8 ranks in two tensor-parallel groups; rank 6 slowest, rank 1 fastest, both outside group (2, 3)
    times = {0: 10.0, 1: 8.0, 2: 9.0, 3: 9.5, 4: 11.0, 5: 12.0, 6: 20.0, 7: 10.5}
    groups = [(0, 1), (2, 3), (4, 5), (6, 7)]
    looks = [_look(r, t, [g for g in groups if r in g]) for r, t in times.items()]
    picked = dict(choose(looks, 5))
    assert set(picked) == {6, 1, 3, 5, 4}  # slowest, fastest, (2,3) via 3, (4,5) via 5, then next slowest 4
    assert "slowest" in picked[6] and "fastest" in picked[1] and "[2,3]" in picked[3]
    assert uncovered_domains(looks, list(picked)) == []


def test_a_sample_smaller_than_the_domains_says_which_are_left():
    looks = [_look(r, 10.0 + r, [(r - r % 2, r - r % 2 + 1)]) for r in range(8)]
    chosen = choose(looks, 2)
    assert [i for i, _ in chosen] == [0, 7]  # slowest (7) and fastest (0)
    notes = sample_notes(looks, chosen)
    assert notes[0].startswith("sampled 2 of 8 ranks")
    assert "2 process group(s) have no sampled rank" in " ".join(notes)  # (2,3) and (4,5)
    assert any("full pass would add" in n and "other 6 ranks" in n for n in notes)
    mean_ms = sum(10.0 + r for r in range(8)) / 8
    assert f"mean step {mean_ms:,.3f} ms" in notes[1]


def test_ranks_without_step_times_fill_the_sample_last():
    looks = [_look(0, None), _look(1, 5.0), _look(2, None)]
    assert [i for i, _ in choose(looks, 2)] == [0, 1]
    assert [i for i, _ in choose(looks, 1)] == [1]
