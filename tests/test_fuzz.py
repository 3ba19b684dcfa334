"""The fuzz suite's bounded budget (issue 18; the long run is ``benchmarks/fuzz.py --minutes N``).

Generated Kineto event lists (hypothesis, derandomised) and a fixed-seed sample of damaged real
traces, Ascend exports, monitor runs and hostile knowledge-base and config files: every input
must end in a one-line error naming the file or in a report that passes the checks of
benchmarks/fuzz.py (no NaN / inf, speedups in [1, 1000], step times above zero and below three
hours, damage the readers drop leaving the answer unchanged, semantic damage named in a warning);
no crash, no hang, no code run.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import hermes_kb
from conftest import ROOT, SHARED
from fuzz_strategies import event_lists

pytestmark = pytest.mark.fuzz

_spec = importlib.util.spec_from_file_location("hermes_fuzz", ROOT / "benchmarks" / "fuzz.py")
fz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fz)


@settings(max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(events=event_lists)
def test_generated_event_lists_end_in_a_clean_error_or_a_sane_report(events):
    with tempfile.TemporaryDirectory() as d:
        p = fz.generated_trace(events, Path(d) / "generated.json")
        try:
            report = hermes_kb.advise(str(p))
        except Exception as exc:  # noqa: BLE001 - classified
            outcome, detail = fz.classify_error(exc, d)
            assert outcome == "clean_error", detail
        else:
            assert fz.report_problems(report) == []


def test_mutation_sample_has_no_crash_hang_or_wrong_answer():
    counts = {"kineto": 30, "ascend": 12 if SHARED.is_dir() else 0, "monitor": 30, "kb": 30, "semantic": 21, "requests": 15}
    summary, failures = fz.fuzz(counts, seed=18, workers=2, timeout=60)
    assert not failures, [(f["category"], f["kind"], f["outcome"], f["detail"][:300]) for f in failures]
    assert summary["all"]["inputs"] == sum(counts.values())
    for cat, n in counts.items():
        if n:
            assert summary[cat]["inputs"] == n
            assert summary[cat]["clean_error"] + summary[cat]["success"] == n
