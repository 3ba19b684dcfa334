"""benchmarks/eval.py: the accuracy check CI runs, and the run-to-run reference it reports."""

from __future__ import annotations

import math

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("hermes_eval", ROOT / "benchmarks" / "eval.py")
E = importlib.util.module_from_spec(_spec)
sys.modules["hermes_eval"] = E  # dataclasses look their module up while the class is built
_spec.loader.exec_module(E)

BASE = {"top1": 0.9, "top3": 0.9, "false_alarms": 0, "median_gain_error": 0.30}


def summary(**kw) -> dict:
    return {"top1": 11 / 12, "top3": 11 / 12, "false_alarms": 0, "median_gain_error": 0.28, **kw}


def test_check_passes_at_the_targets_and_the_baseline():
    assert E.check(summary(), BASE) == []


@pytest.mark.parametrize("kw,word", [
    ({"top1": 10 / 12}, "top-1"),                 # 83% < the 90% target
    ({"top3": 0.8}, "top-3"),                     # below the committed baseline
    ({"false_alarms": 1}, "false alarms"),        # the target is zero
    ({"median_gain_error": 0.31}, "gain error"),  # above both the 15% target and the 30% baseline
])  # fmt: skip
def test_check_names_what_falls_short(kw, word):
    (msg,) = E.check(summary(**kw), BASE)
    assert word in msg


def test_gain_error_within_target_passes_whatever_the_baseline():
    assert E.check(summary(median_gain_error=0.14), {**BASE, "median_gain_error": 0.10}) == []


