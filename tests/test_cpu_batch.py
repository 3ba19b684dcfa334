"""Thin GEMMs on a CPU-only trace and the per-sample prediction at a larger batch (analyzers/
cpu_batch.py, case C-COMP-020), the CPU peak it rests on (hermes_kb/core/cpus.py) and how the CPU
reaches the analyzer from the monitor's environment record. Numbers computed by hand."""

from __future__ import annotations

import pytest

import hermes_kb
from hermes_kb.analyzers.compute import compute
from hermes_kb.analyzers.host import cpu_batch
from hermes_kb.analyzers.compute.flops import op_cost
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, write_trace
from hermes_kb.core.cpus import fp32_fma_peak_per_core, host_cpu
from hermes_kb.monitor.env import environment
from hermes_kb.monitor.reader import RankLog, RunLog
from hermes_kb.analysis.run_dir import merge_monitor_env

AVX512_2GHZ = {"model": "Test Xeon", "flags": ["avx2", "avx512f", "fma"], "mhz": 2000.0, "usable_cores": 2}


def test_fma_peaks_by_vector_flags():
    # 2 FLOPs per FMA lane x lanes x FMA units x clock
    assert fp32_fma_peak_per_core(AVX512_2GHZ) == (2 * 16 * 1 * 2e9, 2 * 16 * 2 * 2e9)
    assert fp32_fma_peak_per_core({"flags": ["avx", "avx2", "fma"], "mhz": 3000.0}) == (2 * 8 * 2 * 3e9,) * 2
    assert fp32_fma_peak_per_core({"flags": ["sse2"], "mhz": 1000.0}) == (2 * 4 * 1e9,) * 2
    assert fp32_fma_peak_per_core({"flags": ["avx512f"]}) is None  # no clock
    assert fp32_fma_peak_per_core({"flags": [], "mhz": 2000.0}) is None  # no known vector unit


def test_host_cpu_reads_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.10GHz\ncpu MHz\t\t: 1995.312\n"
                    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n\nprocessor\t: 1\nmodel name\t: other\n")  # fmt: skip
    got = host_cpu(info, tmp_path / "no_cpufreq")
    assert got == {"model": "Some CPU @ 2.10GHz", "flags": ["avx", "avx2", "avx512f", "fma", "sse2"], "mhz": 1995.3}
    (tmp_path / "max").write_text("3500000\n")  # kHz: the cpufreq maximum wins over the current clock
    assert host_cpu(info, tmp_path / "max")["mhz"] == 3500.0
    assert host_cpu(tmp_path / "absent") == {}
    assert set(environment()) >= {"cpu", "torch_threads", "affinity"}


def thin_trace(tmp_path):
    """One 1000 µs step: a 4-row linear (200 µs), a relu (50 µs), the optimizer (300 µs)."""
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::linear", 10, 200, args={"External id": 1, "Input Dims": [[4, 2048], [1024, 2048], [1024]],
                                                   "Input type": ["float", "float", "float"]}),  # fmt: skip
        X("cpu_op", "aten::relu", 300, 50, args={"External id": 2, "Input Dims": [[4, 1024]], "Input type": ["float"]}),
        X("user_annotation", "Optimizer.step#AdamW.step", 500, 300),
        X("cpu_op", "aten::_fused_adamw_", 510, 280, args={"External id": 3}),
    ]
    return write_trace(tmp_path / "thin.json", ev)


def thin_fact(path, cpu=None, threads=None):
    trace = next(iter(hermes_kb.load(path)))
    trace.meta.host_cpu = cpu or {}
    trace.meta.torch_threads = threads
    ctx, _ = step_context(trace)
    compute.per_rank(ctx)
    (fact,) = cpu_batch.per_rank(ctx)
    return fact


def test_thin_dimension_of_gemms():
    assert op_cost("aten::linear", "[[4,2048],[1024,2048],[1024]]", '["float","float","float"]').thin == 4
    assert op_cost("aten::mm", "[[1024,4],[4,512]]", '["float","float"]').thin == 4  # weight gradient: K = batch
    assert op_cost("aten::mm", "[[256,512],[512,128]]", '["float","float"]').thin == 128
    assert op_cost("aten::relu", "[[4,1024]]", '["float"]').thin == 0


