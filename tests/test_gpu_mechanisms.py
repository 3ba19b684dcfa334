"""Mechanisms found on the GPU zoo (benchmarks/scenarios/gpu_*.py, recorded on an H200), each on a
hand-made trace with the expected numbers worked out in the comments, then on the recordings.

- synchronous launches: a launch call that returns only after its long kernel has ended;
- host-to-device copies with no kernel beside them hold the step (data, not compute);
- FP32 xmma kernels with ``_ffma_`` run on the CUDA cores, and what tensor cores remove follows
  the device's peaks;
- a host synchronisation after the last step's annotation (the profiler's stop) is no step's;
- the replay takes the profiler's cost off the host where the monitor measured the run unprofiled;
- (second lease) a convolution that synchronises inside itself is cuDNN's algorithm search, and
  SDPA calls given a mask tensor are counted from their recorded arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import X, write_trace
from test_analyzer_cpu import OP, RT, K  # the same hand-made event builders

import hermes_kb
from hermes_kb.analyzers.compute.kernel_names import is_fp32_kernel, tensor_core_kind
from hermes_kb.analyzers.compute.precision import tensor_core_removes
from hermes_kb.analyzers.host import cpu as A
from hermes_kb.analyzers.io import io as IO
from hermes_kb.analyzers.timeline.breakdown import components
from hermes_kb.analyzers.timeline.steps import step_context
from hermes_kb.core.devices import lookup

ROOT = Path(__file__).resolve().parents[1]
GPU_ZOO = ROOT / "benchmarks/scenarios/recorded"


def ctx_of(tmp_path, events):
    (t,) = [t for t in hermes_kb.load(write_trace(tmp_path / "t.json", events))]
    return step_context(t)[0]


# ---------------------------------------------------------------- synchronous launches


def _launches(blocking: bool) -> list[dict]:
    """One step [0, 2000): four ops each launching a 100 µs kernel, 400 µs apart. Asynchronous:
    the call lasts 10 µs and the kernel starts 5 µs after it returns. Blocking: the kernel starts
    5 µs into the call and the call returns 5 µs after the kernel ends (110 µs)."""
    ev = [X("user_annotation", "ProfilerStep#1", 0, 2000)]
    for i in range(4):
        t0 = 100 + 400 * i
        call = 110 if blocking else 10
        k0 = t0 + 15 if blocking else t0 + 25
        ev += [OP("aten::mm", t0, call + 20, 10 + i), RT("cudaLaunchKernel", t0 + 10, call, 100 + i, 10 + i),
               K("gemm", k0, 100, 100 + i)]  # fmt: skip
    return ev


def test_blocking_launch_calls_return_after_their_long_kernels(tmp_path):
    (f,) = [f for f in A.per_rank(ctx_of(tmp_path, _launches(True))) if f.kind == "launch_overhead"]
    # kernel [t0+15, t0+115), call [t0+10, t0+120): every 100 µs kernel ended before its call returned
    assert f.long_kernels_count == 4 and f.launch_waited_long_kernels_ratio == 1.0
    assert f.short_kernels_ratio == 1.0  # 100 < 110: under blocking every kernel is "shorter than its launch"


def test_queued_launch_calls_return_before_their_long_kernels(tmp_path):
    (f,) = [f for f in A.per_rank(ctx_of(tmp_path, _launches(False))) if f.kind == "launch_overhead"]
    # call [t0+10, t0+20), kernel [t0+25, t0+125)
    assert f.long_kernels_count == 4 and f.launch_waited_long_kernels_ratio == 0.0
    assert f.short_kernels_ratio == 0.0


# ---------------------------------------------------------------- host-to-device copies


def _copy_trace(src: str) -> list[dict]:
    """Step [0, 3000): a 1000 µs HtoD copy at [100, 1100) issued by a call [90, 1110) (pageable:
    the host blocks), then a 500 µs kernel at [1200, 1700) and a second kernel at [2000, 2300)
    under which a second 200 µs copy [2050, 2250) runs (hidden)."""
    args = {"device": 0, "stream": 7, "correlation": 300, "bytes": 100_000_000}
    args2 = {"device": 0, "stream": 8, "correlation": 301, "bytes": 20_000_000}
    return [
        X("user_annotation", "ProfilerStep#1", 0, 3000),
        OP("aten::copy_", 80, 1040, 30), RT("cudaMemcpyAsync", 90, 1020, 300, 30),
        X("gpu_memcpy", f"Memcpy HtoD ({src} -> Device)", 100, 1000, pid=0, tid=7, args=args),
        OP("aten::mm", 1150, 40, 31), RT("cudaLaunchKernel", 1160, 10, 302, 31), K("gemm", 1200, 500, 302),
        OP("aten::mm", 1950, 40, 32), RT("cudaLaunchKernel", 1960, 10, 303, 32), K("gemm", 2000, 300, 303),
        OP("aten::copy_", 2030, 30, 33), RT("cudaMemcpyAsync", 2040, 5, 301, 33),
        X("gpu_memcpy", f"Memcpy HtoD ({src} -> Device)", 2050, 200, pid=0, tid=8, args=args2),
    ]


def test_h2d_copies_measure_the_time_they_hold_the_step(tmp_path):
    ctx = ctx_of(tmp_path, _copy_trace("Pageable"))
    (h,) = [f for f in IO.per_rank(ctx) if f.kind == "h2d_copies"]
    assert h.pageable and h.copies_count == 2 and h.copied_bytes == 120_000_000
    # held: union of copies and calls [90, 1110) u [2040, 2250) minus kernels [1200, 1700) u [2000, 2300)
    # = 1020 + 0 (the second copy and its call lie under the second kernel)
    assert h.waited_us == pytest.approx(1020.0)
    assert h.window_us == pytest.approx(3000.0) and h.waited_ratio == pytest.approx(1020 / 3000)


def test_a_copy_with_no_kernel_beside_it_is_data_in_the_breakdown(tmp_path):
    from hermes_kb.analyzers.timeline.critical_path import per_rank as cp_rank

    ctx = ctx_of(tmp_path, _copy_trace("Pageable"))
    cp_rank(ctx)
    parts, _, device = components(ctx, ctx.shared["graph"], ctx.shared.get("main_tid", -1))
    assert device == "gpu"
    # the 1000 µs copy alone on the device is data; the hidden 200 µs copy is not counted twice:
    # compute = the two kernels (500 + 300)
    assert parts["compute"][0] == pytest.approx(800.0)
    assert parts["data"][0] == pytest.approx(1000.0)


def test_case_c_io_002_fires_on_a_pageable_batch_copy_without_a_dataloader(tmp_path):
    r = hermes_kb.advise(write_trace(tmp_path / "t.json", _copy_trace("Pageable")))
    assert "C-IO-002" in [f.case_id for f in r.findings]
    r = hermes_kb.advise(write_trace(tmp_path / "p.json", _copy_trace("Pinned")))
    assert "C-IO-002" not in [f.case_id for f in r.findings]


# ---------------------------------------------------------------- FP32 GEMMs and tensor cores


@pytest.mark.parametrize("name,kind,fp32", [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_aligna4_alignc4_execute_kernel_trmm",
     "no_tensor", True),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)",
     "no_tensor", True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     "tensor", False),
])  # fmt: skip
def test_kernel_names_of_an_h200_run(name, kind, fp32):
    assert tensor_core_kind(name) == kind and is_fp32_kernel(name) is fp32


def test_tensor_cores_remove_what_the_device_peaks_say():
    h100 = lookup("NVIDIA H100 80GB HBM3")
    lo, hi = tensor_core_removes(h100)
    # H100 SXM: FP32 67, TF32 494.5, BF16 989.5 TFLOP/s (dense): low 1 - 2 x 67 / 494.5, high 1 - 67 / 989.5
    assert lo == pytest.approx(1 - 2 * 67 / 494.5) and hi == pytest.approx(1 - 67 / 989.5)
    v100 = lookup("Tesla V100-SXM2-16GB")
    lo, hi = tensor_core_removes(v100)  # no TF32 or BF16: FP16 125 vs FP32 15.7
    assert lo == pytest.approx(1 - 2 * 15.7 / 125) and hi == pytest.approx(1 - 15.7 / 125)
    assert tensor_core_removes(None) == (None, None)


# ---------------------------------------------------------------- the profiler's own synchronisation


def test_a_sync_after_the_last_step_annotation_is_no_steps(tmp_path):
    # steps [0, 100) and [100, 200); a kernel launched in step 2 runs until 900; the profiler's stop
    # synchronises at [210, 900): inside the last window (it runs to the device end) but after its
    # annotation closed
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("user_annotation", "ProfilerStep#2", 100, 100),
          OP("aten::mm", 20, 30, 1), RT("cudaLaunchKernel", 30, 10, 11, 1), K("gemm", 45, 300, 11),
          OP("aten::mm", 120, 30, 2), RT("cudaLaunchKernel", 130, 10, 12, 2), K("gemm", 345, 555, 12),
          RT("cudaDeviceSynchronize", 210, 690, 13)]  # fmt: skip
    ctx = ctx_of(tmp_path, ev)
    assert ctx.windows[-1].end_us == pytest.approx(900.0)
    assert ctx.host_step_of(np.array([210.0]))[0] == -1 and ctx.step_of(np.array([210.0]))[0] == 2
    syncs = [f for f in A.per_rank(ctx) if f.kind == "host_sync"]
    assert not syncs or all(f.sync_calls_count == 0 for f in syncs)


# ---------------------------------------------------------------- the profiler's cost on the host


def test_the_replay_takes_the_profilers_cost_off_the_host(tmp_path):
    from hermes_kb.analyzers.whatif import replay as W
    from hermes_kb.analyzers.timeline.critical_path import per_rank as cp_rank

    # 4 steps of 1000 µs: the host is busy 900 µs per step in ops (the profiler's cost included)
    # launching one 400 µs kernel at its end; the device idles most of the step (host-bound)
    ev = []
    for s in range(4):
        t0 = 1000 * s
        ev += [X("user_annotation", f"ProfilerStep#{s + 1}", t0, 1000), OP("aten::mm", t0 + 10, 900, 10 + s),
               RT("cudaLaunchKernel", t0 + 890, 10, 100 + s, 10 + s), K("gemm", t0 + 905, 400, 100 + s)]  # fmt: skip
    (t,) = hermes_kb.load(write_trace(tmp_path / "t.json", ev))
    ctx = step_context(t)[0]
    cp_rank(ctx)
    m = W.build_model(ctx.shared["graph"], ctx.windows, ctx.shared.get("main_tid", -1))
    base = W.baseline_time(m)
    # the monitor found the host twice as fast unprofiled: every host node's own work halves; the
    # host-bound steps shrink to the host's 455 µs (the 890 µs op halved, plus the launch), the
    # kernels (400 µs) stay and fit under the next step's host work
    h = W.deflate_profiler(m, 0.5)
    assert h == 0.5
    assert W.baseline_time(m) < 0.65 * base
    # the replayed model is the new base: replaying it unchanged gives it back
    S, E = W.replay(m)
    assert W.analysed_time(m, S, E) == pytest.approx(W.baseline_time(m))
    # no correction above 0.95
    m2 = W.build_model(ctx.shared["graph"], ctx.windows, ctx.shared.get("main_tid", -1))
    assert W.deflate_profiler(m2, 0.97) == 1.0 and W.baseline_time(m2) == pytest.approx(base)


def test_host_pace_from_the_steps_where_the_device_lagged():
    from hermes_kb.analyzers.monitor.profiler_overhead import _host_pace

    # the device took 15 ms a step; in 4 of the steps the host ran ahead at 12 ms: its own pace
    wall = np.array([12.0, 12.5, 11.5, 12.0, 15.0, 15.0])
    dev = np.array([15.0, 15.0, 15.0, 15.0, 15.0, 15.0])
    assert _host_pace(wall, dev) == pytest.approx(12.0)
    # host-bound: the device kept up, the step is the host's (lower quartile of the steps)
    assert _host_pace(np.array([20.0, 21.0, 22.0, 23.0]), np.array([20.0, 21.0, 22.0, 23.0])) == pytest.approx(20.75)


# ---------------------------------------------------------------- the recordings


def _first(run: str) -> str | None:
    d = GPU_ZOO / run
    if not d.is_dir():
        pytest.skip(f"{d} not recorded")
    r = hermes_kb.advise(d)
    return r.findings[0].case_id if r.findings else None


@pytest.mark.parametrize("scenario,expected", [
    ("gpu_fp32_matmul", "C-COMP-001"), ("gpu_pageable_copy", "C-IO-002"), ("gpu_launch_bound", "C-CPU-001"),
    ("gpu_loader_transform", "C-IO-001"),
])  # fmt: skip
def test_gpu_zoo_first_finding(scenario, expected):
    assert _first(f"{scenario}/bad") == expected


def test_gpu_zoo_unfused_chains_are_named_among_the_computation_findings():
    # the eager host (12.5 ms a step unprofiled, measured where the device lagged) is nearly as long
    # as the device's 15.3 ms, so fusing the chains alone gains little; torch.compile's 2.3x also
    # removes host work. hermes opens with the memory-bound operators (C-COMP-004), then the chains
    d = GPU_ZOO / "gpu_unfused_elementwise"
    if not d.is_dir():
        pytest.skip("not recorded")
    fs = hermes_kb.advise(d / "bad").findings
    assert fs[0].category == "computation" and "C-COMP-003" in [f.case_id for f in fs[:3]]


def test_gpu_zoo_launch_blocking_names_the_setting_and_the_trace_agrees():
    d = GPU_ZOO / "gpu_launch_blocking"
    if not d.is_dir():
        pytest.skip("not recorded")
    ids = [f.case_id for f in hermes_kb.advise(d / "bad").findings]
    assert ids[0] in ("C-MON-010", "C-CPU-008") and "C-CPU-008" in ids and "C-CPU-001" not in ids
    assert "C-CPU-008" not in [f.case_id for f in hermes_kb.advise(d / "fixed").findings]


def test_gpu_zoo_fp32_gain_covers_the_measured_speedup():
    d = GPU_ZOO / "gpu_fp32_matmul"
    if not d.is_dir():
        pytest.skip("not recorded")
    measured = json.loads((d / "label.json").read_text())["speedup_of_fix"]
    (f,) = [f for f in hermes_kb.advise(d / "bad").findings if f.case_id == "C-COMP-001"]
    assert f.expected_speedup.low <= measured <= f.expected_speedup.high * 1.1


# ---------------------------------------------------------------- second GPU lease (2026-11-28)


def _convs(search: bool) -> list[dict]:
    """One step [0, 10000): two aten::cudnn_convolution calls of 3000 µs at 1000 and 5000, each
    launching a kernel. Searching, cuDNN's benchmark mode times candidates: a cudaDeviceSynchronize
    (400 µs) inside each call. A cached algorithm launches its kernel and waits for nothing."""
    ev = [X("user_annotation", "ProfilerStep#1", 0, 10000)]
    for i, t0 in enumerate((1000, 5000)):
        ev += [OP("aten::cudnn_convolution", t0, 3000, 20 + i), RT("cudaLaunchKernel", t0 + 100, 10, 200 + i, 20 + i),
               K("sm90_xmma_fprop_implicit_gemm_bf16", t0 + 150, 300, 200 + i)]  # fmt: skip
        if search:
            ev.append(RT("cudaDeviceSynchronize", t0 + 500, 400, 300 + i, 20 + i))
    return ev


def test_a_convolution_that_synchronises_inside_is_an_algorithm_search(tmp_path):
    comp = [f for f in A.per_rank(ctx_of(tmp_path, _convs(True))) if f.kind == "compilation" and f.step is None]
    # both calls search: 2 x 3000 µs of the 10000 µs step
    assert len(comp) == 1 and comp[0].autotune_us == pytest.approx(6000.0) and comp[0].autotune_count == 2
    assert comp[0].compile_ratio == pytest.approx(0.6)
    (tmp_path / "b").mkdir()
    assert not [f for f in A.per_rank(ctx_of(tmp_path / "b", _convs(False))) if f.kind == "compilation"]


def _sdpa(mask: bool) -> list[dict]:
    """Two SDPA calls, each launching one 1000 µs cuDNN attention kernel; with ``mask`` the calls
    pass a [1024, 1024] bool mask (4th argument) and is_causal=False, else no mask and True."""
    ev = [X("user_annotation", "ProfilerStep#1", 0, 5000)]
    for i, t0 in enumerate((500, 2500)):
        args = {"External id": 40 + i,
                "Input Dims": [[16, 16, 1024, 64]] * 3 + [[1024, 1024] if mask else [], [], [], [], []],
                "Input type": ["c10::BFloat16"] * 3 + ["bool" if mask else "", "Scalar", "Scalar", "", "Scalar"],
                "Concrete Inputs": ["", "", "", "", "0.", "False" if mask else "True", "", "False"]}  # fmt: skip
        ev += [X("cpu_op", "aten::scaled_dot_product_attention", t0, 1200, args=args),
               RT("cudaLaunchKernel", t0 + 50, 10, 400 + i, 40 + i),
               K("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", t0 + 100, 1000, 400 + i)]  # fmt: skip
    return ev


def _attention_fact(path: Path, events: list[dict]):
    (f,) = [f for f in hermes_kb.analyze(write_trace(path, events)) if f.kind == "attention_backends" and f.step is None]
    return f


def test_sdpa_calls_given_a_mask_tensor_are_counted(tmp_path):
    a = _attention_fact(tmp_path / "masked.json", _sdpa(True))
    # both calls masked, is_causal False: all 2000 µs of cuDNN attention belong to masked calls
    assert (a.sdpa_calls_count, a.masked_calls_count, a.masked_not_causal_count) == (2, 2, 2)
    assert a.cudnn_us == pytest.approx(2000.0) and a.masked_us == pytest.approx(2000.0)
    b = _attention_fact(tmp_path / "causal.json", _sdpa(False))
    assert b.masked_calls_count == 0 and b.masked_us == 0.0


def _raw(run: str) -> list[dict]:
    import gzip

    return json.load(gzip.open(GPU_ZOO / run / "rank0.capture-profile.json.gz"))["traceEvents"]


@pytest.mark.parametrize("scenario,expected", [
    ("gpu_sdpa_mask", "C-COMP-045"), ("gpu_cudnn_multiscale", "C-CPU-015"), ("gpu_optimizer_foreach", "C-COMP-025"),
    ("gpu_fp64_logits", "C-COMP-028"), ("gpu_sdpa_math", "C-COMP-007"),
])  # fmt: skip
def test_gpu_zoo_second_lease_first_finding(scenario, expected):
    assert _first(f"{scenario}/bad") == expected


def test_gpu_zoo_masked_sdpa_calls_match_the_raw_trace():
    if not (GPU_ZOO / "gpu_sdpa_mask").is_dir():
        pytest.skip("not recorded")
    for variant, masked in (("bad", True), ("fixed", False)):
        ev = _raw(f"gpu_sdpa_mask/{variant}")
        calls = [e for e in ev if e.get("name") == "aten::scaled_dot_product_attention"]
        with_mask = sum(1 for e in calls if e["args"]["Input Dims"][3])
        assert with_mask == (len(calls) if masked else 0)
        facts = hermes_kb.analyze(GPU_ZOO / "gpu_sdpa_mask" / variant)
        (a,) = [f for f in facts if f.kind == "attention_backends" and f.step is None]
        assert a.masked_calls_count == with_mask and a.sdpa_calls_count == len(calls)


def test_gpu_zoo_cudnn_search_is_autotuning_and_not_eager_dispatch():
    d = GPU_ZOO / "gpu_cudnn_multiscale"
    if not d.is_dir():
        pytest.skip("not recorded")
    fs = hermes_kb.advise(d / "bad").findings
    ids = [f.case_id for f in fs]
    assert ids[0] == "C-CPU-015" and "C-CPU-002" not in ids
    # searches hold 98.5% of the captured steps; removing them all (host time, trial kernels and
    # waits) leaves the real convolutions: far more than the 1.4-1.7x of a host-time-only replay
    assert fs[0].expected_speedup.high > 20
    # the fixed twin (benchmark off) never synchronises inside a convolution
    assert "C-CPU-015" not in [f.case_id for f in hermes_kb.advise(d / "fixed").findings]


def test_gpu_zoo_math_path_gemms_are_attentions_not_the_models_precision():
    # SDPA's math path upcasts bf16 to FP32: its GEMMs run on CUDA cores, but the fix is a fused
    # backend, so they are not C-COMP-001's; the model's own GEMMs are bf16
    d = GPU_ZOO / "gpu_sdpa_math"
    if not d.is_dir():
        pytest.skip("not recorded")
    facts = hermes_kb.analyze(d / "bad")
    (tc,) = [f for f in facts if f.kind == "tensor_core_usage" and f.step is None]
    (m,) = [f for f in facts if f.kind == "sdpa_math_fallback" and f.step is None]
    # what stays are FP32 GEMMs whose launch call the capture missed (33 ms: the profiler started
    # after they were queued), so nothing ties them to an operator
    assert tc.fp32_non_tensor_core_gemm_time_us < 0.1 * m.device_us
    # forward and backward of the math path: over half the device time (forward alone was a third)
    assert m.share_of_device_time_ratio > 0.5
    assert "C-COMP-001" not in [f.case_id for f in hermes_kb.advise(d / "bad").findings]


def test_launch_calls_held_by_a_full_queue_wait_for_the_device(tmp_path):
    """Six 1000 µs kernels queued back to back from 30 µs on. Four launch calls take 10 µs; two
    return 5 µs after a kernel ends (965 and 995 µs: the launch queue was full and a finished kernel
    freed a slot). Those two are waits on the device, not host work; the short ones are not."""
    from hermes_kb.analyzers.timeline.graph_build import build_graph

    calls = [(10, 10), (30, 10), (50, 10), (70, 965), (1040, 995), (2040, 10)]
    ev = [X("user_annotation", "ProfilerStep#1", 0, 7000)]
    for i, (ts, dur) in enumerate(calls):
        ev += [OP("aten::mm", ts - 2, dur + 4, 50 + i), RT("cudaLaunchKernel", ts, dur, 500 + i, 50 + i),
               K("gemm", 30 + 1000 * i, 1000, 500 + i)]  # fmt: skip
    g = build_graph(ctx_of(tmp_path, ev))
    assert g.edges.get("launch_queue_full") == 2


def test_pinned_copies_at_the_host_links_rate():
    # PCIe x16 one direction: Gen5 63 GB/s (H200), Gen4 31.5 (A100), Gen3 15.75 (V100); unknown: None
    assert lookup("NVIDIA H200").host_link_bytes_per_s == pytest.approx(63e9)
    assert lookup("NVIDIA A100-SXM4-80GB").host_link_bytes_per_s == pytest.approx(31.5e9)
    assert lookup("Tesla V100-SXM2-16GB").host_link_bytes_per_s == pytest.approx(15.75e9)
    assert lookup("NVIDIA GeForce RTX 4090") is None
    d = GPU_ZOO / "gpu_pageable_copy"
    if not d.is_dir():
        pytest.skip("not recorded")
    (h,) = [f for f in hermes_kb.analyze(d / "bad") if f.kind == "h2d_copies" and f.src == "pageable"]
    # six 78,643,200-byte image batches (and their small label tensors) at 80% of 63 GB/s
    assert h.copied_bytes == 471_871_488
    pinned = 471_871_488 / (0.8 * 63e9) * 1e6  # 9,362.5 µs
    assert h.pinned_copy_us == pytest.approx(pinned)
    assert h.pinned_removes_low_ratio == pytest.approx(1 - pinned / h.waited_us)
    assert h.pinned_removes_high_ratio == 1.0
