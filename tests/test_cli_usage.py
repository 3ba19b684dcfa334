"""A CLI that catches mistakes (issue 19, item 4): usage errors exit 2 and name what exists,
config errors exit 6 and name the user's file, -h works, wrapped lines keep their indent, the
terminal shows the snippets, analyze prints units, progress on a terminal only, kb explain on
a RUN_DIR, warnings for inputs that may mislead, kb list sorted."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

import hermes_kb
from conftest import EXAMPLE, SHARED, X, needs_shared, write_trace
from hermes_kb.kb.ids import id_key

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks/scenarios/recorded/checkpoint_stalls/bad"
TWO = ROOT / "tests/data/monitor_runs/two_ranks"


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", *map(str, args)], capture_output=True, text=True, **kw)


def one_line_error(r: subprocess.CompletedProcess, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.startswith("hermes: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# -- usage errors: exit 2, naming what exists ------------------------------------------------


def test_unknown_fact_kind():
    msg = one_line_error(cli("analyze", EXAMPLE, "--kind", "critical_pth"), 2)
    assert "unknown fact kind 'critical_pth'" in msg and "did you mean critical_path" in msg
    assert "step_time" in msg and "dataloader_wait" in msg  # names what exists


@pytest.mark.parametrize("cmd", [["kb", "test", "C-IO-01"], ["kb", "show", "C-IO-01"],
                                 ["kb", "explain", "C-IO-01", str(EXAMPLE)]])  # fmt: skip
def test_unknown_case_id(cmd):
    msg = one_line_error(cli(*cmd), 2)
    assert "no rule or case with id 'C-IO-01'" in msg and "C-IO-001" in msg and "C-IO-007" in msg


def test_rank_not_in_the_trace():
    msg = one_line_error(cli("advise", EXAMPLE, "--rank", "3"), 2)
    assert "--rank 3" in msg and "its ranks: 0" in msg
    msg = one_line_error(cli("advise", TWO, "--rank", "7"), 2)
    assert "its ranks: 0, 1" in msg
    assert cli("advise", TWO, "--rank", "1", "--format", "json").returncode == 0


def _run_dir(tmp_path: Path, finished: bool) -> Path:
    d = tmp_path / "run"
    d.mkdir(parents=True)
    for f in TWO.glob("rank*.jsonl"):
        lines = f.read_text().splitlines()
        if not finished:
            lines = [x for x in lines if '"type":"end"' not in x]
        (d / f.name).write_text("\n".join(lines) + "\n")
    return d


def test_monitor_profile_on_a_finished_or_empty_run(tmp_path):
    msg = one_line_error(cli("monitor", "profile", _run_dir(tmp_path / "a", True)), 2)
    assert "finished" in msg and "0, 1" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    msg = one_line_error(cli("monitor", "profile", empty), 2)
    assert "no monitor logs" in msg
    running = _run_dir(tmp_path / "b", False)
    ok = cli("monitor", "profile", running, "--steps", "2")
    assert ok.returncode == 0 and "requested capture" in ok.stdout
    assert (running / "profile.request").is_file()


# -- config errors: exit 6, naming the user's file -------------------------------------------


@pytest.mark.parametrize("text, code, words", [
    ("C-IO-001: {max_share: 0.2}\n", 6, ["unknown parameter 'max_share'", "min_processing"]),
    ("C-IO-001: {min_processing: 'high'}\n", 6, ["expected a number", "'high'"]),
    ("C-IO-001: [1\n", 6, ["invalid YAML"]),
    ("- C-IO-001\n", 6, ["must map rule/case ids"]),
    ("C-IO-001: 0.5\n", 6, ["expected a mapping"]),
    ("C-IO-999: {min_processing: 0.5}\n", 2, ["no rule or case with id 'C-IO-999'", "C-IO-001"]),
])  # fmt: skip
def test_config_errors(tmp_path, text, code, words):
    cfg = tmp_path / "my_thresholds.yaml"
    cfg.write_text(text)
    msg = one_line_error(cli("advise", EXAMPLE, "--config", cfg), code)
    assert str(cfg) in msg
    for w in words:
        assert w in msg


def test_config_that_is_fine_and_one_that_is_missing(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("C-IO-001: {min_processing: 0.6}\n")
    assert cli("advise", EXAMPLE, "--config", cfg, "--format", "json").returncode == 0
    msg = one_line_error(cli("advise", EXAMPLE, "--config", tmp_path / "nope.yaml"), 6)
    assert "nope.yaml" in msg and "no such config file" in msg


def test_exit_codes_are_documented():
    doc = (ROOT / "docs/cli.md").read_text()
    from hermes_kb.core import errors

    for name in dir(errors):
        if name.startswith("EXIT_"):
            assert f"| {getattr(errors, name)} |" in doc, name


# -- help, layout, units -------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [[], ["advise"], ["kb"], ["kb", "explain"], ["monitor", "profile"], ["diff"], ["annotate"]])
def test_dash_h_is_help(cmd):
    a, b = cli(*cmd, "-h"), cli(*cmd, "--help")
    assert a.returncode == 0 and "Usage:" in a.stdout
    assert a.stdout == b.stdout


def test_wrapped_lines_keep_their_indent():
    from hermes_kb.render.report import render_terminal

    r = hermes_kb.advise(EXAMPLE)
    buf = io.StringIO()
    Console(file=buf, width=70, color_system=None).print(render_terminal(r))
    lines = buf.getvalue().splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("   → Prepare batches"))
    assert lines[i + 1].startswith("     ") and lines[i + 1][5] != " "  # hangs under the text after "→ "
    j = next(k for k, x in enumerate(lines) if x.startswith("   On rank 0"))
    assert lines[j + 1].startswith("   ") and lines[j + 1][3] != " "
    assert all(len(x) <= 70 for x in lines)
    assert all(x == x.rstrip() for x in lines)  # no padding


def test_terminal_shows_the_snippets_the_markdown_has():
    from hermes_kb.render.report import render_markdown

    r = hermes_kb.advise(EXAMPLE)
    out = cli("advise", EXAMPLE).stdout
    md = render_markdown(r)
    snippets = [o.snippet for f in r.findings if f.expected_speedup.high >= 1.02 for o in f.optimizations if o.snippet]
    assert snippets
    for s in snippets:
        for line in s.strip().splitlines():
            assert line.strip() in md
            assert line.strip() in out
    assert "│ loader = torch.utils.data.DataLoader(" in out


def test_analyze_prints_units_not_raw_floats():
    out = cli("analyze", EXAMPLE).stdout
    assert not re.search(r"\w_us=[-\d.,]+ (ms|µs)", out)  # no _us key holding ms
    assert re.search(r"\bduration=\d+\.\d\d ms", out)
    assert not re.search(r"\d{4,}\.\d{3,}|\.\d{6,}", out)  # no raw floats (e.g. 69502.342, 0.0416667)
    assert re.search(r"time=\d[\d.,]* ms", out)  # nested (top_ops) values carry units too


# -- progress ----------------------------------------------------------------------------------


def _on_a_tty(*args) -> str:
    """Run hermes with stderr on a pseudo-terminal; what it drew there."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "hermes_kb.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=slave, env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})  # fmt: skip
    os.close(slave)
    seen = b""
    deadline = time.time() + 120
    while time.time() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=60)
    os.close(master)
    return seen.decode("utf-8", "replace")


