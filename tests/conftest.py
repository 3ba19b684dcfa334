from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest

# the knowledge-base cache (hermes_kb/kb/cache.py) of this test session, not the user's ~/.cache
os.environ.setdefault("HERMES_CACHE_DIR", tempfile.mkdtemp(prefix="hermes-test-cache-"))

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
EXAMPLE = ROOT / "examples" / "traces" / "cpu_dataloader_bound.json.gz"


def kineto_traces() -> list[Path]:
    """Every Kineto trace in ../shared/data (empty when the folder is absent)."""
    if not SHARED.is_dir():
        return []
    out = []
    for sub in ("hta", "tracelens", "param"):
        out.extend(sorted((SHARED / sub).rglob("*.json.gz")))
    return out


def needs_shared():
    return pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent (outside the project's CI)")


@pytest.fixture
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/data is absent (outside the project's CI)")
    return SHARED


def write_trace(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(doc).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def ascend_x(pid: int, name: str, ts: float, dur: float, cat: str | None = None, tid: int = 7) -> dict:
    """An event of a torch_npu trace_view.json (timestamps as strings, as torch_npu writes them)."""
    e = {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": f"{ts:.3f}", "dur": dur, "args": {}}
    if cat:
        e["cat"] = cat
    return e


def X(cat: str, name: str, ts, dur, pid=1, tid=1, args: dict | None = None) -> dict:
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def in_fresh_process(code: str, timeout: float = 300) -> str:
    """Run ``code`` in a new interpreter (tests/ on its path) and return its stdout; a failure
    there fails here with its stderr. For what needs ``fork``: after a test has started Dask
    (its threads stay for the process's life), hermes no longer forks in this one."""
    import subprocess
    import sys
    import textwrap

    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=here, capture_output=True, text=True,
                         timeout=timeout, env={**__import__("os").environ, "PYTHONPATH": here})  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


_SLOW = {line.strip() for line in (ROOT / "tests" / "slow_tests.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")}  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """The `slow` tier (README, "Tests"): the ids listed in tests/slow_tests.txt."""
    for item in items:
        if item.nodeid in _SLOW:
            item.add_marker(pytest.mark.slow)