def _log(d: Path, walls: list[float]) -> None:
    d.mkdir(parents=True)
    recs = [{"type": "run", "rank": 0}] + [{"type": "step", "step": i, "wall_s": w} for i, w in enumerate(walls)]
    (d / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def test_recorded_speedup_uses_the_unprofiled_monitored_steps(tmp_path):
    # 3 warm-up steps, 4 monitored, 7 under the profiler (1 warm-up + 6 recorded): only the 4 count
    _log(tmp_path / "bad", [9.0] * 3 + [0.010, 0.014, 0.010, 0.014] + [1.0] * 7)  # mean 12 ms
    _log(tmp_path / "fixed", [9.0] * 3 + [0.004, 0.004, 0.003, 0.005] + [1.0] * 7)  # mean 4 ms
    assert E.unprofiled_mean_s(tmp_path / "bad") == pytest.approx(0.012)
    assert E.recorded_speedup(tmp_path, {}) == pytest.approx(3.0)
    # per sample: 4 samples in 12 ms against 64 in 4 ms -> 16 / 0.004 / (4 / 0.012) = 48x
    label = {"throughput_speedup": 40.0, "samples_per_step": {"bad": 4, "fixed": 64}}
    assert E.recorded_speedup(tmp_path, label) == pytest.approx(48.0)


def test_recorded_speedup_needs_both_runs(tmp_path):
    _log(tmp_path / "bad", [0.01] * 14)
    assert E.recorded_speedup(tmp_path, {}) is None


def test_opening_of_an_explanation():
    text = "On rank 0, 12.6 ms\n  of the step blocks on I/O. The loop waits for storage. Third sentence. Fourth."
    assert E._opening(text) == "On rank 0, 12.6 ms of the step blocks on I/O. The loop waits for storage."
    assert E._opening("x" * 400, limit=10) == "x" * 9 + "…"


# ----------------------------------------------------------------------------- real traces
# Hand-made report dicts (the JSON shape of hermes_kb.advise(...).model_dump()): no advise call.

def _finding(category: str, severity: str = "medium", low: float = 1.1, high: float = 1.3, case: str = "C-X-001") -> dict:
    return {"case_id": case, "cause": "some_cause", "category": category, "severity": severity,
            "expected_speedup": {"low": low, "high": high}}  # fmt: skip


def _report(*findings: dict, summary: list[dict] | None = None) -> dict:
    return {"findings": list(findings), "summary": summary if summary is not None else [{"rank": 0, "breakdown_us": {}}]}


def _entry(**kw) -> dict:
    return {"path": "x/trace.json.gz", "kind": "kineto", "dominant": "unclear", "expected_category": None, **kw}


def test_real_first_finding_matching_the_expected_category():
    o = E.score_real(_entry(expected_category="io"), _report(_finding("io"), _finding("cpu")))
    assert o.top1 is True and o.top3 is True


def test_real_first_finding_not_matching():
    o = E.score_real(_entry(expected_category="io"), _report(_finding("cpu"), _finding("computation"), _finding("io")))
    assert o.top1 is False and o.top3 is True  # third place still counts for top-3
    o = E.score_real(_entry(expected_category="io"), _report(*[_finding("cpu")] * 3, _finding("io")))
    assert o.top1 is False and o.top3 is False  # fourth place does not
    o = E.score_real(_entry(expected_category="io"), _report())
    assert o.top1 is False and o.top3 is False  # no finding at all is a miss


def test_real_no_expected_category_is_not_scored():
    o = E.score_real(_entry(), _report(_finding("cpu")))
    assert o.top1 is None and o.top3 is None


def test_real_dominant_component_present():
    rep = _report(summary=[{"rank": 0, "critical_component": "host_dispatch_us",
                            "breakdown_us": {"compute_us": 10.0, "host_dispatch_us": 50.0}}])  # fmt: skip
    o = E.score_real(_entry(dominant="host"), rep)
    assert o.dominant == "host" and o.dominant_match is True  # host_launch/dispatch/python are "host"
    o = E.score_real(_entry(dominant="compute"), rep)
    assert o.dominant_match is False
    o = E.score_real(_entry(dominant="unclear"), rep)
    assert o.dominant_match is None  # an unclear expectation is not scored


def test_real_dominant_component_absent_is_na():
    o = E.score_real(_entry(dominant="data"), _report(summary=[{"rank": 0, "breakdown_us": {"data_us": 5.0}}]))
    assert o.dominant is None and o.dominant_match is None
    o = E.score_real(_entry(dominant="data"), _report(summary=[]))
    assert o.dominant_match is None


def test_real_dominant_component_over_ranks():
    ranks = [{"rank": r, "critical_component": c, "breakdown_us": b} for r, c, b in [
        (0, "communication", {"communication_us": 5.0, "compute_us": 4.0}),
        (1, "compute", {"communication_us": 1.0, "compute_us": 9.0}),
        (2, "communication", {"communication_us": 6.0, "compute_us": 3.0}),
    ]]  # fmt: skip
    assert E.reported_dominant({"summary": ranks}) == "communication"  # the most frequent
    # a tie goes to the component with the larger summed breakdown
    assert E.reported_dominant({"summary": ranks[:2]}) == "compute"


def test_real_pair_speedup_inside_the_range():
    e = _entry(expected_category="io", pair="x/fixed.json.gz", measured_speedup=1.25)
    o = E.score_real(e, _report(_finding("cpu", low=2.0, high=3.0), _finding("io", low=1.2, high=1.4)))
    assert o.predicted == (1.2, 1.4)  # the first finding of the expected category, not the first one
    assert o.gain_hit is True
    assert o.gain_error == pytest.approx(abs(math.log(math.sqrt(1.2 * 1.4) / 1.25)))


def test_real_pair_speedup_outside_the_range():
    e = _entry(expected_category="io", pair="x/fixed.json.gz", measured_speedup=1.25)
    o = E.score_real(e, _report(_finding("io", low=1.5, high=2.5)))
    assert o.gain_hit is False and o.gain_error == pytest.approx(math.log(math.sqrt(1.5 * 2.5) / 1.25))
    o = E.score_real(e, _report(_finding("cpu")))  # no finding of the expected category
    assert o.predicted is None and o.gain_hit is False and o.gain_error is None


def test_real_healthy_trace_without_a_high_finding():
    o = E.score_real(_entry(healthy=True), _report(_finding("computation", "medium"), _finding("cpu", "low")))
    assert o.false_alarms == []


def test_real_healthy_trace_with_a_high_finding():
    o = E.score_real(_entry(healthy=True), _report(_finding("cpu", "high", case="C-CPU-004"), _finding("io", "low")))
    assert o.false_alarms == ["C-CPU-004 (cpu)"]
    o = E.score_real(_entry(), _report(_finding("cpu", "high")))  # not healthy: a high finding is no false alarm
    assert o.false_alarms == []


def test_real_outcomes_count_a_failure_as_a_miss(tmp_path):
    (tmp_path / "ok.json").write_text("{}")
    (tmp_path / "bad.json").write_text("{}")
    exp = {"traces": [_entry(path="ok.json", expected_category="cpu", dominant="host"),
                      _entry(path="bad.json", expected_category="io"),
                      _entry(path="missing.json", expected_category="io")]}  # fmt: skip

    def advise(p):
        if p.name == "bad.json":
            raise ValueError("cannot read")
        return _report(_finding("cpu"), summary=[{"rank": 0, "critical_component": "host_python"}])

    outs = E.real_outcomes(exp, root=tmp_path, advise=advise)
    assert [o.top1 for o in outs] == [True, False, False]
    assert outs[1].error == "ValueError: cannot read" and outs[2].error
    s = E.summarize_real(outs)
    assert s["top1"] == pytest.approx(1 / 3) and s["errors"] == 2
    assert s["dominant_scored"] == 1 and s["dominant_match"] == 1.0


def test_summarize_real_and_check_real():
    outs = [
        E.score_real(_entry(expected_category="io", pair="p", measured_speedup=1.25), _report(_finding("io", low=1.2, high=1.3))),
        E.score_real(_entry(expected_category="cpu"), _report(_finding("io"))),
        E.score_real(_entry(healthy=True), _report(_finding("cpu", "high"))),
    ]
    s = E.summarize_real(outs)
    assert s["scored_category"] == 2 and s["top1"] == 0.5 and s["top3"] == 0.5
    assert s["pairs_in_range"] == "1/1" and s["healthy_false_alarms"] == 1 and s["healthy_with_false_alarm"] == 1
    assert E.check_real(s, {E.REAL_BASELINE_KEY: 0.5}) == []
    (msg,) = E.check_real(s, {E.REAL_BASELINE_KEY: 0.6})
    assert "real-trace top-1" in msg
    (msg,) = E.check_real(s, {})
    assert E.REAL_BASELINE_KEY in msg


def test_trace_only_input_is_the_capture_without_the_log(tmp_path):
    run = tmp_path / "bad"
    _log(run, [0.01] * 4)
    (run / "rank0.capture-profile.json.gz").write_bytes(b"")
    assert E.variant_input(tmp_path, "bad") == run  # the zoo scoring: the run directory (log + capture)
    assert E.trace_only_input(tmp_path, "bad") == run / "rank0.capture-profile.json.gz"
    (tmp_path / "fixed.json.gz").write_bytes(b"")  # an older recording: a lone trace
    assert E.trace_only_input(tmp_path, "fixed") == tmp_path / "fixed.json.gz"
    assert E.trace_only_input(tmp_path, "other") is None


def test_expectations_file_is_well_formed():
    exp = E.load_expectations()
    assert "before looking at hermes output" in exp["written"]
    for e in exp["traces"]:
        assert e["kind"] in ("kineto", "ascend")
        assert e["dominant"] in (*E.COMPONENTS, "unclear")
        assert e["expected_category"] in (None, "io", "cpu", "computation", "communication", "parallel")
        assert "before looking at hermes output" in e["written"]
        assert not e.get("pair") or e.get("measured_speedup")


def test_report_has_three_sections_each_with_its_summary():
    zoo = [E.Outcome("s", {"category": "cpu", "cause": "gc", "expected_cases": ["C-1"]})]
    trace_only = [E.Outcome("s", {"category": "cpu", "cause": "gc", "expected_cases": ["C-1"]}, error="ValueError: x")]
    exp = {"written": "2026-11-24, before looking at hermes output",
           "traces": [_entry(expected_category="io", dominant="data")], "excluded": [{"path": "y", "reason": "z"}]}  # fmt: skip
    outs = [E.score_real(exp["traces"][0], _report(_finding("io")))]
    text = E.render(zoo, E.summarize(zoo), trace_only, (outs, E.summarize_real(outs), exp))
    assert text.count("| metric | value |") == 3
    assert "## Scenario zoo from the profiler trace alone" in text and "## Real traces" in text
    assert '`written: "2026-11-24, before looking at hermes output"`' in text
    assert "hermes failed: ValueError: x" in text
    assert "| x/trace.json.gz | kineto | io | C-X-001 (io, medium) | yes | yes | data | n/a |" in text
