"""Program phases and the user's functions (analyzers/program/), on hand-made traces whose answer
is computed by hand below, and on recorded zoo runs (the phases add up to the step)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hermes_kb
from conftest import X, write_trace
from hermes_kb.analysis.rank import analyze_rank

ZOO = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded"
STEP = 1000.0


def _step(k: int, *, stacks: bool = True, loop: bool = False) -> list[dict]:
    """Step k (window [k*1000, (k+1)*1000)), on thread 1:
    data [0,100) · step() [100,900) holding forward [120,320) (a module call, aten::linear
    [130,300) with a sequence number), backward [330,630) (evaluate_function [340,600)),
    compute_metrics() [640,840) (aten::argmax [650,700), aten::item [710,720)) · the optimizer
    [850,890). With ``loop``: ema_update() [900,990) calling aten::lerp_ 20 times on 5 shapes."""
    t = k * STEP
    ev = [
        X("user_annotation", f"ProfilerStep#{k + 1}", t, STEP),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100),
        X("cpu_op", "aten::linear", t + 130, 170, args={"Sequence number": 10 + k, "Input Dims": [[4, 8], [8, 8]]}),
        X("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", t + 340, 260),
        X("cpu_op", "aten::argmax", t + 650, 50),
        X("cpu_op", "aten::item", t + 710, 10),
        X("user_annotation", "Optimizer.step#SGD.step", t + 850, 40),
    ]
    if stacks:
        ev += [
            X("python_function", "train.py(20): step", t + 100, 800),
            X("python_function", "torch/nn/modules/module.py(1782): _call_impl", t + 120, 200),
            X("python_function", "torch/_tensor.py(600): backward", t + 330, 300),
            X("python_function", "train.py(40): compute_metrics", t + 640, 200),
        ]
    if loop:
        ev.append(X("python_function", "train.py(60): ema_update", t + 900, 90))
        for i in range(20):
            ev.append(X("cpu_op", "aten::lerp_", t + 902 + 4 * i, 3, args={"Input Dims": [[i % 5 + 1, 4], [i % 5 + 1, 4], []]}))
    return ev


def _facts(tmp_path: Path, **kw) -> list:
    ev = [X("python_function", "train.py(10): main", 0, 2 * STEP)] if kw.get("stacks", True) else []
    ev += _step(0, **kw) + _step(1, **kw)
    bundle = hermes_kb.load(str(write_trace(tmp_path / "t.json", ev)))
    _, facts = analyze_rank(bundle[bundle.rank_ids[0]])
    assert not [f for f in facts if f.kind == "analyzer_error"], [f for f in facts if f.kind == "analyzer_error"]
    return facts


def _phases(facts, step=None):
    return next(f for f in facts if f.kind == "program_phases" and f.step == step)


def test_phases_with_python_stacks_by_hand(tmp_path):
    facts = _facts(tmp_path)
    p = _phases(facts, 1)
    # data 100, forward [120,320) = 200, backward [330,630) = 300, optimizer 40; the rest of the
    # step is the user's code (step(), compute_metrics(), the loop): 1000 - 640 = 360
    assert (p.data_us, p.forward_us, p.backward_us, p.optimizer_us, p.communication_us) == pytest.approx(
        (100.0, 200.0, 300.0, 40.0, 0.0))
    assert p.user_code_us == pytest.approx(360.0) and p.other_us == pytest.approx(0.0)
    assert p.window_us == pytest.approx(STEP) and p.largest_phase == "user_code"
    assert "python_stacks" in p.sources and p.has_stacks
    agg = _phases(facts)
    assert agg.steps_count == 2 and agg.window_us == pytest.approx(2 * STEP)
    assert sum(getattr(agg, f"{k}_us") for k in ("data", "forward", "backward", "optimizer", "communication",
                                                  "user_code", "other")) == pytest.approx(agg.window_us)  # fmt: skip
    # the function named: compute_metrics runs no training and takes 200 a step (20%); step()
    # runs backward and the optimizer (a driver), its own time outside the phases is 260
    assert agg.top_function == "train.py(40): compute_metrics" and agg.top_function_ratio == pytest.approx(0.2)
    fns = {f.function: f for f in facts if f.kind == "user_function"}
    m = fns["train.py(40): compute_metrics"]
    assert m.site and not m.driver and m.extra_us == pytest.approx(400.0) and m.share_ratio == pytest.approx(0.2)
    assert m.ops_count == 4 and m.syncs_count == 2 and m.top_ops[0] == "aten::argmax" and m.steps_count == 2
    s = fns["train.py(20): step"]
    assert s.driver and not s.site and s.outside_us == pytest.approx(2 * 260.0) and s.training_us == pytest.approx(2 * 340.0)


def test_phases_without_stacks_by_hand(tmp_path):
    """Without Python stacks: forward is the autograd-recorded operators, the user's code the
    other top-level operators outside the phases, the rest is untraced."""
    p = _phases(_facts(tmp_path, stacks=False), 1)
    assert (p.data_us, p.forward_us, p.backward_us, p.optimizer_us) == pytest.approx((100.0, 170.0, 260.0, 40.0))
    assert p.user_code_us == pytest.approx(60.0)  # argmax 50 + item 10
    assert p.other_us == pytest.approx(STEP - 100 - 170 - 260 - 40 - 60)
    assert "sequence_numbers" in p.sources and not p.has_stacks and p.top_function is None


def test_a_new_epochs_iterator_is_data(tmp_path):
    """The DataLoader's own __iter__ frame (a new epoch starting its workers, outside the
    __next__ annotation) is data, not the user's code: [100,115) of the first step's step() here
    (ProfilerStep#1, step 1)."""
    ev = [X("python_function", "train.py(10): main", 0, 2 * STEP)] + _step(0) + _step(1)
    ev.append(X("python_function", "torch/utils/data/dataloader.py(492): __iter__", 100, 15))
    ev.append(X("python_function", "torch/utils/data/dataloader.py(1233): _reset", 101, 13))
    bundle = hermes_kb.load(str(write_trace(tmp_path / "t.json", ev)))
    _, facts = analyze_rank(bundle[bundle.rank_ids[0]])
    p = _phases(facts, 1)
    assert p.data_us == pytest.approx(115.0) and p.user_code_us == pytest.approx(345.0)
    assert "dataloader_frames" in p.sources


def test_a_loop_over_tensors_is_found_and_priced(tmp_path):
    facts = _facts(tmp_path, loop=True)
    f = next(f for f in facts if f.kind == "user_function" and f.function == "train.py(60): ema_update")
    assert f.loop_op == "aten::lerp_" and f.loop_calls_per_step == 20 and f.loop_shapes_count == 5
    assert f.loop_us == pytest.approx(2 * 20 * 3.0)
    sets = {w.target for w in facts if w.kind == "whatif"}
    assert {"user_function", "user_loop"} <= sets


def test_the_named_function_becomes_a_finding(tmp_path):
    ev = [X("python_function", "train.py(10): main", 0, 2 * STEP)] + _step(0) + _step(1)
    report = hermes_kb.advise(str(write_trace(tmp_path / "t.json", ev)))
    every = [g for f in report.findings for g in (f, *f.alternatives)]
    # here the function is mostly Python between operators, so C-CPU-003 (that mechanism) may lead
    # with C-PROG-001 (where the time is) listed under it
    f = next(f for f in every if f.case_id == "C-PROG-001")
    assert "compute_metrics" in f.explanation and f.share_of_step_ratio == pytest.approx(0.2)
    (s,) = report.summary
    assert s.program_site == "train.py(40): compute_metrics" and s.program_site_ratio == pytest.approx(0.2)
    assert sum(s.phases_us.values()) == pytest.approx(s.mean_step_us, rel=1e-6)


@pytest.mark.parametrize("run", sorted(p.relative_to(ZOO).as_posix() for p in ZOO.glob("*/bad") if not p.name.startswith("gpu_"))[:40])
def test_the_phases_add_up_to_the_step_on_the_zoo(run):
    report = hermes_kb.advise(str(ZOO / run))
    for s in report.summary:
        if s.phases_us:
            total = sum(s.phases_us.values())
            captured = s.breakdown_us and sum(s.breakdown_us.values())
            assert total == pytest.approx(captured or total, rel=1e-3), (run, s.rank, s.phases_us, s.breakdown_us)


def _finding(case_id: str, target: str, mid: float):
    from hermes_kb.advisor.report import Finding, Removable, Speedup

    return Finding(case_id=case_id, title=case_id, category="cpu", cause="c", severity="high", confidence=0.9,
                   expected_speedup=Speedup(low=mid - 0.1, high=mid + 0.1), time_at_stake_us=100.0,
                   step_time_us=1000.0, share_of_step_ratio=0.1, removable_us=Removable(low=50.0, high=100.0),
                   whatif_target=target, assumption="", ranks=[0], steps=[], evidence=[], optimizations=[],
                   explanation="", references=[])  # fmt: skip


def test_what_a_finding_explains_orders_findings_on_the_same_time():
    """A mechanism leads a place, a place leads an overhead, when the leader's events hold most of
    the other's critical-path time; otherwise the usual order (what the fix removes) stands."""
    from hermes_kb.advisor.ranking import merge_findings

    # critical time per set on rank 0, and what each set shares with the others (µs)
    whatif = {
        (0, "user_function"): {"critical_us": 400.0, "critical_overlaps_us": {"tiny_ops": 300.0, "python_io": 200.0}},
        (0, "tiny_ops"): {"critical_us": 350.0, "critical_overlaps_us": {"user_function": 300.0, "optimizer": 100.0}},
        (0, "python_io"): {"critical_us": 210.0, "critical_overlaps_us": {"user_function": 200.0}},
        (0, "optimizer"): {"critical_us": 100.0, "critical_overlaps_us": {"tiny_ops": 100.0}},
    }
    explains = {"C-PROG-001": "place", "C-CPU-026": "overhead", "C-CPU-019": "mechanism", "C-CPU-038": "mechanism"}
    # the overhead finding gains more, but the function holds 300 of its 350 µs: the place leads
    kept = merge_findings([_finding("C-CPU-026", "tiny_ops", 2.0), _finding("C-PROG-001", "user_function", 1.5)],
                          whatif, explains)  # fmt: skip
    assert [f.case_id for f in kept] == ["C-PROG-001"] and [a.case_id for a in kept[0].alternatives] == ["C-CPU-026"]
    # a mechanism holding 200 of the function's 400 µs (50%) leads it
    kept = merge_findings([_finding("C-PROG-001", "user_function", 2.0), _finding("C-CPU-019", "python_io", 1.5)],
                          whatif, explains)  # fmt: skip
    assert [f.case_id for f in kept] == ["C-CPU-019"] and kept[0].alternatives[0].case_id == "C-PROG-001"
    # a mechanism holding only 100 of the overhead's 350 µs does not speak for it: the overhead leads
    kept = merge_findings([_finding("C-CPU-026", "tiny_ops", 2.0), _finding("C-CPU-038", "optimizer", 1.5)],
                          whatif, explains)  # fmt: skip
    assert [f.case_id for f in kept] == ["C-CPU-026"] and kept[0].alternatives[0].case_id == "C-CPU-038"
