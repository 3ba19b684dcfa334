"""torch_npu profiler output (*_ascend_pt) into the TraceBundle.

Numbers are checked against the files themselves read with the stdlib (json, csv), and against
the profiler's own per-step split (step_trace_time.csv), which the Ascend tooling computed
independently of hermes.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_kb
from conftest import SHARED
from hermes_kb.core.errors import BadTraceError, HermesError, NoTracesError

ASCEND = SHARED / "ascend"
L1 = ASCEND / "msinsight_pt_text_level1_2rank"
L0 = ASCEND / "msinsight_pt_text_level0_2rank"
ST4 = ASCEND / "msinsight_st_level2_4rank_qwen3_0.6b_pp2"
DB = ASCEND / "msinsight_pt_db_level1_2rank"
UT = ASCEND / "msprof_analyze_ut" / "test"

needs_ascend = pytest.mark.skipif(not ASCEND.is_dir(), reason="../shared/data/ascend is absent (outside the project's CI)")


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _events(rank_dir: Path) -> list[dict]:
    return json.loads((rank_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())


def _procs(events) -> dict:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}


# ---- every directory of the shared Ascend data --------------------------------------------------

LOADABLE = [
    (L0, 2), (L1, 2), (ST4, 4), (DB, 2),
    (UT / "ut/advisor/timeline_advice", 1), (UT / "ut/advisor/advisor_backend/compute_advice", 1),
    (UT / "ut/advisor/compute_advice/data", 1),
]  # fmt: skip


@needs_ascend
@pytest.mark.parametrize("path,ranks", LOADABLE, ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_every_shared_directory_loads(path, ranks):
    b = hermes_kb.load(path)
    assert len(b) == ranks and not b.problems
    for t in b:
        assert t.meta.format == "ascend"
        assert len(t.kernels) > 0 or len(t.collectives) > 0


@needs_ascend
@pytest.mark.parametrize("path", [UT / "resource/advisor/cluster_analysis_output", ASCEND / "msprof_analyze_ut"])
def test_directories_without_profiler_output_get_a_clear_error(path):
    with pytest.raises(NoTracesError) as exc:
        hermes_kb.load(path)
    msg = str(exc.value)
    assert str(path) in msg and "\n" not in msg


# ---- text export, Level1: values against the files ----------------------------------------------


@needs_ascend
def test_level1_frames_match_the_files():
    b = hermes_kb.load(L1)
    for rank in (0, 1):
        t = b[rank]
        rd = L1 / f"rank{rank}_ascend_pt"
        ev = _events(rd)
        procs = _procs(ev)
        ops = [e for e in ev if e.get("cat") == "cpu_op"]
        ann = [e for e in ops if e["name"].startswith(("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)"))]
        assert len(t.cpu_ops) == len(ops) - len(ann)
        assert len(t.annotations) == len(ann)
        assert len(t.python) == sum(e.get("cat") == "python_function" for e in ev)
        assert len(t.runtime) == sum(e.get("ph") == "X" and procs.get(e["pid"]) == "CANN" for e in ev)
        # compute tasks: exactly the rows of kernel_details.csv, same total time
        kd = [r for r in _csv(rd / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv") if r["Accelerator Core"] not in ("COMMUNICATION", "HCCL")]
        comp = t.kernels[t.kernels["task_type"].astype(str) != "HCCL"]
        assert len(comp) == len(kd)
        # trace_view.json writes durations to 1e-7 µs, the csv to 1e-3: within 0.0005 µs per row
        assert comp["dur"].sum() == pytest.approx(sum(float(r["Duration(us)"]) for r in kd), abs=0.0005 * len(kd))
        assert set(comp["op_type"].astype(str)) == {r["Type"] for r in kd}
        assert int(comp["block_dim"].sum()) == sum(int(r["Block Dim"]) for r in kd)
        # collectives: the HCCL group ops, with communication.json's times
        hccl = [e for e in ev if e.get("ph") == "X" and procs.get(e["pid"]) == "HCCL" and e["tid"] == 0]
        c = t.collectives.sort_values("ts")
        assert list(c["name"].astype(str)) == [e["name"] for e in sorted(hccl, key=lambda e: float(e["ts"]))]
        assert c["dur"].sum() == pytest.approx(sum(e["dur"] for e in hccl), rel=1e-9)
        assert list(c["in_nelems"]) == [e["args"]["count"] for e in sorted(hccl, key=lambda e: float(e["ts"]))]
        comm = json.loads((rd / "ASCEND_PROFILER_OUTPUT" / "communication.json").read_text())["step50"]["collective"]
        for key, info in comm.items():
            if key == "Total Op Info":
                continue
            row = c[c["name"].astype(str) == key.split("@")[0]].iloc[0]
            assert row["wait_us"] == pytest.approx(info["Communication Time Info"]["Wait Time(ms)"] * 1000)
            assert row["hccs_bytes"] == pytest.approx(info["Communication Bandwidth Info"]["HCCS"]["Transit Size(MB)"] * 1e6)
            assert row["link_type"] == "HCCS"
        assert set(c["kind"].astype(str)) == {"all_reduce"}
        # the step
        step = next(e for e in ann if e["name"] == "ProfilerStep#50")
        assert t.steps["step"].tolist() == [50]
        assert t.steps["dur"].iloc[0] == pytest.approx(step["dur"], abs=1e-6)
        # metadata
        info = json.loads(next(rd.glob("profiler_info_*.json")).read_text())
        assert t.rank == info["rank_id"] and t.meta.rank_source == "profiler_info"
        assert t.meta.flags["profiler_level"] == "Level1"
        assert t.meta.env == json.loads((rd / "profiler_metadata.json").read_text())["ENV_VARIABLES"]


@needs_ascend
def test_level1_host_ops_link_to_their_device_tasks():
    """Every compute task is reached by a torch_to_npu flow from the op that issued it."""
    t = hermes_kb.load(L1 / "rank0_ascend_pt")[0]
    ev = _events(L1 / "rank0_ascend_pt")
    starts = {e["id"]: (e["tid"], float(e["ts"])) for e in ev if e.get("cat") == "async_npu" and e["ph"] == "s"}
    ends = {float(e["ts"]): e["id"] for e in ev if e.get("cat") == "async_npu" and e["ph"] == "f"}
    ops = {(e["tid"], float(e["ts"])): e["name"] for e in ev if e.get("cat") == "cpu_op"}
    comp = t.kernels[t.kernels["task_type"].astype(str) != "HCCL"]
    origin = t.meta.origin_us
    ops_by_ext = dict(zip(t.cpu_ops["ext_id"], t.cpu_ops["name"].astype(str)))
    checked = 0
    for ts, ext in zip(comp["ts"] + origin, comp["ext_id"]):
        fid = ends.get(float(ts))
        if fid is None:
            continue
        assert ext >= 0
        # the linked op starts where the flow starts (nested ops may share that start)
        tid, s_ts = starts[fid]
        assert (tid, s_ts) in ops
        row = t.cpu_ops[t.cpu_ops["ext_id"] == ext].iloc[0]
        assert row["ts"] + origin == pytest.approx(s_ts, abs=0.5) and ops_by_ext[ext]
        checked += 1
    assert checked >= 0.9 * len(comp)


@needs_ascend
def test_overlap_matches_the_profilers_own_step_split():
    """compute and communication time per step against step_trace_time.csv (0.25 µs timestamp
    resolution at these magnitudes, so within 1 µs)."""
    b = hermes_kb.load(L1)
    facts = hermes_kb.analyze(b)
    imb = {f.component: f for f in facts if f.kind == "rank_imbalance"}
    for rank in (0, 1):
        row = _csv(L1 / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv")[0]
        assert imb["compute"].per_rank_us[rank] == pytest.approx(float(row["Computing"]), abs=1.0)
        assert imb["communication"].per_rank_us[rank] == pytest.approx(float(row["Communication"]), abs=1.0)
        st = b[rank].extras["step_stats"]
        assert st["computing_us"].iloc[0] == pytest.approx(float(row["Computing"]))
    assert not [f for f in facts if f.kind == "analyzer_error"]


@needs_ascend
def test_hardware_agnostic_analyses_run_on_npu_data():
    for path in (L1, ST4):
        facts = hermes_kb.analyze(path)
        kinds = {f.kind for f in facts}
        assert not [f for f in facts if f.kind == "analyzer_error"]
        assert {"step_overlap", "critical_path", "rank_imbalance", "comm_sync_wait"} <= kinds, path


# ---- ranks without trace_view.json (CANN 8.3, Level2, trimmed) ---------------------------------


@needs_ascend
def test_st4_ranks_from_kernel_details_and_communication_json():
    b = hermes_kb.load(ST4)
    assert b.rank_ids == [0, 1, 2, 3]
    for r in b.rank_ids:
        rd = ST4 / f"rank_{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        comm = json.loads((rd / "communication.json").read_text())
        n_ops = sum(1 for st in comm.values() for kind in st.values() for k in kind if k != "Total Op Info")
        assert len(b[r].collectives) == n_ops
        row = _csv(rd / "step_trace_time.csv")[0]
        assert "Device_id" in row  # the drift this set carries
        assert b[r].extras["step_stats"]["computing_us"].iloc[0] == pytest.approx(float(row["Computing"]))
        if (rd / "kernel_details.csv").exists():
            kd = [x for x in _csv(rd / "kernel_details.csv") if x["Accelerator Core"] not in ("COMMUNICATION", "HCCL")]
            comp = b[r].kernels[b[r].kernels["task_type"].astype(str) != "HCCL"]
            assert len(comp) == len(kd)
            assert comp["dur"].sum() == pytest.approx(sum(float(x["Duration(us)"]) for x in kd), rel=1e-9)
            assert (comp["device"] == int(kd[0]["Device_id"])).all()
    meta = b[0].meta
    assert {g["pg_desc"] for g in meta.process_groups} >= {"dp_cp", "pp", "tp"}
    assert meta.versions["cann_version"] == "8.3.RC1"
    assert meta.env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"


# ---- schema drift and bad input on tiny synthetic directories -----------------------------------

KD_HEADER = "Device_id,Step Id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Num,Input Data Types,aic_mac_ratio,aiv_vec_ratio"


def _rank(tmp: Path, name: str, files: dict[str, str]) -> Path:
    out = tmp / name / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    for fn, text in files.items():
        (out / fn).write_text(text)
    return tmp / name


def test_kernel_details_drift_is_read_per_file(tmp_path):
    kd = KD_HEADER + "\n" + "\n".join([
        "3,7,1,10,2,MatMul1,MatMulV2,static,AI_CORE,1000.5\t,10.25,0,20,FLOAT16,0.9,N/A",
        "3,7,1,11,2,Cast2,Cast,dynamic,AI_CPU,1020.0\t,30.0,N/A,1,INT64,N/A,N/A",
        '3,8,1,12,2,Add3,Add,dynamic,AI_VECTOR_CORE,2000.0\t,5.0,0,40,"FLOAT;FLOAT",0.0,0.5',
    ])  # fmt: skip
    root = _rank(tmp_path, "rank_5_ascend_pt", {"kernel_details.csv": kd})
    t = hermes_kb.load(root)[5]
    k = t.kernels.sort_values("ts")
    assert k["name"].astype(str).tolist() == ["MatMul1", "Cast2", "Add3"]
    assert k["dur"].tolist() == [10.25, 30.0, 5.0]
    assert (k["ts"] - k["ts"].iloc[0]).tolist() == [0.0, 19.5, 999.5]
    assert k["block_dim"].tolist() == [20, 1, 40]  # "Block Num" read as block dim
    assert k["device"].tolist() == [3, 3, 3]
    assert k["aiv_vec_ratio"].isna().tolist() == [True, True, False]  # N/A is missing, not 0
    assert t.steps["step"].tolist() == [7, 8]
    assert t.meta.rank_source == "filename"
    facts = hermes_kb.analyze(root)
    aicpu = next(f for f in facts if f.kind == "npu_aicpu_ops")
    assert (aicpu.aicpu_count, aicpu.slow_count, aicpu.wide_dtype_count) == (1, 1, 1)
    assert aicpu.aicpu_us == 30.0 and aicpu.device_compute_us == 45.25
    dyn = next(f for f in facts if f.kind == "npu_dynamic_shape")
    assert (dyn.dynamic_count, dyn.state_known_count) == (2, 3)


def test_empty_ascend_dir_is_a_one_line_error(tmp_path):
    (tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    with pytest.raises(HermesError) as exc:
        hermes_kb.load(tmp_path / "rank0_ascend_pt")
    assert "no torch_npu profiler output" in str(exc.value) and "\n" not in str(exc.value)


def test_damaged_trace_view_names_the_file(tmp_path):
    root = _rank(tmp_path, "rank0_ascend_pt", {"trace_view.json": '[{"ph": "X", "name": "a", "ts": "1'})
    with pytest.raises(BadTraceError) as exc:
        hermes_kb.load(root)
    assert "trace_view.json" in str(exc.value) and "not valid JSON" in str(exc.value)


def test_damaged_optional_file_is_reported_and_the_rest_loads(tmp_path):
    kd = KD_HEADER + "\n3,7,1,10,2,MatMul1,MatMulV2,static,AI_CORE,1000.5,10.25,0,20,FLOAT16,0.9,0.1\n"
    root = _rank(tmp_path, "rank0_ascend_pt", {"kernel_details.csv": kd, "communication.json": "{not json"})
    t = hermes_kb.load(root)[0]
    assert len(t.kernels) == 1
    assert any("communication.json" in w for w in t.warnings)


def test_links_out_of_the_directory_are_not_read(tmp_path):
    """A received profiler directory whose csv links to a secrets file: not read, a warning names
    the link, and nothing of the secret's text reaches a message (issue 37)."""
    secret = tmp_path / "secrets.csv"
    secret.write_text("aws_secret_access_key,token\nAKIAXXXX,hunter2\n")
    kd = KD_HEADER + "\n3,7,1,10,2,MatMul1,MatMulV2,static,AI_CORE,1000.5,10.25,0,20,FLOAT16,0.9,0.1\n"
    root = _rank(tmp_path, "rank0_ascend_pt", {"kernel_details.csv": kd})
    (root / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv").symlink_to(secret)
    (root / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").symlink_to("/proc/self/environ")
    t = hermes_kb.load(root)[0]
    assert len(t.kernels) == 1
    text = " ".join(t.warnings)
    assert "op_statistic.csv: not read: a link out of the profiler directory" in text
    assert "step_trace_time.csv" in text
    assert "aws_secret" not in text and "hunter2" not in text
    # a link inside the directory is an ordinary file
    inner = _rank(tmp_path, "rank1_ascend_pt", {"real.csv": kd})
    (inner / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").symlink_to(inner / "ASCEND_PROFILER_OUTPUT" / "real.csv")
    assert len(hermes_kb.load(inner)[1].kernels) == 1


def test_a_missing_column_error_does_not_echo_the_header(tmp_path):
    root = _rank(tmp_path, "rank0_ascend_pt", {"kernel_details.csv": "aws_secret_access_key,token\nAKIA,x\n"})
    with pytest.raises(HermesError) as exc:
        hermes_kb.load(root)
    msg = str(exc.value)
    assert "kernel_details.csv" in msg and "2 column(s)" in msg and "aws_secret" not in msg and "\n" not in msg


@needs_ascend
def test_damaged_rank_among_good_ones_is_skipped(tmp_path):
    for name in ("rank0_ascend_pt", "rank1_ascend_pt"):
        shutil.copytree(L0 / name, tmp_path / name)
    tv = tmp_path / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    tv.write_bytes(tv.read_bytes()[:5000])
    b = hermes_kb.load(tmp_path)
    assert b.rank_ids == [0]
    assert len(b.problems) == 1 and "trace_view.json" in b.problems[0].message
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "inspect", str(tmp_path / "rank1_ascend_pt")],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode != 0 and "Traceback" not in out.stderr + out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and "trace_view.json" in out.stderr


# ---- the NPU analyzer on hand-made frames -----------------------------------------------------


def _npu_facts(trace):
    from hermes_kb.analyzers.npu import npu
    from hermes_kb.analyzers.timeline.steps import step_context

    ctx, _ = step_context(trace)
    return {f.kind if f.kind != "npu_affinity_api" else f"{f.kind}:{f.pattern}": f for f in npu.per_rank(ctx)}


def test_npu_analyzer_numbers_by_hand(tmp_path):
    import numpy as np
    import pandas as pd

    kd = KD_HEADER + "\n" + "\n".join([
        # ts, dur, block dim, mac ratio, vec ratio
        "0,1,1,10,2,MatMul1,MatMulV2,static,AI_CORE,1000,100,0,30,FLOAT16,0.9,N/A",   # bound (mac), 30 > 20 and not a multiple
        "0,1,1,11,2,Add2,Add,static,AI_VECTOR_CORE,1200,50,0,40,FLOAT,N/A,0.3",       # unbound, 40 = multiple of 40
        "0,1,1,12,2,TransData3,TransData,static,AI_VECTOR_CORE,1300,25,0,8,FLOAT,N/A,0.1",  # unbound, under-filled
    ])  # fmt: skip
    root = _rank(tmp_path, "rank0_ascend_pt", {"kernel_details.csv": kd})
    t = hermes_kb.load(root)[0]
    t.meta.device_properties = [{"name": "Ascend910B3"}]  # 20 cube / 40 vector cores
    origin = t.kernels["ts"].min()
    # SDMA transfers: two during MatMul1 (1000..1100) at 10 GB/s, two alone at 20 GB/s
    t.extras["hccl_tasks"] = pd.DataFrame({
        "name": ["Memcpy"] * 4, "ts": np.array([1010.0, 1050.0, 1400.0, 1500.0]) - 1000 + origin,
        "dur": [10.0, 10.0, 10.0, 10.0], "transport": ["SDMA"] * 4, "link_type": ["HCCS"] * 4,
        "size_bytes": [1e5, 1e5, 2e5, 2e5], "stream": [4] * 4,
    })  # fmt: skip
    t.extras["hccl_tasks"]["end"] = t.extras["hccl_tasks"]["ts"] + 10.0
    t.extras["comm_packets"] = pd.DataFrame({
        "step": [1, 1, 1], "name": ["a", "a", "b"], "group": ["g"] * 3, "transport": ["HCCS", "HCCS", "SDMA"],
        "packet_bytes": [4e6, 32e6, 4e6], "count": [3.0, 1.0, 9.0], "time_us": [300.0, 900.0, 1.0],
    })  # fmt: skip
    t.extras["comm_ops"] = pd.DataFrame({"name": ["a", "b"]})
    t.meta.env = {"ASCEND_GLOBAL_LOG_LEVEL": "1", "ASCEND_LAUNCH_BLOCKING": "1", "PYTORCH_NPU_ALLOC_CONF": "",
                  "HCCL_RDMA_TC": "132", "HCCL_ALGO": ""}  # fmt: skip
    f = _npu_facts(t)

    p = f["npu_pipe_utilisation"]
    assert (p.ops_count, p.unbound_count, p.unbound_us) == (3, 2, 75.0)
    assert p.unbound_ratio == pytest.approx(75 / 175) and p.bound_us == {"mac": 100.0}
    b = f["npu_block_dim"]
    assert (b.ai_cores_count, b.vector_cores_count) == (20, 40)
    assert (b.not_multiple_count, b.not_multiple_us, b.under_filled_count, b.under_filled_us) == (1, 100.0, 1, 25.0)
    c = f["npu_format_conversion"]
    assert (c.transdata_count, c.transdata_us, c.conversion_ratio) == (1, 25.0, pytest.approx(25 / 175))
    s = f["npu_sdma_contention"]
    assert (s.overlapped_count, s.alone_count) == (2, 2)
    assert s.overlapped_gbps == pytest.approx(10.0) and s.alone_gbps == pytest.approx(20.0)
    assert s.bandwidth_loss_ratio == pytest.approx(0.5) and s.lost_us == pytest.approx(10.0)
    k = f["npu_small_packets"]  # SDMA rows are totals: only the HCCS ones count
    assert k.volume_bytes == 3 * 4e6 + 32e6 and k.small_volume_bytes == 12e6
    assert (k.small_count, k.small_count_ratio, k.small_us) == (3, 0.75, 300.0)
    e = f["npu_environment"]
    assert (e.debug_logging, e.launch_blocking, e.log_level, e.alloc_conf_set, e.hccl_vars_set_count) == (True, True, 1, False, 1)


def test_npu_affinity_patterns_by_hand(tmp_path):
    import pandas as pd

    kd = KD_HEADER + "\n0,1,1,10,2,MatMul1,MatMulV2,static,AI_CORE,1000,100,0,30,FLOAT16,0.9,N/A\n"
    t = hermes_kb.load(_rank(tmp_path, "rank0_ascend_pt", {"kernel_details.csv": kd}))[0]
    names = ["aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::linear",
             "aten::chunk", "aten::silu", "aten::mul"]  # fmt: skip
    ts = [float(i * 10) for i in range(len(names))]
    ops = pd.DataFrame({"name": pd.Categorical(names), "ts": ts, "dur": [5.0] * len(names), "end": [x + 5 for x in ts],
                        "pid": 1, "tid": 1, "ext_id": range(len(names)), "parent": -1, "depth": 0})  # fmt: skip
    t.cpu_ops = ops
    t.kernels["ext_id"] = 3  # the MatMul task was launched by aten::rsqrt (part of the RMSNorm match)
    f = _npu_facts(t)
    rms, swi = f["npu_affinity_api:rms_norm"], f["npu_affinity_api:swiglu"]
    assert (rms.occurrences_count, rms.host_us, rms.device_us, rms.fused_api) == (1, 25.0, 100.0, "torch_npu.npu_rms_norm")
    assert (swi.occurrences_count, swi.host_us, swi.device_us) == (1, 15.0, 0.0)
