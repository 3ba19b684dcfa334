"""The dispatch analyzer: small operators per step and the host time between them.

A hand-made CPU trace with every expected value worked out in the comments, and the recorded
dispatch_tiny_ops scenario with its vectorised twin (benchmarks/scenarios)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analyzers.compute import compute as C
from hermes_kb.analyzers.host import dispatch as D
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, write_trace

SCENARIO = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "recorded" / "dispatch_tiny_ops"


def ctx_of(path):
    return step_context(hermes_kb.load(path)[0])[0]


def op(name, ts, dur, dims, ext):
    return X("cpu_op", name, ts, dur, args={"External id": ext, "Input Dims": dims,
                                             "Input type": ["float"] * len(dims)})  # fmt: skip


def test_largest_input():
    assert D.largest_input("[[16, 80, 16], [], []]") == 16 * 80 * 16
    assert D.largest_input("[[], []]") == 1  # 0-d tensors
    assert D.largest_input("[[4096], [1]]") == 4096
    assert D.largest_input("") == -1
    assert D.largest_input("[null, 3]") == -1


def test_hand_made_steps(tmp_path):
    # Two steps of 1000 µs on one thread.
    # Step 1: three small muls (64 elements, 10 µs each) at 100, 130, 500 -> gaps 20 (counted) and
    #         360 (capped at 200); then a 64x64 = 4096-element add (still small, 10 µs) at 520 after a
    #         10 µs gap; then a linear on 128x64 = 8192 elements (not small) at 600.
    # Step 2: an autograd node with no shapes of its own whose child works on 32 elements (small,
    #         by its callee) at 1100 for 30 µs, then a mul of 64 elements at 1300 (gap 170).
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", "ProfilerStep#2", 1000, 1000),
        op("aten::mul", 100, 10, [[64], [64]], 1),
        op("aten::mul", 130, 10, [[64], [64]], 2),
        op("aten::mul", 500, 10, [[64], [64]], 3),
        op("aten::add", 520, 10, [[64, 64], [64, 64]], 4),
        op("aten::linear", 600, 100, [[128, 64], [64, 64]], 5),
        X("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 1100, 30, args={"External id": 6}),
        op("aten::mul", 1105, 20, [[32], [32]], 7),
        op("aten::mul", 1300, 10, [[64], [64]], 8),
    ]
    f = D.per_rank(ctx_of(write_trace(tmp_path / "t.json", ev)))[0]
    assert f.kind == "operator_dispatch" and f.steps_count == 2
    assert f.ops_count == 7 and f.shaped_ops_count == 7
    assert f.small_ops_count == 6  # all but the linear
    assert f.small_ops_per_step == 3.0
    assert f.small_ops_us == pytest.approx(10 * 4 + 30 + 10)
    # step 1: 20 + 200 (capped 360) + 10; the linear breaks the pair; step 2: 170; none across steps
    assert f.between_small_us == pytest.approx(20 + 200 + 10 + 170)
    assert f.dispatch_us == pytest.approx(80 + 400)
    assert f.dispatch_ratio == pytest.approx(480 / 2000)
    assert f.dispatch_per_op_us == pytest.approx(80.0)
    assert f.evidence.counts["aten::mul"] == 4


def test_views_are_small_whatever_their_input(tmp_path):
    # One step of 1000 µs. A loop over groups of a (16, 80, 16) input: select (a view of the
    # 20480-element tensor, 4 µs, calling as_strided), then a mul on the (16, 16) slice; twice.
    # Views only write a tensor header, so both selects count as small and the gaps around them
    # as dispatch: ops at 100, 110, 130, 140 -> gaps 6, 10, 6 (select 4 µs, mul 10 µs).
    # Then a reshape of the same input that copies (its callee clone works on 20480 elements,
    # 50 µs at 200): not small by the clone, and the gap before it (140+10 -> 200) is not counted.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        op("aten::select", 100, 4, [[16, 80, 16], [], []], 1),
        op("aten::as_strided", 101, 2, [[16, 80, 16], [], [], []], 2),
        op("aten::mul", 110, 10, [[16, 16], [16]], 3),
        op("aten::select", 130, 4, [[16, 80, 16], [], []], 4),
        op("aten::mul", 140, 10, [[16, 16], [16]], 5),
        op("aten::reshape", 200, 50, [[16, 80, 16], []], 6),
        op("aten::clone", 201, 48, [[16, 80, 16]], 7),
    ]
    f = D.per_rank(ctx_of(write_trace(tmp_path / "t.json", ev)))[0]
    assert f.ops_count == 5 and f.small_ops_count == 4
    assert f.small_ops_us == pytest.approx(4 + 10 + 4 + 10)
    assert f.between_small_us == pytest.approx(6 + 10 + 6)


def test_no_shapes_no_fact(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000), X("cpu_op", "aten::mul", 10, 10, args={"External id": 1})]
    assert D.per_rank(ctx_of(write_trace(tmp_path / "t.json", ev))) == []


# bad: 80 groups x (select, mul, add, tanh) forward, their backward, the cat, the per-tensor SGD;
# the 80 selects of the (16, 80, 16) input are views, small whatever the input
@pytest.mark.parametrize("variant,per_step,lo,hi", [("bad", 1222.0, 0.75, 0.9), ("fixed", 30.0, 0.0, 0.5)])
def test_recorded_scenario(variant, per_step, lo, hi):
    f = D.per_rank(ctx_of(SCENARIO / variant / "rank0.capture-profile.json.gz"))[0]
    assert f.small_ops_per_step == per_step
    assert lo <= f.dispatch_ratio <= hi


def test_advise_names_it_first_and_not_on_the_twin():
    bad = hermes_kb.advise(hermes_kb.load(SCENARIO / "bad" / "rank0.capture-profile.json.gz"))
    assert bad.findings[0].case_id == "C-CPU-026"
    s = bad.findings[0].expected_speedup
    # removed 52.83 ms x [0.7, 1.0] of 63.90 ms (82.7%) -> 1/(1 - 0.579) .. 1/(1 - 0.827)
    assert s.model_low == pytest.approx(2.37, abs=0.02) and s.model_high == pytest.approx(5.77, abs=0.03)
    fixed = hermes_kb.advise(hermes_kb.load(SCENARIO / "fixed" / "rank0.capture-profile.json.gz"))
    assert all(f.case_id != "C-CPU-026" for f in fixed.findings)


def optimizer_trace(tmp_path, inner: list[str]):
    # One step [0, 1000); AdamW.step() over [600, 900) = 30% of the step, with the given top-level
    # operators inside (each 20 µs, one child each that must not be counted); one op outside it.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000), X("user_annotation", "Optimizer.step#AdamW.step", 600, 300),
          op("aten::linear", 100, 200, [[64, 64], [64, 64]], 1)]  # fmt: skip
    for i, name in enumerate(inner):
        ev += [op(name, 610 + 30 * i, 20, [[64], [64]], 10 + i), op("aten::empty", 612 + 30 * i, 2, [[64]], 100 + i)]
    return write_trace(tmp_path / "opt.json", ev)


@pytest.mark.parametrize("inner,impl", [
    (["aten::mul_", "aten::lerp_", "aten::addcdiv_"], "for_loop"),
    (["aten::_foreach_mul_", "aten::_foreach_lerp_"], "foreach"),
    (["aten::_fused_adamw_"], "fused"),
])  # fmt: skip
def test_optimizer_step(tmp_path, inner, impl):
    f = next(x for x in D.per_rank(ctx_of(optimizer_trace(tmp_path, inner))) if x.kind == "optimizer_step")
    assert (f.optimizer, f.implementation, f.calls_count) == ("AdamW", impl, 1)
    assert f.optimizer_us == pytest.approx(300.0) and f.optimizer_ratio == pytest.approx(0.3)
    assert f.ops_per_call == len(inner)


def test_no_optimizer_annotation_no_fact(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000), op("aten::mul", 10, 10, [[64]], 1)]
    assert all(f.kind != "optimizer_step" for f in D.per_rank(ctx_of(write_trace(tmp_path / "t.json", ev))))


def test_optimizer_case_on_the_for_loop_recording():
    # AdamW for-loop: 100.68 ms of 143.72 ms (70.05%) -> removes [0.65, 0.95] of it:
    # 1/(1 - 0.455) = 1.84x .. 1/(1 - 0.665) = 2.99x; its fused twin: no finding
    run = SCENARIO.parent / "optimizer_for_loop"
    rep = hermes_kb.advise(hermes_kb.load(run / "bad" / "rank0.capture-profile.json.gz"))
    f = next(x for x in rep.findings if x.case_id == "C-CPU-027")
    assert f.expected_speedup.model_low == pytest.approx(1.84, abs=0.02)
    assert f.expected_speedup.model_high == pytest.approx(2.99, abs=0.02)
    fixed = hermes_kb.advise(hermes_kb.load(run / "fixed" / "rank0.capture-profile.json.gz"))
    assert all(x.case_id != "C-CPU-027" for x in fixed.findings)


def test_elementwise_time_inside_the_optimizer_is_split_out(tmp_path):
    # three element-wise ops inside AdamW.step(), 20 µs each with a 2 µs child: 3 x 18 µs of self
    # time in the optimizer; plus one 10 µs element-wise op (64 elements) before it, outside
    path = optimizer_trace(tmp_path, ["aten::mul_", "aten::lerp_", "aten::addcdiv_"])
    ev = [*json.loads(path.read_text())["traceEvents"], op("aten::add", 400, 10, [[64], [64]], 50)]
    f = next(x for x in C.per_rank(ctx_of(write_trace(tmp_path / "t2.json", ev)))
             if x.kind == "kernel_class_share" and x.kernel_class == "elementwise")  # fmt: skip
    assert f.time_us == pytest.approx(3 * 18 + 10)
    assert f.in_optimizer_us == pytest.approx(54.0) and f.outside_optimizer_us == pytest.approx(10.0)
    # all self time: linear 200 + 3 x 18 element-wise + 3 x 2 empty + 10 add = 270
    assert f.outside_optimizer_share_ratio == pytest.approx(10 / 270)
