"""`hermes annotate` (issue 19, item 3): the original trace, every event kept as it was, plus
tracks for the critical path and the findings' evidence windows, on the trace's own clock."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import hermes_kb
from conftest import EXAMPLE, SHARED, needs_shared
from hermes_kb.tools.annotate import clock_offset_us


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", *map(str, args)], capture_output=True, text=True)


def events(path) -> tuple[dict, list]:
    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return doc, doc["traceEvents"]


def check(original, annotated) -> list[dict]:
    """The annotated file keeps every original event (same count, content, order) and top-level
    keys; returns the added events, checked for the Chrome trace event format."""
    doc0, ev0 = events(original)
    doc1, ev1 = events(annotated)
    assert {k: v for k, v in doc1.items() if k != "traceEvents"} == {k: v for k, v in doc0.items() if k != "traceEvents"}
    assert ev1[: len(ev0)] == ev0
    added = ev1[len(ev0):]
    assert added
    used = {e.get("pid") for e in ev0}
    named_threads = set()
    names = {}
    for e in added:
        assert e["pid"] not in used and isinstance(e["pid"], int)
        assert e["ph"] in ("X", "M")
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
        else:
            assert e["dur"] >= 0 and isinstance(e["ts"], float | int) and e["cat"] == "hermes"
    lanes = defaultdict(list)
    for e in added:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in named_threads  # every track is named
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():  # events on one thread never overlap (they would not nest)
        spans.sort()
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:]))
    assert sorted(names.values()) == ["hermes: critical path", "hermes: findings (evidence windows)"]
    return added


def test_annotate_the_bundled_example(tmp_path):
    out = tmp_path / "annotated.json.gz"
    r = cli("annotate", EXAMPLE, "-o", out)
    assert r.returncode == 0, r.stderr
    added = check(EXAMPLE, out)
    xs = [e for e in added if e["ph"] == "X"]
    path = [e for e in xs if "category" in e["args"]]
    evidence = [e for e in xs if "fact" in e["args"]]
    assert path and evidence
    report = hermes_kb.advise(EXAMPLE)
    assert {e["name"] for e in evidence} <= {f.case_id for f in report.findings}
    assert "C-IO-001" in {e["name"] for e in evidence}
    # the trace's own clock: each step's path starts at its ProfilerStep
    _, ev0 = events(EXAMPLE)
    steps = {int(e["name"].split("#")[1]): e["ts"] for e in ev0 if str(e.get("name", "")).startswith("ProfilerStep#")}
    first_by_step = {}
    for e in path:
        first_by_step.setdefault(e["args"]["step"], e["ts"])
    for step, ts in first_by_step.items():
        assert ts >= steps[step] - 1.0 and ts - steps[step] < 5_000, (step, ts, steps[step])
    assert "original events" in r.stdout


def test_clock_offset_maps_bundle_times_back_to_the_file():
    bundle = hermes_kb.load(EXAMPLE)
    t = bundle[0]
    _, raw = events(EXAMPLE)
    first = t.cpu_ops.sort_values("ts").iloc[0]
    raw_ts = min(e["ts"] for e in raw if e.get("cat") == "cpu_op" and e.get("name") == first["name"])
    assert float(first["ts"]) + clock_offset_us(t.meta) == pytest.approx(raw_ts, abs=0.5)


@needs_shared()
def test_annotate_several_ranks_into_a_directory(tmp_path):
    src = SHARED / "param/dlrm_kineto_8rank"
    out = tmp_path / "annotated"
    r = cli("annotate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    files = sorted(out.iterdir())
    assert len(files) == 8
    for f in sorted(src.iterdir())[:2]:
        dest = out / f.name.replace(".pt.trace.json.gz", ".annotated.json.gz")
        check(f, dest)


@needs_shared()
def test_annotate_a_2021_trace_with_its_base_time(tmp_path):
    src = SHARED / "kineto_2021/resnet50_num_workers_0.pt.trace.json.gz"
    out = tmp_path / "a.json"  # plain JSON when the name says so
    assert cli("annotate", src, "-o", out).returncode == 0
    assert out.read_bytes()[:1] == b"{"
    added = check(src, out)
    assert any(e["ph"] == "X" and e["name"] == "C-IO-005" for e in added)


def test_annotate_refuses_a_run_dir(tmp_path):
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/checkpoint_stalls/bad"
    r = cli("annotate", run, "-o", tmp_path / "x.json.gz")
    assert r.returncode == 2 and "RUN_DIR" in r.stderr


def evidence_windows(path) -> dict[str, list[tuple[float, float, str]]]:
    """The evidence-window events of an annotated file, per finding (case id): (ts, end, scope)."""
    _, ev = events(path)
    out: dict[str, list] = defaultdict(list)
    for e in ev:
        if e.get("cat") == "hermes" and e.get("ph") == "X" and "fact" in e.get("args", {}):
            out[e["name"]].append((e["ts"], e["ts"] + e["dur"], e["args"]["scope"]))
    return {k: sorted(v) for k, v in out.items()}


def test_every_rank_a_finding_covers_gets_its_own_evidence_windows(tmp_path):
    """Issue 36 item 8: a finding keeps one rank's evidence; each rank's annotated trace still
    gets the windows of its own facts. Three ranks: the example, rank r's clock shifted by
    r * 500 µs, so rank r's windows are rank 0's shifted by 500 r (before: none on ranks 1, 2)."""
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.tools.annotate import annotate_bundle

    doc, _ = events(EXAMPLE)
    src = tmp_path / "in"
    src.mkdir()
    for r in range(3):
        d = json.loads(json.dumps(doc))
        d["distributedInfo"] = {"rank": r, "world_size": 3, "backend": "nccl"}
        for e in d["traceEvents"]:
            if isinstance(e.get("ts"), int | float):
                e["ts"] += 500 * r
        (src / f"rank{r}.json").write_text(json.dumps(d))
    adv = advise_bundle_full(hermes_kb.load(src))
    written = {w.rank: w for w in annotate_bundle(adv, tmp_path / "out")}
    assert sorted(written) == [0, 1, 2]
    windows = {r: evidence_windows(written[r].path) for r in written}
    windowed = [f for f in adv.report.findings if any(e.time_ranges_us for e in f.evidence)]
    assert windowed and all(f.ranks == [0, 1, 2] for f in windowed)
    for f in windowed:
        base = windows[0][f.case_id]
        assert base and all(scope == "rank 0" for *_, scope in base)
        for r in (1, 2):
            got = windows[r].get(f.case_id, [])
            shifted = [x - 500 * r for a, b, _ in got for x in (a, b)]
            assert shifted == pytest.approx([x for a, b, _ in base for x in (a, b)], abs=0.01)
            assert all(scope == f"rank {r}" for *_, scope in got)
    assert written[1].evidence_windows == written[2].evidence_windows == written[0].evidence_windows > 0


@needs_shared()
def test_dlrm_every_rank_of_a_finding_gets_evidence_windows(tmp_path):
    """Issue 36 item 8 on the 8-rank DLRM job: every finding covers ranks 0-7 (or most of them);
    before, only ranks 0 and 1 got evidence windows. Now each rank a finding covers gets that
    finding's windows, scoped to that rank (or to the job), inside that rank's own step."""
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.tools.annotate import annotate_bundle

    src = SHARED / "param/dlrm_kineto_8rank"
    adv = advise_bundle_full(hermes_kb.load(src))
    written = {w.rank: w for w in annotate_bundle(adv, tmp_path / "out")}
    assert sorted(written) == list(range(8))
    windowed = [f for f in adv.report.findings if any(e.time_ranges_us for e in f.evidence)]
    assert len(windowed) >= 3
    assert sum(len(f.ranks) for f in windowed) > 2 * len(windowed)  # findings cover more than two ranks
    for r, w in written.items():
        got = evidence_windows(w.path)
        _, ev = events(w.path)
        step = next(e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X")
        expected = {f.case_id for f in windowed if r in f.ranks}
        assert set(got) == expected, (r, set(got), expected)
        for case_id, spans in got.items():
            assert spans and all(scope in (f"rank {r}", "job") for *_, scope in spans), (r, case_id, spans)
            own = [(a, b) for a, b, scope in spans if scope != "job"]
            assert all(step["ts"] - 1 <= a <= b <= step["ts"] + step["dur"] + 1 for a, b in own), (r, case_id, own, step)
