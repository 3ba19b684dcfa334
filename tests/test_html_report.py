"""`hermes advise --format html` (issue 19, item 1): one self-contained page, opened in a real
headless Chromium: no console errors, no Content-Security-Policy violation (nothing loaded from
the network, no script), every chart drawn with a non-zero size, a screenshot kept; and names
carrying script payloads run nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_kb
from browser import console_errors, needs_chromium, probe, screenshot
from conftest import EXAMPLE, SHARED, needs_shared
from hostile import MARK, hostile_report, hostile_trace
from hermes_kb.render.details import with_details
from hermes_kb.render.html import render_html

RUN_DIR = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/checkpoint_stalls/bad"


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", *map(str, args)], capture_output=True, text=True)


def html_of(path, tmp_path: Path, name: str = "report.html") -> Path:
    out = tmp_path / name
    r = cli("advise", path, "--format", "html", "-o", out)
    assert r.returncode == 0, r.stderr
    return out


def test_html_is_self_contained(tmp_path):
    page = html_of(EXAMPLE, tmp_path).read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # no script, no external resource: the only URLs are the findings' references (links)
    assert "<script" not in page
    assert not re.search(r'\s(src|srcset|data)="', page)
    for url in re.findall(r'(?:href|xlink:href)="([^"]*)"', page):
        assert url.startswith("https://") or url.startswith("http://"), url
    assert "@import" not in page and "url(" not in page
    # the sections issue 19 asks for
    for anchor in ("breakdown", "steps", "critical-path", "findings"):
        assert f'id="{anchor}"' in page
    assert page.count('class="chart gain"') >= 1  # each finding's gain drawn against the step
    assert "C-IO-001" in page and "num_workers" in page  # its fix and snippet
    assert 'class="critical"' in page  # the critical component marked


def test_html_report_data_for_a_monitor_run(tmp_path):
    adv = __import__("hermes_kb.advisor.run", fromlist=["advise_run_dir_full"]).advise_run_dir_full(RUN_DIR)
    r = with_details(adv.report, adv.facts, adv.run)
    (s,) = r.summary
    assert len(s.series) == s.steps_count  # every analysed step of the log
    spikes = [p for p in s.series if p.spike]
    facts = [f for f in adv.facts if f.kind == "monitor_spikes" and f.cause == "all"]
    assert [p.step for p in spikes] == facts[0].spike_steps  # the analyzer's spikes, with a cause each
    assert all(p.spike in ("gc", "checkpoint", "marked_event", "data_wait", "unexplained") for p in spikes)
    page = render_html(r)
    assert 'class="spike"' in page


@needs_chromium()
@pytest.mark.parametrize("source", ["example", "run_dir", "dlrm"])
def test_html_renders_in_chromium(tmp_path, source):
    if source == "dlrm":
        if not SHARED.is_dir():
            pytest.skip("../shared/data is absent")
        path = SHARED / "param/dlrm_kineto_8rank"
    else:
        path = EXAMPLE if source == "example" else RUN_DIR
    page = html_of(path, tmp_path)
    assert console_errors(page, tmp_path) == []
    got = probe(page, tmp_path)
    assert got["errors"] == [], got["errors"]  # no error, no CSP violation
    assert got["scripts"] == 2  # the probe's own: the report has none
    labels = [c["label"] for c in got["charts"]]
    assert "step breakdown per rank" in labels
    # the DLRM job has one profiled step per rank: a statement, not a chart (issue 36 item 3)
    assert ("step time over the run" in labels) == (source != "dlrm")
    assert "expected gain against the step" in labels
    for c in got["charts"]:
        assert c["width"] > 0 and c["height"] > 0 and c["shapes"] > 0, c
    png = screenshot(page, tmp_path / f"report-{source}.png", tmp_path)
    assert png.stat().st_size > 10_000
    print(f"screenshot: {png}")


@needs_chromium()
def test_script_payloads_in_names_run_nothing(tmp_path):
    r = hostile_report(hermes_kb.advise(EXAMPLE))
    page = tmp_path / "hostile.html"
    page.write_text(render_html(with_details(r, [])), encoding="utf-8")
    # without the page's CSP: only the escaping stands between the payloads and the browser
    got = probe(page, tmp_path, keep_csp=False)
    assert got["pwned"] is None, got
    assert got["title"].startswith("hermes report") and "pwned" not in got["title"]
    assert got["scripts"] == 2
    assert [e for e in got["errors"] if "img" in e.lower()] == []  # no <img src=x> was created
    with_csp = probe(page, tmp_path, keep_csp=True)
    assert with_csp["pwned"] is None and with_csp["errors"] == []


@needs_chromium()
def test_a_hostile_trace_end_to_end(tmp_path):
    trace = hostile_trace(EXAMPLE, tmp_path / "hostile.json.gz")
    page = html_of(trace, tmp_path, "hostile.html")
    got = probe(page, tmp_path, keep_csp=False)
    assert got["pwned"] is None and got["scripts"] == 2, got
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and MARK in text  # the payloads are there, as text


def one_step_trace(tmp_path: Path) -> Path:
    """The example cut to its second profiled step (ProfilerStep#3): a one-step trace."""
    import gzip
    import json

    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    steps = sorted(e["ts"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    a, b = steps[1], steps[2]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M" or "ts" not in e or a <= e["ts"] < b]
    out = tmp_path / "one_step.json"
    out.write_text(json.dumps(doc))
    return out


def step_section(page: str) -> str:
    return page[page.index('<h2 id="steps"'):page.index("</section>", page.index('<h2 id="steps"'))]


def test_one_profiled_step_gets_a_statement_not_an_empty_chart(tmp_path):
    # issue 36 item 3: a trace with one profiled step drew a chart of one dot; the section now
    # says what the one step took (the breakdown's mean step: the same number) and where its
    # parts are, and asks for more steps
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.render.report import breakdown_rows
    from hermes_kb.render.svg import ms

    adv = advise_bundle_full(hermes_kb.load(one_step_trace(tmp_path)))
    r = with_details(adv.report, adv.facts)
    (s,) = r.summary
    assert len(s.series) == 1 and len(s.steps) == 1
    page = render_html(r)
    sec = step_section(page)
    assert 'aria-label="step time over the run"' not in page and "<svg" not in sec
    (row,) = breakdown_rows(r)
    assert sum(row["ms"][k] for k in ("compute", "communication", "host", "data", "idle")) == pytest.approx(row["mean_ms"])
    said = f"One profiled step (step {s.steps[0].step}, {ms(s.series[0].duration_us)})"
    assert said in sec and ms(row["mean_ms"] * 1e3) in sec
    assert f'{row["mean_ms"]:,.2f} ms' in page[page.index('<h2 id="breakdown"'):page.index('<h2 id="steps"')]
    assert "bar of the step breakdown above" in sec and "active=3" in sec
    # several steps: the chart as before
    several = render_html(with_details(hermes_kb.advise(EXAMPLE), []))
    assert 'aria-label="step time over the run"' in several and 'class="one-step"' not in several


@needs_shared()
def test_one_profiled_step_per_rank_of_the_dlrm_job(tmp_path):
    from hermes_kb.advisor.run import advise_bundle_full
    from hermes_kb.render.report import breakdown_rows
    from hermes_kb.render.svg import ms

    adv = advise_bundle_full(hermes_kb.load(SHARED / "param/dlrm_kineto_8rank"))
    r = with_details(adv.report, adv.facts)
    assert len(r.summary) == 8 and all(len(s.series) == 1 for s in r.summary)
    sec = step_section(render_html(r))
    rows = breakdown_rows(r)
    lo, hi = min(rows, key=lambda x: x["mean_ms"]), max(rows, key=lambda x: x["mean_ms"])
    assert f"{ms(lo['mean_ms'] * 1e3)} on rank {lo['rank']} to {ms(hi['mean_ms'] * 1e3)} on rank {hi['rank']} across 8 ranks" in sec
    assert "bars of the step breakdown above" in sec and "<svg" not in sec
