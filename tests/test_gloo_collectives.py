"""Collectives gloo ran on a CPU-only trace (issue 32): each ``gloo:*`` span joined with the
``c10d::`` operator that issued it, measured as communication (comm_stats, the program's
communication phase) and read by the small-message cases.

The hand-made trace's expected values are worked out in the comments; the recorded zoo run is
checked against the model's own parameter count."""

from __future__ import annotations

from pathlib import Path

import pytest

import hermes_kb
from conftest import ROOT, X, write_trace
from hermes_kb.analysis.rank import analyze_rank
from hermes_kb.trace.kineto.joins import _elements

GLOO = {"backend": "gloo", "rank": 0, "world_size": 2, "pg_count": 1,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 2,
                       "ranks": [0, 1]}]}  # fmt: skip
BUCKET = {"Input Dims": [[[1000]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}
SCALAR = {"Input Dims": [[[]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}


def _step(t0: float, n: int) -> list[dict]:
    """One step of 2,000 µs on thread 1: a backward operator [100, 700) in which DDP's reducer
    issues a bucket of 1,000 floats at 600 (gloo runs it on thread 2 over [660, 1060): hidden by
    the backward until 700, then 360 µs waited for), then a blocking dist.all_reduce of one float
    issued at 1100 (c10d op [1100, 1140); gloo's thread 3 runs it over [1150, 1450), 300 µs with no
    operator on thread 1), then aten::add [1500, 1600)."""
    t = t0
    return [
        X("user_annotation", f"ProfilerStep#{n}", t, 2000),
        X("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", t + 100, 600),
        X("cpu_op", "c10d::allreduce_", t + 600, 50, args=BUCKET),
        X("user_annotation", "gloo:all_reduce", t + 660, 400, tid=2, args={"Input type": ["float"]}),
        X("cpu_op", "c10d::allreduce_", t + 1100, 40, args=SCALAR),
        X("user_annotation", "gloo:all_reduce", t + 1150, 300, tid=3, args={"Input type": ["float"]}),
        X("cpu_op", "aten::add", t + 1500, 100),
    ]


@pytest.fixture()
def trace_path(tmp_path) -> Path:
    return write_trace(tmp_path / "gloo.json", _step(0, 1) + _step(2000, 2), distributedInfo=GLOO)


def test_each_gloo_span_is_joined_with_the_op_that_issued_it(trace_path):
    (t,) = hermes_kb.load(trace_path)
    c = t.collectives
    assert c["source"].astype(str).tolist() == ["host"] * 4
    assert c["kind"].astype(str).tolist() == ["all_reduce"] * 4
    assert c["ts"].tolist() == [660.0, 1150.0, 2660.0, 3150.0]
    assert c["dur"].tolist() == [400.0, 300.0, 400.0, 300.0]
    assert c["in_bytes"].tolist() == [4000, 4, 4000, 4]  # 1,000 floats; one float
    ops = t.cpu_ops
    assert ops["ts"].to_numpy()[c["cpu_idx"].to_numpy()].tolist() == [600.0, 1100.0, 2600.0, 3100.0]
    assert c["pg_name"].astype(str).tolist() == ["0"] * 4 and c["group_size"].tolist() == [2] * 4


def test_exposed_time_and_scalar_messages(trace_path):
    _, facts = analyze_rank(hermes_kb.load(trace_path)[0])
    (s,) = [f for f in facts if f.kind == "comm_stats"]
    # per step: bucket 400 µs of which 360 after the backward; scalar 300 µs, all exposed
    assert (s.collectives_count, s.time_us, s.exposed_us) == (4, 1400.0, 1320.0)
    assert (s.scalar_messages_count, s.bulk_messages_count, s.scalar_per_step_count) == (2, 2, 1.0)
    assert s.scalar_exposed_us == 600.0 and s.scalar_exposed_share_ratio == pytest.approx(600 / 4000)
    assert s.source == "host" and s.group_size_count == 2
    (m,) = [f for f in facts if f.kind == "comm_summary"]
    assert (m.comm_time_us, m.exposed_us, m.analysed_us) == (1400.0, 1320.0, 4000.0)


def test_the_wait_for_the_threads_own_collectives_is_its_communication_phase(trace_path):
    _, facts = analyze_rank(hermes_kb.load(trace_path)[0])
    p = next(f for f in facts if f.kind == "program_phases" and f.step == 1)
    # [700, 1060) waiting for the bucket, the c10d op [1100, 1140), [1150, 1450) waiting for the scalar
    assert p.communication_us == pytest.approx(360 + 40 + 300)
    assert p.backward_us == pytest.approx(600) and "gloo_spans" in p.sources


def test_a_span_is_not_joined_with_an_op_issued_after_it(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000),
          X("user_annotation", "gloo:all_reduce", 100, 200, tid=2, args={"Input type": ["float"]}),
          X("cpu_op", "c10d::allreduce_", 400, 20, args=SCALAR),
          X("user_annotation", "gloo:all_reduce", 450, 100, tid=2, args={"Input type": ["float"]})]  # fmt: skip
    (t,) = hermes_kb.load(write_trace(tmp_path / "t.json", ev, distributedInfo=GLOO))
    c = t.collectives
    assert c["cpu_idx"].tolist() == [-1, 0] and c["in_bytes"].tolist() == [-1, 4]


@pytest.mark.parametrize(("dims", "types", "n"), [
    ("[[[2, 3], [4]]]", '["TensorList"]', 10), ("[[5, 2]]", '["float"]', 10), ("[[[]]]", '["TensorList"]', 1),
    ("[]", '["TensorList"]', None), ("", "", None), ("[[[-1]]]", '["TensorList"]', None),
])  # fmt: skip
def test_elements_of_an_operators_first_argument(dims, types, n):
    assert _elements(dims, types) == n


RECORDED = ROOT / "benchmarks/scenarios/recorded/dist_metric_allreduce/bad"


def test_the_recorded_ddp_bucket_holds_every_parameter_of_the_model():
    # the scenario's MLP: 4 Linear(256, 256) and a Linear(256, 10): 4 x (65,536 + 256) + 2,570
    params = 4 * (256 * 256 + 256) + 256 * 10 + 10
    for r in (0, 1):
        (t,) = hermes_kb.load(RECORDED / f"rank{r}.capture-profile.json.gz")
        sizes = t.collectives["in_bytes"].tolist()
        assert sizes.count(4 * params) == 6  # one bucket in each of the 6 profiled steps
        assert sizes.count(4) == 30  # five scalar metrics a step


def test_a_groups_exposed_time_counts_overlapping_spans_once(tmp_path):
    # two buckets issued at 50 and 60, run by gloo's two threads over [100, 500) and [300, 700)
    # while thread 1 runs nothing: 600 µs waited, not 800
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000),
          X("cpu_op", "c10d::allreduce_", 50, 5, args=BUCKET), X("cpu_op", "c10d::allreduce_", 60, 5, args=BUCKET),
          X("user_annotation", "gloo:all_reduce", 100, 400, tid=2, args={"Input type": ["float"]}),
          X("user_annotation", "gloo:all_reduce", 300, 400, tid=3, args={"Input type": ["float"]}),
          X("cpu_op", "aten::add", 800, 100)]  # fmt: skip
    _, facts = analyze_rank(hermes_kb.load(write_trace(tmp_path / "t.json", ev, distributedInfo=GLOO))[0])
    (s,) = [f for f in facts if f.kind == "comm_stats"]
    assert (s.time_us, s.exposed_us) == (800.0, 600.0)
