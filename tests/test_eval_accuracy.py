"""benchmarks/eval.py: the accuracy check CI runs, and the run-to-run reference it reports."""

from __future__ import annotations

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
    ({"median_gain_error": 0.31}, "gain error"),  # above both the 25% target and the 30% baseline
])  # fmt: skip
def test_check_names_what_falls_short(kw, word):
    (msg,) = E.check(summary(**kw), BASE)
    assert word in msg


def test_gain_error_within_target_passes_whatever_the_baseline():
    assert E.check(summary(median_gain_error=0.24), {**BASE, "median_gain_error": 0.10}) == []


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