def test_progress_on_a_terminal_only():
    drawn = _on_a_tty("advise", EXAMPLE, "--format", "json")
    assert re.search(r"reading cpu_dataloader_bound\.json\.gz \(\d[\d.,]* (kB|MB)\)", drawn)  # one file, its size
    assert "analysing 1 rank(s)" in drawn and "rules and cases" in drawn  # the analysis stages
    piped = cli("advise", EXAMPLE, "--format", "json")
    assert "reading" not in piped.stderr and "analysing" not in piped.stderr


# -- kb explain on a RUN_DIR, kb list sorted ---------------------------------------------------


def test_kb_explain_on_a_monitor_run_dir():
    r = cli("kb", "explain", "C-CPU-019", RUN)
    assert r.returncode == 0, r.stderr
    assert "C-CPU-019" in r.stdout


def test_kb_list_is_sorted():
    rows = json.loads(cli("kb", "list", "--format", "json").stdout)
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids, key=id_key)
    assert ids[0].startswith("R-") and ids[-1].startswith("C-")
    assert id_key("C-COMM-002") < id_key("C-COMM-010") < id_key("C-COMP-001")
    table = cli("kb", "list").stdout
    shown = re.findall(r"^([RC]-[A-Z]+-\d+) ", table, re.M)
    assert shown == ids


# -- warnings ------------------------------------------------------------------------------------


def _one_step_trace(path: Path, t0: float = 0.0, device: str | None = None, world: int | None = None, rank=None) -> Path:
    top = {}
    if device:
        top["deviceProperties"] = [{"id": 0, "name": device}]
    if world:
        top["distributedInfo"] = {"rank": rank, "world_size": world, "backend": "nccl"}
    return write_trace(path, [X("user_annotation", "ProfilerStep#1", t0, 1000.0),
                              X("cpu_op", "aten::mm", t0 + 10, 500.0), X("cpu_op", "aten::add", t0 + 600, 100.0)], **top)  # fmt: skip


