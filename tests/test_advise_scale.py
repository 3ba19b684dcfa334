"""`hermes advise` with --workers, --sample and --dask (docs/scale.md), end to end through the CLI."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from conftest import SHARED

DLRM = SHARED / "param" / "dlrm_kineto_8rank"
needs_dlrm = pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/data is absent (outside the project's CI)")


def advise(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", *args], capture_output=True, text=True,
                          env=env)  # fmt: skip


def _step_ms_by_rank() -> dict[int, float]:
    """Each DLRM rank's ProfilerStep duration, read with json (not hermes)."""
    out = {}
    for f in DLRM.iterdir():
        doc = json.loads(gzip.decompress(f.read_bytes()))
        durs = [e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        out[doc["distributedInfo"]["rank"]] = sum(durs) / len(durs)
    return out


@needs_dlrm
def test_dask_json_equals_the_local_run_byte_for_byte(tmp_path):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
    local = advise(str(DLRM), "--format", "json", "--workers", "2")
    assert local.returncode == 0, local.stderr
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster:  # fmt: skip
        remote = advise(str(DLRM), "--format", "json", "--dask", cluster.scheduler_address)
        env = {**__import__("os").environ, "HERMES_DASK_SCHEDULER": cluster.scheduler_address}
        from_env = advise(str(DLRM), "--format", "json", env=env)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert from_env.stdout == local.stdout
    report = json.loads(local.stdout)
    assert report["inputs"]["ranks"] == list(range(8)) and report["inputs"]["sample"] is None


@needs_dlrm
def test_sample_reads_the_slowest_and_fastest_and_says_what_it_left(tmp_path):
    steps = _step_ms_by_rank()
    slowest, fastest = max(steps, key=steps.get), min(steps, key=steps.get)
    out = advise(str(DLRM), "--format", "json", "--sample", "3")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    sample = report["inputs"]["sample"]
    assert sample["ranks_total"] == 8
    assert len(report["inputs"]["ranks"]) == 3 and {str(r) for r in report["inputs"]["ranks"]} == set(sample["read"])
    assert {str(slowest), str(fastest)} <= set(sample["read"])
    assert any(w.startswith("sampled 3 of 8 ranks") for w in report["warnings"])
    assert any("full pass would add" in w and "other 5 ranks" in w for w in report["warnings"])
    mean_ms = sum(steps.values()) / len(steps) / 1e3
    assert any(f"mean step {mean_ms:,.3f} ms" in w for w in report["warnings"])


@needs_dlrm
def test_a_damaged_rank_is_one_line_and_the_others_are_advised(tmp_path):
    for f in sorted(DLRM.iterdir())[:3]:
        (tmp_path / f.name).symlink_to(f)
    bad = tmp_path / "worker3_step_12.pt.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    out = advise(str(tmp_path), "--format", "json", "--workers", "2")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    lines = [x for x in out.stderr.splitlines() if str(bad) in x]
    assert len(lines) == 1 and lines[0].startswith("hermes: warning: skipped")
    report = json.loads(out.stdout)
    assert report["inputs"]["ranks"] == [0, 1, 2] and report["inputs"]["skipped"] == [str(bad)]


def test_dask_without_the_extra_is_one_line(tmp_path):
    # a `distributed` that cannot be imported, put first on the path of the child process
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "distributed.py").write_text("raise ImportError('no distributed here')\n")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    env = {**__import__("os").environ, "PYTHONPATH": str(shadow)}
    out = advise(str(trace), str(trace), "--dask", "tcp://127.0.0.1:8786", env=env)
    assert out.returncode == 7  # the environment, not the input (issue 36: it was 4, an unreadable trace)
    assert out.stderr.strip() == ("hermes: error: --dask needs dask.distributed, which is not installed: "
                                  "pip install 'hermes-kb[dask]'")  # fmt: skip
