"""Bad input: one line naming the file and the problem, a documented exit code, no traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

import hermes_kb
from conftest import X, write_trace
from hermes_kb.core.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES, EXIT_NOT_FOUND

GOOD = [X("cpu_op", "aten::add", 0, 5)]


def make(tmp_path, kind):
    p = tmp_path / "rank0.json"
    if kind == "missing":
        return tmp_path / "nope.json.gz", EXIT_NOT_FOUND, "no such file"
    if kind == "empty":
        p.write_bytes(b"")
        return p, EXIT_BAD_INPUT, "empty file"
    if kind == "empty_gz":
        p = tmp_path / "rank0.json.gz"
        p.write_bytes(gzip.compress(b""))
        return p, EXIT_BAD_INPUT, "empty file"
    if kind == "truncated_gz":
        p = tmp_path / "rank0.json.gz"
        data = gzip.compress(json.dumps({"traceEvents": GOOD * 200}).encode())
        p.write_bytes(data[: len(data) // 2])
        return p, EXIT_BAD_INPUT, "truncated gzip"
    if kind == "invalid_json":
        p.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op",')
        return p, EXIT_BAD_INPUT, "invalid JSON"
    if kind == "not_a_trace":
        p.write_text(json.dumps({"hello": "world"}))
        return p, EXIT_BAD_INPUT, "not a profiler trace"
    if kind == "events_not_list":
        p.write_text(json.dumps({"traceEvents": {"a": 1}}))
        return p, EXIT_BAD_INPUT, "not a profiler trace"
    if kind == "ill_typed_ts":
        write_trace(p, [*GOOD, {"ph": "X", "cat": "kernel", "name": "k", "ts": {"x": 1}, "dur": 3}])
        return p, EXIT_BAD_INPUT, "event #1 field ts"
    if kind == "missing_ts":
        write_trace(p, [*GOOD, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 3}])
        return p, EXIT_BAD_INPUT, "'aten::mm' has a missing or non-numeric 'ts'"
    if kind == "non_numeric_ts":
        write_trace(p, [*GOOD, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", "dur": 3}])
        return p, EXIT_BAD_INPUT, "non-numeric 'ts'"
    if kind == "ill_typed_args":
        write_trace(p, [*GOOD, X("kernel", "k", 1, 1, args={"correlation": "abc"})])
        return p, EXIT_BAD_INPUT, "ill-typed args in a kernel event"
    if kind == "no_events":
        write_trace(p, [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}])
        return p, EXIT_BAD_INPUT, "no profiler events"
    if kind == "empty_dir":
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "notes.txt").write_text("hi")
        return tmp_path / "d", EXIT_NO_TRACES, "holds no trace files"
    raise AssertionError(kind)


KINDS = ["missing", "empty", "empty_gz", "truncated_gz", "invalid_json", "not_a_trace", "events_not_list",
         "ill_typed_ts", "missing_ts", "non_numeric_ts", "ill_typed_args", "no_events", "empty_dir"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_library_raises_hermes_error(tmp_path, kind):
    path, code, text = make(tmp_path, kind)
    with pytest.raises(hermes_kb.HermesError) as info:
        hermes_kb.load(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg and text in msg
    assert info.value.exit_code == code


@pytest.mark.parametrize("kind", KINDS)
def test_cli_prints_one_line_and_exit_code(tmp_path, kind):
    path, code, text = make(tmp_path, kind)
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "inspect", str(path)], capture_output=True, text=True)
    assert out.returncode == code
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hermes: error: ") and text in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_damaged_rank_is_reported_and_skipped(tmp_path):
    for r in range(3):
        write_trace(tmp_path / f"rank{r}.json", GOOD, distributedInfo={"rank": r})
    (tmp_path / "rank3.json").write_bytes(b"{broken")
    b = hermes_kb.load(tmp_path)
    assert b.rank_ids == [0, 1, 2]
    assert len(b.problems) == 1 and "rank3.json" in b.problems[0].message and "invalid JSON" in b.problems[0].message
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "inspect", "-f", "json", str(tmp_path)],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0
    assert "skipped" in out.stderr and "rank3.json" in out.stderr
    assert [r["rank"] for r in json.loads(out.stdout)["ranks"]] == [0, 1, 2]


def test_all_ranks_damaged(tmp_path):
    (tmp_path / "rank0.json").write_bytes(b"")
    (tmp_path / "rank1.json").write_bytes(b"[")
    with pytest.raises(hermes_kb.NoTracesError) as info:
        hermes_kb.load(tmp_path)
    assert "none of the 2 trace files" in str(info.value)