def test_warning_for_a_single_profiled_step(tmp_path):
    r = cli("advise", _one_step_trace(tmp_path / "t.json"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "a single profiled step" in r.stderr and "active=3" in r.stderr
    assert any("single profiled step" in w for w in json.loads(r.stdout)["warnings"])


def test_terminal_report_shows_a_warning_once(tmp_path):
    r = cli("advise", _one_step_trace(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    both = r.stdout + r.stderr
    assert len(re.findall(r"a single profiled step", both)) == 1, both


def test_warning_for_ranks_from_different_jobs(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    _one_step_trace(d / "rank0.json", device="NVIDIA A100", world=8, rank=0)
    _one_step_trace(d / "rank1.json", t0=3.6e9, device="Tesla V100", world=2, rank=1)
    r = cli("inspect", d)
    assert r.returncode == 0
    assert "may come from different jobs" in r.stderr
    assert "world sizes" in r.stderr and "devices" in r.stderr and "min apart" in r.stderr
    assert "hermes diff" in r.stderr


def test_no_jobs_warning_for_ranks_of_one_job(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    _one_step_trace(d / "rank0.json", device="A100", world=2, rank=0)
    _one_step_trace(d / "rank1.json", t0=20.0, device="A100", world=2, rank=1)
    assert "different jobs" not in cli("inspect", d).stderr


def test_warning_for_two_runs_appended_in_one_run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    text = (TWO / "rank0.jsonl").read_text()
    (d / "rank0.jsonl").write_text(text + text)
    r = cli("advise", d, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "holds 2 runs appended" in r.stderr and "own RUN_DIR" in r.stderr
    assert any("holds 2 runs appended" in w for w in json.loads(r.stdout)["warnings"])
    assert "appended" in cli("analyze", d, "-k", "monitor_steps").stderr
    clean = cli("advise", TWO, "--format", "json")
    assert "appended" not in clean.stderr


@needs_shared()
def test_dlrm_warns_of_its_single_step():
    r = cli("inspect", SHARED / "param/dlrm_kineto_8rank")
    assert "rank(s) 0-7: a single profiled step" in r.stderr
    assert "different jobs" not in r.stderr


@pytest.mark.parametrize("cmd", [
    ("advise", EXAMPLE), ("diff", EXAMPLE, EXAMPLE), ("annotate", EXAMPLE), ("schema", "report"), ("schema", "facts"),
])  # fmt: skip
def test_an_output_that_cannot_be_written_is_refused_before_the_analysis(tmp_path, cmd):
    """-o into a missing directory, or onto a directory: one line, exit 2, nothing written
    (issue 37, item 5)."""
    missing = tmp_path / "no_such_dir" / "out.json"
    msg = one_line_error(cli(*cmd, "-o", missing), 2)
    assert "does not exist" in msg and not missing.parent.exists()
    if cmd[0] != "annotate":  # annotate writes one file per rank into a directory it is given
        msg = one_line_error(cli(*cmd, "-o", tmp_path), 2)
        assert "is a directory" in msg


def test_a_newline_in_a_file_name_cannot_forge_a_line(tmp_path):
    """A directory named with a newline and a fake error: the one error line keeps it on one line
    (the newline shown as a space), so stderr holds exactly one 'hermes: error:' line (issue 37)."""
    d = tmp_path / "runs\nhermes: error: forged"
    d.mkdir()
    r = cli("advise", d)
    assert r.returncode != 0
    assert len([x for x in r.stderr.splitlines() if x.startswith("hermes:")]) == 1, r.stderr


@pytest.mark.parametrize(("given", "starts"), [("markdown", "# hermes report"), ("HTML", "<!DOCTYPE html>"),
                                               ("Md", "# hermes report"), ("JSON", "{")])  # fmt: skip
def test_format_names_are_case_blind_and_markdown_is_md(given, starts):
    r = cli("advise", EXAMPLE, "--format", given)  # issue 36: both were refused
    assert r.returncode == 0 and r.stdout.startswith(starts), r.stderr[-300:]


def test_an_id_with_fewer_zeros_suggests_its_number_first():
    msg = one_line_error(cli("kb", "show", "C-IO-01"), 2)  # issue 36: C-IO-001 came last
    assert "(did you mean C-IO-001," in msg


def test_the_main_job_is_listed_first():
    out = cli("--help").stdout
    assert out.index("advise") < out.index("diff") < out.index("inspect")  # issue 36: inspect came first
