"""The per-rank stage on a Dask cluster (hermes_kb/scale/on_dask.py): the same facts as the local
pool, a damaged rank reported by name, and a clean error without the extra installed."""

from __future__ import annotations

import gzip
import sys

import pytest

from hermes_kb.scale import jobs
from hermes_kb.scale.on_dask import DaskUnavailableError, analyse_on_dask
from hermes_kb.trace import discover

from conftest import SHARED

DLRM = SHARED / "param" / "dlrm_kineto_8rank"
needs_dlrm = pytest.mark.skipif(not DLRM.is_dir(), reason="../shared/data is absent (outside the project's CI)")


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as c:  # fmt: skip
        yield c


def _dumps(job) -> list[str]:
    return [f.model_dump_json() for f in job.facts]


@needs_dlrm
def test_dask_run_equals_the_local_pool(cluster, tmp_path):
    for f in sorted(DLRM.iterdir())[:4]:
        (tmp_path / f.name).symlink_to(f)
    bad = tmp_path / "worker5_step_12.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b"not json"))
    files = discover(str(tmp_path))
    local = jobs.analyse_files(files, workers=2)
    remote = analyse_on_dask(files, cluster.scheduler_address)
    try:
        assert _dumps(remote) == _dumps(local)
        assert sorted(remote.replay) == sorted(local.replay) == [0, 1, 2, 3]
        assert remote.bundle.rank_ids == [0, 1, 2, 3]
        assert [p.path for p in remote.bundle.problems] == [str(bad)]
        assert remote.bundle.problems[0].message == local.bundle.problems[0].message
    finally:
        local.replay.close()
        remote.replay.close()


def test_without_distributed_the_error_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(DaskUnavailableError) as err:
        analyse_on_dask(["x.json"], "tcp://127.0.0.1:8786")
    assert "pip install 'hermes-kb[dask]'" in str(err.value) and "\n" not in str(err.value)


def test_an_unreachable_scheduler_is_a_clean_error(monkeypatch):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (the dask extra)")
    monkeypatch.setattr("hermes_kb.scale.on_dask.CONNECT_TIMEOUT_S", 1)
    with pytest.raises(DaskUnavailableError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        analyse_on_dask(["x.json"], "tcp://127.0.0.1:9")
