"""Calibrated ranges with a stated coverage, the measured confidence, and the user's ledger
(issue 33, docs/advice.md#calibrated-ranges). Numbers worked by hand from the formulas."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLE
from hermes_kb.advisor import calibration as cal_mod
from hermes_kb.advisor.calibration import Calibration, Scored, calibrate, kth_largest, logit, speedup_of
from hermes_kb.tools import ledger

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "benchmarks/scenarios/recorded"


def cli(*args, env=None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_kth_largest_is_the_split_conformal_order_statistic():
    # n = 9, coverage 0.8: k = floor(10 * 0.1) = 1, the largest; n = 19: k = floor(20 * 0.1) = 2
    assert kth_largest([float(i) for i in range(9)], 0.8) == 8.0
    assert kth_largest([float(i) for i in range(19)], 0.8) == 17.0
    # n = 3: k = floor(4 * 0.1) = 0: too few scores to say anything at 80%
    assert kth_largest([1.0, 2.0, 3.0], 0.8) is None


def test_logit_round_trip_and_clipping():
    # S = 2 removes half the step: logit 0
    assert logit(2.0) == pytest.approx(0.0, abs=1e-12)
    assert speedup_of(0.0) == pytest.approx(2.0)
    assert speedup_of(logit(1.37)) == pytest.approx(1.37)
    # no gain (or a loss) counts as a 0.1% share; nothing beyond 1000x
    assert logit(0.9) == logit(1.0) == pytest.approx(math.log(1e-3 / (1 - 1e-3)))
    assert speedup_of(50.0) == pytest.approx(1000.0)


def _cal(rows) -> Calibration:
    return Calibration(0.8, tuple(Scored(f"s{i}", c, "cpu", lo, hi, m) for i, (c, lo, hi, m) in enumerate(rows)))


def test_range_moves_each_end_by_the_largest_miss_of_nine():
    # nine scenarios whose measured speedups miss the model's high end by known logits: 9 rows give
    # k = 1, so the high margin is the largest miss above and the low margin the largest under
    rows = [("C-X", 1.5, 2.0, speedup_of(logit(2.0) + d)) for d in (0.1, 0.2, 0.3, 0.4, 0.5)]
    rows += [("C-X", 1.5, 2.0, speedup_of(logit(1.5) - d)) for d in (0.05, 0.1, 0.15, 0.2)]
    c = _cal(rows)
    mg = c.margins()
    assert mg.above == pytest.approx(0.5) and mg.below == pytest.approx(0.2)
    lo, point, hi = c.range_of(1.2, 1.4)
    assert hi == pytest.approx(speedup_of(logit(1.4) + 0.5))
    assert lo == pytest.approx(speedup_of(logit(1.2) - 0.2))
    assert lo < 1.2 and hi > 1.4 and lo <= point <= hi
    # a fix the model rates tiny stays small: share(1.02) = 0.0196, logit -3.912, +0.5 -> 1.0321x
    assert c.range_of(1.01, 1.02)[2] == pytest.approx(1.0 / (1.0 - 1.0 / (1.0 + math.exp(3.9120 - 0.5))), rel=1e-3)
    # a model that claims no gain is left alone
    assert c.range_of(1.0, 1.0) is None


def test_leave_one_out_counts_and_case_record():
    rows = [("C-A", 1.2, 1.4, 1.3)] * 5 + [("C-B", 1.2, 1.4, 3.0)] + [("C-A", 1.2, 1.4, 1.35)] * 4
    c = Calibration(0.8, tuple(Scored(f"s{i}", cid, "cpu", lo, hi, m) for i, (cid, lo, hi, m) in enumerate(rows)))
    held = c.held()
    # leaving C-B out, the others never rise above 1.4 by much: its 3.0x is above its range; every
    # C-A run sits inside the range the others (C-B's big miss among them) give it
    assert held == {**held, "n": 10, "hits": 9, "under": 1, "over": 0}
    assert c.case_record("C-A") == (9, 9) and c.case_record("C-B") == (0, 1) and c.case_record("C-Z") == (0, 0)


def test_shipped_calibration_is_a_real_leave_one_out_record():
    c = cal_mod.load()
    assert c is not None and len(c.scenarios) >= 40
    held = c.held()
    assert held["n"] == len([s for s in c.scenarios if s.model_high > 1.0])
    # the file's stored summary is what its scenarios give (it was not edited by hand)
    data = json.loads(cal_mod.CALIBRATION_FILE.read_text())
    assert data["leave_one_out"] == held
    assert {s.platform for s in c.scenarios} == {"cpu", "gpu"}


def _advise_json(path, env=None) -> dict:
    r = cli("advise", path, "--format", "json", env=env)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_report_states_calibrated_ranges_with_the_model_beside_them():
    rep = _advise_json(EXAMPLE)
    fs = [f for f in rep["findings"] if f["expected_speedup"]["coverage"] is not None]
    assert fs, "no calibrated finding on the bundled example"
    c = cal_mod.load()
    for f in fs:
        sp, rm, t = f["expected_speedup"], f["removable_us"], f["step_time_us"]
        lo, point, hi = c.range_of(sp["model_low"], sp["model_high"])
        assert (sp["low"], sp["high"], sp["point"]) == (round(lo, 3), round(hi, 3), round(point, 3))
        # the removable time follows the stated speedups: T - T / S
        assert rm["low"] == pytest.approx(t - t / lo, abs=2e-3) and rm["high"] == pytest.approx(t - t / hi, abs=2e-3)
        assert "Calibrated" in f["assumption"] and f"{sp['model_low']:.2f}-{sp['model_high']:.2f}x" in f["assumption"]
        hits, runs = c.case_record(f["case_id"])
        assert f["confidence_runs"] == runs and f["confidence"] == (round(hits / runs, 2) if runs else None)


def test_calibration_off_gives_the_model_and_no_confidence():
    on = _advise_json(EXAMPLE)
    off = _advise_json(EXAMPLE, env={"HERMES_CALIBRATION": "off"})
    a = {f["case_id"]: f for f in on["findings"]}
    for f in off["findings"]:
        sp = f["expected_speedup"]
        assert sp["coverage"] is None and sp["model_low"] is None and f["confidence"] is None
        assert sp["low"] == a[f["case_id"]]["expected_speedup"]["model_low"]


def test_text_reports_say_coverage_and_confidence():
    r = cli("advise", EXAMPLE, "--format", "md")
    assert re.search(r"x\*\* \(most likely \d+\.\d\dx, 80% range\)", r.stdout)
    assert "confidence not yet measured" in r.stdout or "zoo run(s)" in r.stdout


def test_diff_record_writes_the_ledger_only_when_asked(tmp_path):
    bad, fixed = ZOO / "sync_logging/bad/rank0.capture-profile.json.gz", ZOO / "sync_logging/fixed/rank0.capture-profile.json.gz"
    path = tmp_path / "ledger.jsonl"
    env = {"HERMES_LEDGER": str(path)}
    r = cli("diff", bad, fixed, "--format", "json", env=env)
    assert not path.exists()
    d = json.loads(r.stdout)
    resolved = [c for c in d["findings"] if c["status"] == "resolved" and c["measured_speedup"] is not None]
    assert resolved
    r = cli("diff", bad, fixed, "--format", "json", "--record", env=env)
    assert f"recorded in {path}" in r.stderr
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["case_id"] for x in lines] == [c["case_id"] for c in resolved]
    for x, c in zip(lines, resolved):
        assert x["measured_speedup"] == c["measured_speedup"] and x["predicted"] == c["predicted_speedup"]
        assert x["before"] == bad.name and "/" not in x["before"]
        assert x["resolved_together"] == len(resolved)
        lo, hi = x["predicted"]["low"], x["predicted"]["high"]
        assert x["within_range"] == (lo <= x["measured_speedup"] <= hi)
    # a line not written by hermes is skipped with a note naming the file and line
    with path.open("a") as fh:
        fh.write("{not json\n")
    entries, notes = ledger.read(path)
    assert len(entries) == len(lines) and notes == [f"{path}:{len(lines) + 1}: not a ledger line, skipped"]
    r = cli("kb", "calibration", "--ledger", "--format", "json", env=env)
    out = json.loads(r.stdout)
    assert out["ledger"] == str(path) and "not a ledger line" in r.stderr
    solo = ledger.case_records(entries)
    for row in out["cases"]:
        assert (row["ledger_hits"], row["ledger_runs"]) == solo.get(row["case_id"], (0, 0))


def test_ledger_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Exception) as err:
        ledger.append([], blocker / "sub" / "ledger.jsonl")
    assert "cannot write the ledger" in str(err.value) and "\n" not in str(err.value)


def test_kb_calibration_prints_the_leave_one_out_record():
    r = cli("kb", "calibration")
    assert r.returncode == 0, r.stderr
    held = cal_mod.load().held()
    assert f"on {held['hits']} of {held['n']} runs" in r.stdout


def test_calibrate_single_small_point():
    # ten runs that all measured 1.15x against a model of 1.1-1.2x: both margins are negative and
    # the range closes on 1.15x; leave-one-out each run is held (nine others, k = 1)
    c = _cal([("C-X", 1.1, 1.2, 1.15)] * 10)
    got = calibrate(1.1, 1.2, c)
    assert got is not None and got.coverage == 0.8 and "held the measured speedup on 10 of 10" in got.note
    assert got.low == pytest.approx(1.15) and got.high == pytest.approx(1.15)
    # nine runs leave eight when one is left out: too few for an 80% margin, and the note says so
    assert "too few zoo runs" in calibrate(1.1, 1.2, _cal([("C-X", 1.1, 1.2, 1.15)] * 9)).note


def test_a_device_kind_the_zoo_never_ran_on_is_said():
    c = Calibration(0.8, tuple(Scored(f"s{i}", "C-X", p, 1.1, 1.2, 1.15) for i, p in enumerate(["cpu", "gpu"] * 5)))
    assert "No NPU run is in the calibration (it holds CPU and GPU runs)" in calibrate(1.1, 1.2, c, "npu").note
    assert "No " not in calibrate(1.1, 1.2, c, "gpu").note.split("range;")[-1]