def test_prediction_by_hand(tmp_path):
    f = thin_fact(thin_trace(tmp_path), AVX512_2GHZ, threads=1)
    flops = 2 * 4 * 2048 * 1024 + 4 * 1024  # 16_781_312
    assert (f.thin_rows, f.batch_factor, f.thin_gemm_flops) == (4, 16.0, flops)
    assert (f.gemm_us, f.thin_gemm_us, f.thin_gemm_ratio, f.thin_share_of_step_ratio) == (200, 200, 1.0, 0.2)
    assert (f.peak_low_flops_per_s, f.peak_high_flops_per_s) == (64e9, 128e9)
    # 16_781_312 FLOPs in 200 µs = 83.9 GFLOP/s, above the lower peak: utilisation capped at 1
    assert f.thin_achieved_flops_per_s == pytest.approx(flops / 200e-6) and f.thin_utilisation_max_ratio == 1.0
    # per step: optimizer 300 (fixed), relu 50 (other operators), gaps 1000 - 300 - 50 - 200 = 450
    fast_gemm = 16 * flops / 128e9 * 1e6  # 2097.664 µs, more than the 200 µs now
    slow_gemm = 16 * flops / (0.7 * 64e9) * 1e6  # 5993.326 µs
    assert f.target_step_fast_us == pytest.approx(300 + 450 + 50 + fast_gemm)  # 2897.664
    assert f.target_step_slow_us == pytest.approx(300 + 450 + 16 * 50 + slow_gemm)  # 7543.326
    assert f.per_sample_saving_high_us == pytest.approx(1000 - (300 + 450 + 50 + fast_gemm) / 16)  # 818.896
    assert f.per_sample_saving_low_us == pytest.approx(1000 - (300 + 450 + 800 + slow_gemm) / 16)  # 528.542


def test_threads_capped_by_usable_cores(tmp_path):
    f = thin_fact(thin_trace(tmp_path), AVX512_2GHZ, threads=8)
    assert f.threads_count == 2 and f.peak_high_flops_per_s == 2 * 128e9


def test_bare_trace_has_no_prediction(tmp_path):
    f = thin_fact(thin_trace(tmp_path))
    assert f.peak_low_flops_per_s is None and f.per_sample_saving_high_us is None
    assert "no CPU peak" in f.evidence.note


def test_monitor_environment_reaches_the_trace(tmp_path):
    b = hermes_kb.load(thin_trace(tmp_path))
    env = {"cpu": {"model": "X", "flags": ["avx2"], "mhz": 1000.0}, "affinity": [0, 1, 2], "torch_threads": 3,
           "env": {"OMP_NUM_THREADS": "3"}}  # fmt: skip
    run = RunLog(run_dir=str(tmp_path), ranks={0: RankLog(rank=0, path="rank0.jsonl", environment=env)}, captures={}, warnings=[])
    merge_monitor_env(b, run)
    meta = next(iter(b)).meta
    assert meta.host_cpu == {"model": "X", "flags": ["avx2"], "mhz": 1000.0, "usable_cores": 3}
    assert meta.torch_threads == 3 and meta.env["OMP_NUM_THREADS"] == "3"


def test_small_batch_scenario_is_diagnosed():
    """The recorded small_batch run (batch 4, monitor log with the CPU): C-COMP-020 first, and the
    measured throughput gain of batch 64 inside the predicted range; its batch-64 twin: no finding."""
    import json
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/small_batch"
    measured = json.loads((d / "label.json").read_text())["throughput_speedup"]
    bad = hermes_kb.advise(d / "bad").findings
    assert bad[0].case_id == "C-COMP-020"
    assert bad[0].expected_speedup.low <= measured <= bad[0].expected_speedup.high
    # the range's ends come from the fact's two savings (gain.removes_low, gain.removes)
    from hermes_kb.analysis.run_dir import analyze_run_dir

    (t,) = [f for f in analyze_run_dir(d / "bad").facts if f.kind == "cpu_thin_matmuls"]
    assert bad[0].expected_speedup.model_low == pytest.approx(t.step_us / (t.step_us - t.per_sample_saving_low_us), rel=1e-3)
    assert bad[0].expected_speedup.model_high == pytest.approx(t.step_us / (t.step_us - t.per_sample_saving_high_us), rel=1e-3)
    assert "C-COMP-020" not in [f.case_id for f in hermes_kb.advise(d / "fixed").findings]


def test_a_narrow_output_layer_at_a_large_batch_is_not_a_small_batch(tmp_path):
    # batch 64: the hidden layer's GEMM is 64 rows, the 10-class head's is 10 wide (its thinnest
    # dimension); the head dominates the GEMM time, but the batch is not small
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::linear", 10, 100, args={"External id": 1, "Input Dims": [[64, 256], [256, 256], [256]],
                                                   "Input type": ["float", "float", "float"]}),  # fmt: skip
        X("cpu_op", "aten::linear", 200, 500, args={"External id": 2, "Input Dims": [[64, 256], [10, 256], [10]],
                                                    "Input type": ["float", "float", "float"]}),  # fmt: skip
    ]
    trace = next(iter(hermes_kb.load(write_trace(tmp_path / "head.json", ev))))
    trace.meta.host_cpu, trace.meta.torch_threads = AVX512_2GHZ, 2
    ctx, _ = step_context(trace)
    compute.per_rank(ctx)
    assert cpu_batch.per_rank(ctx) == []
    # the same layers at batch 4: the 4-row GEMMs are thin (the head's 4 rows too)
    ev4 = [dict(e) for e in ev]
    for e in ev4[1:]:
        e["args"] = {**e["args"], "Input Dims": [[4, 256]] + e["args"]["Input Dims"][1:]}
    f = thin_fact(write_trace(tmp_path / "b4.json", ev4), AVX512_2GHZ, 2)
    assert f is not None and f.thin_rows == 4 and f.thin_gemm_ratio == pytest.approx(1.0)
