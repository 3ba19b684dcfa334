"""torch_npu's sqlite export (ascend_pytorch_profiler_N.db + analysis.db) into the RankTrace:
numbers checked against plain sqlite3 queries, frames against the text export of the same
workload, exact mapping on a tiny synthetic db, and damaged / partial inputs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

from hermes_kb.core.errors import BadTraceError
from hermes_kb.trace.ascend.reader import parse_ascend
from hermes_kb.trace.ascend.files import find_ascend_ranks

DB_SET = SHARED / "ascend" / "msinsight_pt_db_level1_2rank"
TEXT_SET = SHARED / "ascend" / "msinsight_pt_text_level1_2rank"
needs_ascend = pytest.mark.skipif(not DB_SET.is_dir() or not TEXT_SET.is_dir(),
                                  reason="../shared/data/ascend is absent (outside the project's CI)")  # fmt: skip


def _q(db: Path, sql: str):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _load(path: Path):
    (af,) = find_ascend_ranks(path)
    return parse_ascend(af)


# ---- the real export -------------------------------------------------------------------------


@needs_ascend
@pytest.mark.parametrize("rank", [0, 1])
def test_db_numbers_match_sqlite(rank):
    out = DB_SET / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    db, an = out / f"ascend_pytorch_profiler_{rank}.db", out / "analysis.db"
    tr, first = _load(DB_SET / f"rank{rank}_ascend_pt")
    assert tr.meta.flags["export"] == "db" and tr.meta.format == "ascend"
    assert tr.meta.device_name == _q(db, "SELECT name FROM NPU_INFO")[0][0]
    assert tr.meta.distributed_info["rank"] == rank

    # device compute tasks: TASK joined with COMPUTE_TASK_INFO
    (n_comp, comp_ns), = _q(db, "SELECT count(*), sum(t.endNs - t.startNs) FROM TASK t "
                                "JOIN COMPUTE_TASK_INFO c ON c.globalTaskId = t.globalTaskId")  # fmt: skip
    k = tr.kernels
    comp = k[k["task_type"].astype(str) != "HCCL"]
    assert len(comp) == n_comp
    assert comp["dur"].sum() == pytest.approx(comp_ns / 1000.0, abs=1e-3)
    # the profiler's own "Computing" intervals cover exactly these tasks
    if _q(db, "SELECT count(*) FROM sqlite_master WHERE name = 'OVERLAP_ANALYSIS'")[0][0]:  # rank 1 has none
        (ov_ns,), = _q(db, "SELECT sum(endNs - startNs) FROM OVERLAP_ANALYSIS WHERE type = 0")
        assert comp["dur"].sum() == pytest.approx(ov_ns / 1000.0, abs=1e-3)
    else:
        assert "npu_overlap" not in tr.extras
    names = sorted(r[0] for r in _q(db, "SELECT s.value FROM COMPUTE_TASK_INFO c JOIN STRING_IDS s ON s.id = c.name"))
    assert sorted(comp["name"].astype(str)) == names
    (n_pmu_tasks,), = _q(db, "SELECT count(DISTINCT globalTaskId) FROM TASK_PMU_INFO")
    assert int(comp["aic_mac_ratio"].notna().sum()) == n_pmu_tasks
    assert (comp["ext_id"] >= 0).all()  # every compute task has its host operator

    # HCCL ops and their elapse
    hccl = _q(db, "SELECT count(*), sum(endNs - startNs), min(startNs) FROM COMMUNICATION_OP")[0]
    assert len(tr.collectives) == hccl[0] == int((k["task_type"].astype(str) == "HCCL").sum())
    assert tr.collectives["dur"].sum() == pytest.approx(hccl[1] / 1000.0, abs=1e-3)
    assert tr.collectives["ts"].min() + first == pytest.approx(hccl[2] / 1000.0, abs=0.5)
    (n_ctask,), = _q(db, "SELECT count(*) FROM COMMUNICATION_TASK_INFO")
    assert len(tr.extras["hccl_tasks"]) == n_ctask if "hccl_tasks" in tr.extras else True
    (elapse_ms,), = _q(an, "SELECT sum(elapse_time) FROM CommAnalyzerTime")
    assert tr.extras["comm_ops"]["dur"].sum() == pytest.approx(elapse_ms * 1000.0, rel=1e-9)
    assert (tr.collectives["stream"] >= 0).all() and (tr.collectives["group_size"] == 8).all()

    # host side
    (n_cann,), = _q(db, "SELECT count(*) FROM CANN_API")
    assert len(tr.runtime) == n_cann
    (n_launch,), = _q(db, "SELECT count(*) FROM CANN_API a JOIN STRING_IDS s ON s.id = a.name WHERE s.value = 'launch'")
    assert int((tr.runtime["kind"].astype(str) == "launch").sum()) == n_launch
    (n_ops,), = _q(db, "SELECT count(*) FROM PYTORCH_API WHERE type = 50001")
    assert len(tr.cpu_ops) + len(tr.annotations) == n_ops
    (n_py,), = _q(db, "SELECT count(*) FROM PYTORCH_API WHERE type = 50003")
    assert len(tr.python) == n_py
    (n_copy,), = _q(db, "SELECT count(*) FROM TASK t JOIN STRING_IDS s ON s.id = t.taskType WHERE s.value = 'MEMCPY_ASYNC'")
    assert len(tr.memcpy) == n_copy
    (n_mem,), = _q(db, "SELECT (SELECT count(*) FROM MEMORY_RECORD) + (SELECT count(*) FROM NPU_MEM)")
    assert len(tr.memory) == n_mem

    # the step: ProfilerStep#N on the host, STEP_TIME in the db
    (sid, s0, s1), = _q(db, "SELECT id, startNs, endNs FROM STEP_TIME")
    assert tr.steps["step"].tolist() == [sid]
    assert tr.steps["ts"].iloc[0] + first == pytest.approx(s0 / 1000.0, abs=0.5)
    assert tr.steps["end"].iloc[0] + first == pytest.approx(s1 / 1000.0, abs=0.5)
    assert set(comp["step"].tolist()) == {sid}
    st = tr.extras["step_stats"]
    (computing,), = _q(an, "SELECT computing FROM StepTraceTime")
    assert st["step"].tolist() == [sid] and st["computing_us"].iloc[0] == pytest.approx(computing)
    (n_matrix,), = _q(an, "SELECT count(*) FROM CommAnalyzerMatrix")
    assert len(tr.extras["comm_matrix"]) == n_matrix


@needs_ascend
def test_db_frames_shaped_like_text_export():
    db, _ = _load(DB_SET / "rank0_ascend_pt")
    text, _ = _load(TEXT_SET / "rank0_ascend_pt")
    for name in ("cpu_ops", "python", "annotations", "gpu_annotations", "runtime", "memcpy", "syncs", "memory", "steps",
                 "collectives", "links"):  # fmt: skip
        a, b = getattr(db, name), getattr(text, name)
        assert list(a.columns) == list(b.columns), name
        assert [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes], name
    # kernels: the same columns and dtypes, but the pipe metrics follow the aic_metrics of each run and
    # cube_utilization(%) needs the core count, which the db does not hold
    ka, kb = db.kernels, text.kernels
    assert set(kb.columns) - set(ka.columns) == {"cube_utilization_pct"}
    for c in kb.columns:
        if c in ka.columns:
            assert str(ka[c].dtype) == str(kb[c].dtype), c
    assert set(db.extras) == set(text.extras)
    for k, b in text.extras.items():
        a = db.extras[k]
        assert list(a.columns) == list(b.columns), k
        assert [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes], k
    # the same workload, another collection run: the same shapes and per-category counts
    for name in ("cpu_ops", "python", "annotations", "kernels", "memcpy", "collectives", "links"):
        assert len(getattr(db, name)) == len(getattr(text, name)), name
    by_core = lambda tr: tr.kernels.groupby(tr.kernels["core_type"].astype(str)).size().to_dict()  # noqa: E731
    assert by_core(db) == by_core(text)
    assert abs(len(db.runtime) - len(text.runtime)) <= 5
    assert len(db.extras["npu_overlap"]) == len(text.extras["npu_overlap"])
    assert db.extras["npu_overlap"].groupby("name").size().to_dict() == text.extras["npu_overlap"].groupby("name").size().to_dict()


# ---- a tiny synthetic db: the exact mapping --------------------------------------------------

_S = {1: "ProfilerStep#3", 2: "aten::mm", 3: "launch", 4: "MatMul_0", 5: "MatMul", 6: "AI_CORE", 7: "KERNEL_AICORE",
      8: "MEMCPY_ASYNC", 9: "aclrtMemcpyAsync", 10: "2,2;2,2", 11: "FLOAT;FLOAT", 12: "ND;ND", 13: "2,2", 14: "FLOAT",
      15: "ND", 16: "aic_mac_ratio", 17: "aic_total_time", 18: "hcom_allReduce__1_0_1", 19: "grp", 20: "RING",
      21: "Memcpy", 22: "SDMA", 23: "PTA"}  # fmt: skip
T0 = 1_700_000_000_000_000_000  # ns


def _tiny_db(path: Path, drop: tuple[str, ...] = ()) -> Path:
    con = sqlite3.connect(path)
    ddl = {
        "STRING_IDS": "id INTEGER PRIMARY KEY, value TEXT",
        "ENUM_API_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
        "NPU_INFO": "id INTEGER, name TEXT",
        "PYTORCH_API": "startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER, sequenceNumber INTEGER, "
                       "fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER, type INTEGER, depth INTEGER",
        "CONNECTION_IDS": "id INTEGER, connectionId INTEGER",
        "CANN_API": "startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER, connectionId INTEGER PRIMARY KEY, name INTEGER, depth INTEGER",
        "TASK": "startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, globalTaskId INTEGER, globalPid INTEGER, "
                "taskType INTEGER, contextId INTEGER, streamId INTEGER, taskId INTEGER, modelId INTEGER, depth INTEGER",
        "COMPUTE_TASK_INFO": "name INTEGER, globalTaskId INTEGER PRIMARY KEY, blockDim INTEGER, mixBlockDim INTEGER, taskType INTEGER, "
                             "opType INTEGER, inputFormats INTEGER, inputDataTypes INTEGER, inputShapes INTEGER, outputFormats INTEGER, "
                             "outputDataTypes INTEGER, outputShapes INTEGER, attrInfo INTEGER, waitNs INTEGER",
        "TASK_PMU_INFO": "globalTaskId INTEGER, name INTEGER, value NUMERIC",
        "COMMUNICATION_OP": "opName INTEGER, startNs INTEGER, endNs INTEGER, connectionId INTEGER, groupName INTEGER, opId INTEGER PRIMARY KEY, "
                            "relay INTEGER, retry INTEGER, dataType INTEGER, algType INTEGER, count NUMERIC, opType INTEGER, waitNs INTEGER",
        "COMMUNICATION_TASK_INFO": "name INTEGER, globalTaskId INTEGER, taskType INTEGER, planeId INTEGER, groupName INTEGER, notifyId INTEGER, "
                                   "rdmaType INTEGER, srcRank INTEGER, dstRank INTEGER, transportType INTEGER, size INTEGER, dataType INTEGER, "
                                   "linkType INTEGER, opId INTEGER",
        "ENUM_HCCL_DATA_TYPE": "id INTEGER PRIMARY KEY, name TEXT",
        "STEP_TIME": "id INTEGER, startNs INTEGER, endNs INTEGER",
        "MEMORY_RECORD": "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, totalReserved INTEGER, totalActive INTEGER, "
                         "streamPtr INTEGER, deviceId INTEGER",
    }  # fmt: skip
    gtid = (77 << 32) | 78
    rows = {
        "STRING_IDS": list(_S.items()),
        "ENUM_API_TYPE": [(10000, "node"), (20000, "acl"), (50001, "op"), (50002, "queue"), (50003, "trace")],
        "NPU_INFO": [(0, "Ascend910B3")],
        "PYTORCH_API": [(str(T0), str(T0 + 100_000), gtid, None, 1, None, None, None, None, None, 50001, 0),
                        (str(T0 + 10_000), str(T0 + 20_000), gtid, 0, 2, 5, None, 11, 10, None, 50001, 1),
                        (str(T0 + 30_000), str(T0 + 31_000), gtid, 1, 2, 6, None, 11, 10, None, 50001, 1)],
        "CONNECTION_IDS": [(0, 500), (1, 501)],
        "CANN_API": [(T0 + 12_000, T0 + 15_000, 10000, gtid, 500, 3, 0), (T0 + 30_500, T0 + 30_900, 20000, gtid, 501, 9, 0)],
        "TASK": [(T0 + 40_000, T0 + 42_500, 0, 500, 1, 77, 7, 4294967295, 2, 11, 4294967295, 0),
                 (T0 + 43_000, T0 + 43_250, 0, 501, 2, 77, 8, 4294967295, 2, 12, 4294967295, 0),
                 (T0 + 50_000, T0 + 50_400, 0, 502, 3, 77, 22, 4294967295, 4, 13, 4294967295, 0)],
        "COMPUTE_TASK_INFO": [(4, 1, 8, 0, 6, 5, 12, 11, 10, 15, 14, 13, 0, 1_500)],
        "TASK_PMU_INFO": [(1, 16, 0.75), (1, 17, 2.25)],
        "COMMUNICATION_OP": [(18, T0 + 49_000, T0 + 60_000, 502, 19, 1, 0, 0, 4, 20, 1024, 18, 0)],
        "COMMUNICATION_TASK_INFO": [(18, 3, 21, 0, 19, 0, 65535, 0, 1, 0, 4096, 4, 1, 1)],
        "ENUM_HCCL_DATA_TYPE": [(4, "FP32")],
        "STEP_TIME": [(3, T0, T0 + 100_000)],
        "MEMORY_RECORD": [(23, T0 + 5_000, 1 << 20, 2 << 20, 1 << 20, 0, 0)],
    }
    for t, cols in ddl.items():
        if t in drop:
            continue
        con.execute(f"CREATE TABLE {t} ({cols})")
        if rows.get(t):
            con.executemany(f"INSERT INTO {t} VALUES ({', '.join('?' * len(rows[t][0]))})", rows[t])
    con.commit()
    con.close()
    return path


def _rank_dir(tmp_path: Path) -> Path:
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    return out


def test_tiny_db_exact_mapping(tmp_path):
    out = _rank_dir(tmp_path)
    _tiny_db(out / "ascend_pytorch_profiler_0.db")
    tr, first = _load(tmp_path / "rank0_ascend_pt")
    assert first == T0 / 1000.0
    assert tr.meta.device_name == "Ascend910B3" and tr.meta.flags["export"] == "db"
    assert any("no analysis.db" in w for w in tr.warnings)
    # host: the step annotation and two operators on thread 78 of process 77
    assert tr.annotations["name"].astype(str).tolist() == ["ProfilerStep#3"] and tr.annotations["step"].tolist() == [3]
    ops = tr.cpu_ops
    assert ops["name"].astype(str).tolist() == ["aten::mm", "aten::mm"]
    assert ops["ts"].tolist() == [10.0, 30.0] and ops["dur"].tolist() == [10.0, 1.0]
    assert ops["tid"].tolist() == [78, 78] and ops["pid"].tolist() == [77, 77] and ops["seq"].tolist() == [5, 6]
    assert ops["input_dims"].astype(str).tolist() == ["2,2;2,2"] * 2
    # CANN calls
    rt = tr.runtime
    assert rt["name"].astype(str).tolist() == ["Node@launch", "AscendCL@aclrtMemcpyAsync"]
    assert rt["kind"].astype(str).tolist() == ["launch", "memcpy"] and rt["correlation"].tolist() == [500, 501]
    # the compute task with its COMPUTE_TASK_INFO and TASK_PMU_INFO columns; the HCCL op after it
    k = tr.kernels
    assert k["name"].astype(str).tolist() == ["MatMul_0", "hcom_allReduce__1_0_1"]
    kk = k.iloc[0]
    assert (kk["ts"], kk["dur"], kk["stream"], kk["task_id"], kk["block_dim"]) == (40.0, 2.5, 2, 11, 8)
    assert (str(kk["op_type"]), str(kk["core_type"]), str(kk["task_type"])) == ("MatMul", "AI_CORE", "AI_CORE")
    assert (str(kk["input_shapes"]), str(kk["output_dtypes"]), str(kk["input_formats"])) == ("2,2;2,2", "FLOAT", "ND;ND")
    assert kk["wait_us"] == 1.5 and kk["aic_mac_ratio"] == 0.75 and kk["aicore_time_us"] == 2.25
    assert kk["step"] == 3 and kk["context_id"] == -1 and kk["correlation"] == 500
    assert kk["ext_id"] == ops["ext_id"].iloc[0]  # issued by the first aten::mm (connection 0 -> 500)
    # the copy: MEMCPY_ASYNC, linked to the second operator
    assert len(tr.memcpy) == 1 and tr.memcpy["ts"].iloc[0] == 43.0 and tr.memcpy["ext_id"].iloc[0] == ops["ext_id"].iloc[1]
    # the collective
    c = tr.collectives.iloc[0]
    assert (c["ts"], c["dur"], c["stream"], str(c["kind"]), str(c["dtype"]), c["in_nelems"], c["in_bytes"]) == \
        (49.0, 11.0, 4, "all_reduce", "FP32", 1024, 4096)  # fmt: skip
    ht = tr.extras["hccl_tasks"] if "hccl_tasks" in tr.extras else None
    if ht is not None:
        assert len(ht) == 1
    # memory and steps
    m = tr.memory.iloc[0]
    assert (m["ts"], m["total_allocated"], m["total_reserved"]) == (5.0, 1 << 20, 2 << 20)
    assert tr.steps[["step", "ts", "end"]].values.tolist() == [[3, 0.0, 100.0]]
    assert len(tr.links) == 2


def test_tiny_db_optional_tables_missing(tmp_path):
    out = _rank_dir(tmp_path)
    _tiny_db(out / "ascend_pytorch_profiler_0.db", drop=("CANN_API", "TASK_PMU_INFO", "COMMUNICATION_OP", "MEMORY_RECORD"))
    tr, _ = _load(tmp_path / "rank0_ascend_pt")
    assert len(tr.runtime) == 0 and len(tr.collectives) == 0 and len(tr.memory) == 0
    assert len(tr.kernels) == 1 and "aic_mac_ratio" not in tr.kernels.columns
    assert any("CANN_API" in w for w in tr.warnings)


def test_tiny_db_without_string_ids_is_one_line_error(tmp_path):
    out = _rank_dir(tmp_path)
    _tiny_db(out / "ascend_pytorch_profiler_0.db", drop=("STRING_IDS",))
    with pytest.raises(BadTraceError) as ei:
        _load(tmp_path / "rank0_ascend_pt")
    msg = str(ei.value)
    assert "STRING_IDS" in msg and "ascend_pytorch_profiler_0.db" in msg and "\n" not in msg


def _analysis_db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StepTraceTime (step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC, overlapped NUMERIC, "
                "communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC, "
                "communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC)")  # fmt: skip
    con.execute("INSERT INTO StepTraceTime VALUES ('7', 100, 20, 5, 25, 10, 130, 0, 20, 3)")
    con.execute("CREATE TABLE CommAnalyzerTime (hccl_op_name TEXT, group_name TEXT, start_timestamp NUMERIC, elapse_time NUMERIC, "
                "transit_time NUMERIC, wait_time NUMERIC, synchronization_time NUMERIC, idle_time NUMERIC, step TEXT, type TEXT)")  # fmt: skip
    con.execute("INSERT INTO CommAnalyzerTime VALUES ('hcom_allGather__9_0_1', '123', 1000.5, 0.25, 0.1, 0.1, 0.05, 0.05, 'step7', 'collective')")
    con.execute("CREATE TABLE CommAnalyzerBandwidth (hccl_op_name TEXT, group_name TEXT, transport_type TEXT, transit_size NUMERIC, "
                "transit_time NUMERIC, bandwidth NUMERIC, large_packet_ratio NUMERIC, package_size NUMERIC, count NUMERIC, "
                "total_duration NUMERIC, step TEXT, type TEXT)")  # fmt: skip
    con.execute("INSERT INTO CommAnalyzerBandwidth VALUES ('hcom_allGather__9_0_1', '123', 'HCCS', 2.0, 0.1, 20.0, 0, 1.0, 2, 0.1, 'step7', 'collective')")
    con.commit()
    con.close()
    return path


def test_analysis_db_only(tmp_path):
    out = _rank_dir(tmp_path)
    _analysis_db(out / "analysis.db")
    tr, first = _load(tmp_path / "rank0_ascend_pt")
    assert first == 1000.5 and tr.meta.flags["export"] == "db"
    assert len(tr.collectives) == 1 and tr.collectives["dur"].iloc[0] == 250.0
    assert str(tr.collectives["kind"].iloc[0]) == "all_gather" and str(tr.collectives["link_type"].iloc[0]) == "HCCS"
    ops = tr.extras["comm_ops"]
    assert ops[["transit_us", "wait_us", "sync_us", "hccs_bytes", "hccs_gbps"]].values.tolist() == [[100.0, 100.0, 50.0, 2e6, 20.0]]
    assert ops["wait_ratio"].iloc[0] == 0.5 and tr.extras["comm_packets"]["count"].tolist() == [2.0]
    st = tr.extras["step_stats"]
    assert st["step"].tolist() == [7] and st["computing_us"].tolist() == [100.0] and st["preparing_us"].tolist() == [3.0]


def test_analysis_db_fills_what_text_files_lack(tmp_path):
    out = _rank_dir(tmp_path)
    _analysis_db(out / "analysis.db")
    (out / "step_trace_time.csv").write_text("Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,"
                                             "Bubble,Communication(Not Overlapped and Exclude Receive),Preparing\n"
                                             "7,1,2,3,4,5,6,0,2,1\n")  # fmt: skip
    tr, _ = _load(tmp_path / "rank0_ascend_pt")
    assert tr.meta.flags["export"] == "text"
    assert tr.extras["step_stats"]["computing_us"].tolist() == [1.0]  # the csv wins
    assert len(tr.collectives) == 1  # from analysis.db: the text files have no communication.json


# ---- damaged files through the CLI -----------------------------------------------------------


def _hermes(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hermes_kb.cli", *args], capture_output=True, text=True, env=env)


def test_corrupt_db_is_one_line_error(tmp_path):
    out = _rank_dir(tmp_path)
    (out / "ascend_pytorch_profiler_0.db").write_bytes(np.random.default_rng(0).bytes(4096))
    res = _hermes("inspect", str(tmp_path / "rank0_ascend_pt"))
    text = res.stdout + res.stderr
    assert res.returncode != 0
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if "ascend_pytorch_profiler_0.db" in ln]
    assert lines and "sqlite" in lines[0]


def test_corrupt_analysis_db_alone_is_one_line_error(tmp_path):
    out = _rank_dir(tmp_path)
    (out / "analysis.db").write_bytes(b"not a database at all" * 50)
    with pytest.raises(BadTraceError) as ei:
        _load(tmp_path / "rank0_ascend_pt")
    assert "analysis.db" in str(ei.value) and "\n" not in str(ei.value)
