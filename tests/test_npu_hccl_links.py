"""npu_hccl_links: HCCL transit time and bytes per link in the steps, the HCCL_INTRA_* flags (from
the trace or merged in from the monitor's log), and the case (C-COMM-009) that advises unsetting
them only when RoCE / PCIe transfers take a share of the step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hermes_kb
from conftest import SHARED, ascend_x
from hermes_kb.analyzers.npu.hccl_links import NOMINAL_GBPS, _nominal_fractions
from hermes_kb.analysis.run_dir import analyze_run_dir, merge_monitor_env
from hermes_kb.trace import load

ASCEND = SHARED / "ascend"
QWEN = ASCEND / "msinsight_st_level2_4rank_qwen3_0.6b_pp2"
needs_ascend = pytest.mark.skipif(not ASCEND.is_dir(), reason="../shared/data/ascend is absent")


def _link(mb: float, ms: float) -> dict:
    return {"Transit Size(MB)": mb, "Transit Time(ms)": ms, "Bandwidth(GB/s)": round(mb / ms, 4) if ms else 0,
            "Large Packet Ratio": 0, "Size Distribution": {}}  # fmt: skip


def _op(ts: float, ms: float, **links: tuple[float, float]) -> dict:
    """One communication.json op; ``links`` maps rdma / hccs / pcie / sio to (MB, ms)."""
    bw = {k: _link(*links.get(k.lower(), (0, 0))) for k in ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")}
    t = {"Start Timestamp(us)": ts, "Elapse Time(ms)": ms, "Transit Time(ms)": ms, "Wait Time(ms)": 0,
         "Synchronization Time(ms)": 0, "Idle Time(ms)": 0, "Wait Time Ratio": 0, "Synchronization Time Ratio": 0}  # fmt: skip
    return {"Communication Time Info": t, "Communication Bandwidth Info": bw}


def _export(root: Path, steps: list[tuple[int, float, float]], ops: dict[str, dict], env: dict | None = None,
            name: str = "rank0_ascend_pt") -> Path:  # fmt: skip
    """A text export: ProfilerStep annotations (step, start µs, duration µs), communication.json
    with the given ops (all under one step key: hermes assigns steps by time), ENV_VARIABLES."""
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "Python"}}]
    ev += [ascend_x(1, f"ProfilerStep#{s}", ts, dur, "cpu_op") for s, ts, dur in steps]
    ev += [ascend_x(1, "aten::add", steps[0][1] + 10, 5, "cpu_op")]
    out = root / name
    (out / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (out / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(ev))
    (out / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text(json.dumps({"step1": {"collective": ops}}))
    (out / "profiler_info_0.json").write_text(json.dumps({"rank_id": 0}))
    (out / "profiler_metadata.json").write_text(json.dumps({"ENV_VARIABLES": env or {}}))
    return out


def _links(path) -> list:
    return [f for f in hermes_kb.analyze(path) if f.kind == "npu_hccl_links"]


# one 200 ms step from t = 1000 µs; 30 ms on RDMA moving 300 MB (10 GB/s), 20 ms on HCCS moving
# 400 MB (20 GB/s), and an RDMA op before the step that must not count
ROCE_OPS = {
    "hcom_allReduce__1_0_1@g": _op(10_000, 31, rdma=(300, 30)),
    "hcom_allGather__1_1_1@g": _op(60_000, 21, hccs=(400, 20)),
    "hcom_allReduce__1_2_1@g": _op(500, 1, rdma=(5, 0.5)),
}


def test_transit_per_link_by_hand_and_the_case_fires(tmp_path):
    root = _export(tmp_path, [(1, 1000, 200_000)], ROCE_OPS, {"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_RDMA_TC": ""})
    (f,) = _links(root)
    assert (f.steps_count, f.window_us, f.ops_count) == (1, 200_000.0, 2)  # the op before the step is out
    assert (f.rdma_us, f.rdma_bytes, f.hccs_us, f.hccs_bytes) == (30_000.0, 300e6, 20_000.0, 400e6)
    assert f.rdma_gbps == pytest.approx(10.0) and f.hccs_gbps == pytest.approx(20.0)
    assert f.pcie_gbps is None and f.sio_gbps is None  # no time on them: no bandwidth
    # slow link = RDMA + PCIe: 30 ms of 200 ms = 0.15; HCCS at 20 GB/s would move the 300 MB in
    # 15 ms, so 1 - 10/20 = 0.5 of the 30 ms is recoverable
    assert (f.slow_us, f.slow_per_step_us) == (30_000.0, 30_000.0)
    assert f.slow_share_ratio == pytest.approx(0.15) and f.max_step_slow_share_ratio == pytest.approx(0.15)
    assert f.hccs_measured and f.speedup_source == "measured"
    assert f.hccs_speedup_fraction == pytest.approx(0.5)
    assert f.recoverable_us == pytest.approx(15_000.0) and f.recoverable_ratio == pytest.approx(0.075)
    assert f.intra_roce_forced and not f.intra_pcie_forced and f.intra_flags_recorded
    assert f.hccl_env == {"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_RDMA_TC": ""}
    assert [s.step for s in f.steps] == [1] and f.steps[0].slow_share_ratio == pytest.approx(0.15)
    assert f.evidence.events == ["hcom_allReduce__1_0_1"]
    report = hermes_kb.advise(root)
    (c,) = [x for x in report.findings if x.case_id == "C-COMM-009"]
    assert "HCCL_INTRA_ROCE_ENABLE=1" in c.explanation and "20.0 GB/s" in c.explanation
    # removable 15 ms of the 200 ms step, the fix removes 50-100% of it
    assert c.time_at_stake_us == pytest.approx(15_000.0) and c.step_time_us == pytest.approx(200_000.0)
    assert c.expected_speedup.model_high == pytest.approx(200 / 185, abs=1e-3)
    assert c.expected_speedup.model_low == pytest.approx(200 / 192.5, abs=1e-3)


def test_per_step_shares_and_nominal_fraction_without_hccs(tmp_path):
    # two 100 ms steps, HCCL_INTRA_PCIE_ENABLE=1, PCIe only: 8 ms (120 MB) in step 1, 2 ms in step 2
    ops = {"hcom_allReduce__2_0_1@g": _op(20_000, 9, pcie=(120, 8)),
           "hcom_allReduce__2_1_1@g": _op(130_000, 3, pcie=(30, 2))}  # fmt: skip
    root = _export(tmp_path, [(1, 1000, 100_000), (2, 101_000, 100_000)], ops, {"HCCL_INTRA_PCIE_ENABLE": "1"})
    (f,) = _links(root)
    assert [(s.step, s.pcie_us, s.slow_share_ratio) for s in f.steps] == [(1, 8000.0, 0.08), (2, 2000.0, 0.02)]
    assert f.slow_us == 10_000.0 and f.slow_per_step_us == 5000.0
    assert f.slow_share_ratio == pytest.approx(10 / 200) and f.max_step_slow_share_ratio == pytest.approx(0.08)
    assert f.pcie_gbps == pytest.approx(15.0) and f.hccs_gbps is None and not f.hccs_measured
    # nominal: PCIe 4.0 x16 32 GB/s against one 30 GB/s HCCS link (no saving) or a 4-NPU mesh of
    # three (1 - 32/90); recoverable uses the middle of that range
    assert f.speedup_source == "nominal" and f.hccs_speedup_fraction is None
    assert f.nominal_speedup_low_fraction == 0.0
    assert f.nominal_speedup_high_fraction == pytest.approx(1 - 32 / 90)
    assert f.recoverable_us == pytest.approx(10_000 * (1 - 32 / 90) / 2)
    assert "C-COMM-009" in {x.case_id for x in hermes_kb.advise(root).findings}


def test_nominal_fractions_follow_the_link_mix():
    rdma = (1 - NOMINAL_GBPS["rdma"] / NOMINAL_GBPS["hccs_link"], 1 - NOMINAL_GBPS["rdma"] / NOMINAL_GBPS["hccs_mesh"])
    assert rdma == pytest.approx((1 - 12.5 / 30, 1 - 12.5 / 90))
    assert _nominal_fractions(1000.0, 0.0, False) == pytest.approx(rdma)
    lo, hi = _nominal_fractions(1000.0, 1000.0, False)  # half the time on each link
    assert (lo, hi) == pytest.approx(((rdma[0] + 0.0) / 2, (rdma[1] + 1 - 32 / 90) / 2))
    assert _nominal_fractions(0.0, 0.0, True) == pytest.approx((0.0, 1 - 32 / 90))


def test_flag_without_slow_traffic_stays_silent(tmp_path):
    ops = {"hcom_allGather__3_0_1@g": _op(60_000, 21, hccs=(400, 20))}
    root = _export(tmp_path, [(1, 1000, 200_000)], ops, {"HCCL_INTRA_ROCE_ENABLE": "1"})
    (f,) = _links(root)
    assert f.intra_roce_forced and f.slow_us == 0.0 and f.recoverable_us == 0.0
    assert not [x for x in hermes_kb.advise(root).findings if x.case_id == "C-COMM-009"]


def test_slow_traffic_without_flag_stays_silent(tmp_path):
    # RDMA is also how servers talk to each other: without the flag it is not this cause
    root = _export(tmp_path, [(1, 1000, 200_000)], ROCE_OPS, {"HCCL_RDMA_TC": "132"})
    (f,) = _links(root)
    assert f.slow_share_ratio == pytest.approx(0.15) and not f.intra_flags_recorded
    assert "not recorded" in f.evidence.note
    assert not [x for x in hermes_kb.advise(root).findings if x.case_id == "C-COMM-009"]


def _monitor_log(run_dir: Path, rank: int, env: dict) -> None:
    recs = [{"type": "environment", "rank": rank, "env": env, "gc_thresholds": [700, 10, 10], "cpu_count": 8,
             "affinity": list(range(8)), "versions": {"python": "3.11", "torch_npu": "2.7.1"}, "hostname": "h0"}]  # fmt: skip
    recs += [{"type": "step", "rank": rank, "step": i, "wall_s": 0.2, "data_wait_s": 0.001, "gc_count": 0,
              "gc_pause_s": 0.0, "cpu_s": 0.05, "fluctuation": False} for i in range(20)]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_monitor_env_fills_what_the_trace_did_not_record(tmp_path):
    # torch_npu recorded HCCL_RDMA_TC as unset (''); the monitor saw it as 132 and saw the
    # HCCL_INTRA_ROCE_ENABLE torch_npu never records: the trace's value wins, the rest is added
    trace = _export(tmp_path, [(1, 1000, 200_000)], ROCE_OPS, {"HCCL_RDMA_TC": ""})
    _monitor_log(tmp_path, 0, {"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_RDMA_TC": "132", "HCCL_BUFFSIZE": "400"})
    from hermes_kb.monitor.reader import read_run

    run = read_run(tmp_path)
    assert run.captures == {0: [trace]}  # the torch_npu directory is the rank's trace
    bundle = load(str(trace))
    merge_monitor_env(bundle, run)
    assert bundle.ranks[0].meta.env == {"HCCL_RDMA_TC": "", "HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_BUFFSIZE": "400"}
    ra = analyze_run_dir(tmp_path)
    (f,) = [x for x in ra.facts if x.kind == "npu_hccl_links"]
    assert f.intra_roce_forced and f.intra_flags_recorded and f.hccl_env["HCCL_RDMA_TC"] == ""
    (m,) = [x for x in ra.facts if x.kind == "monitor_env_setting" and x.issue == "hccl_intra_link_forced"]
    assert (m.variable, m.value, m.device) == ("HCCL_INTRA_ROCE_ENABLE", "1", "npu")
    report = hermes_kb.advise(tmp_path)
    (c,) = [x for x in report.findings if x.case_id == "C-COMM-009"]
    assert c.expected_speedup.model_high == pytest.approx(200 / 185, abs=1e-3)


def test_without_the_monitor_the_flag_is_unknown_and_nothing_fires(tmp_path):
    root = _export(tmp_path, [(1, 1000, 200_000)], ROCE_OPS, {"HCCL_RDMA_TC": ""})
    assert not _links(root)[0].intra_roce_forced
    assert not [x for x in hermes_kb.advise(root).findings if x.case_id == "C-COMM-009"]


@needs_ascend
def test_qwen_pp2_moves_everything_over_hccs():
    facts = _links(QWEN)
    assert sorted(f.rank for f in facts) == [0, 1, 2, 3]
    for f in facts:
        # every HCCL byte of the step on HCCS (1.77 GB per rank) at msprof-analyze's 18.99-19.01 GB/s
        assert f.slow_us == 0.0 and f.rdma_bytes == 0.0 and f.pcie_bytes == 0.0 and f.sio_bytes == 0.0
        assert f.hccs_bytes == pytest.approx(1.7666e9, rel=1e-4)
        assert 18.98 < f.hccs_gbps < 19.02
        assert f.recoverable_us == 0.0 and not f.intra_flags_recorded
        assert f.hccl_env == {"HCCL_ALGO": "", "HCCL_RDMA_SL": "", "HCCL_RDMA_TC": ""}
    r0 = next(f for f in facts if f.rank == 0)
    assert (r0.ops_count, r0.hccs_us, r0.window_us) == (15, pytest.approx(92_973.42), pytest.approx(810_022.25))
    assert not [x for x in hermes_kb.advise(QWEN).findings if x.case_id == "C-COMM-009"]


@needs_ascend
@pytest.mark.parametrize("path", ["msinsight_pt_text_level1_2rank", "msinsight_pt_db_level1_2rank"])
def test_two_rank_cnn_all_hccs(path):
    facts = _links(ASCEND / path)
    assert len(facts) == 2
    assert all(f.slow_us == 0.0 and f.hccs_bytes == pytest.approx(427.596e6, rel=1e-4) for f in facts)
