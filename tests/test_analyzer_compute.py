"""compute analyzer: kernel classes, FLOPs/roofline/MFU, tensor cores, short kernels, fusion candidates.

Expected values are worked out by hand in the comments next to each assertion.
"""

from __future__ import annotations

import math

import pytest

import hermes_kb
from hermes_kb.analysis.rank import _guarded
from hermes_kb.analyzers.compute import compute as C
from hermes_kb.analyzers.compute.fusion import TOP_FUSION
from hermes_kb.analyzers.compute.kernel_classes import classify_kernel
from hermes_kb.analyzers.compute.kernel_names import is_fp32_kernel, short_kernel_name, tensor_core_kind
from hermes_kb.analyzers.compute.roofline import TOP_OPS
from hermes_kb.analyzers.compute.flops import op_cost
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import EXAMPLE, X, kineto_traces, write_trace
from hermes_kb.core.devices import DEVICES, lookup
from hermes_kb.facts.steps import AnalyzerError

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936, "computeMajor": 9,
         "computeMinor": 0, "numSms": 132, "warpSize": 32}]  # fmt: skip

GEMM_BF16 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
ADD_K = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
         "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")  # fmt: skip
MUL_K = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int)")  # fmt: skip
NCCL_K = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def facts_of(path, kind=None, rank=None):
    b = hermes_kb.load(path)
    trace = b[rank] if rank is not None else next(iter(b))
    ctx, _ = step_context(trace)
    fs = C.per_rank(ctx)
    return [f for f in fs if kind is None or f.kind == kind]


class Trace:
    """Builds a trace: cpu ops, their launches and kernels (correlation = 1000 + External id)."""

    def __init__(self):
        self.ev = [X("user_annotation", "ProfilerStep#1", 0, 1000, tid=1)]

    def op(self, name, ts, dur, ext, dims=None, types=None, tid=1):
        args = {"External id": ext}
        if dims is not None:
            args.update({"Input Dims": dims, "Input type": types})
        self.ev.append(X("cpu_op", name, ts, dur, tid=tid, args=args))

    def kernel(self, name, ts, dur, ext, launch_ts, stream=7, tid=1):
        corr = 1000 + ext + 10000 * len(self.ev)
        self.ev.append(X("cuda_runtime", "cudaLaunchKernel", launch_ts, 1, tid=tid,
                         args={"External id": ext, "correlation": corr}))  # fmt: skip
        self.ev.append(X("kernel", name, ts, dur, pid=0, tid=stream,
                         args={"External id": ext, "correlation": corr, "device": 0, "stream": stream}))  # fmt: skip

    def write(self, path, **top):
        return write_trace(path, self.ev, deviceProperties=H100, **top)


# --- classification ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, cls", [
    ("volta_sgemm_128x64_nn", "gemm"),
    (GEMM_BF16, "gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(x)", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(x)", "gemm"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32", "conv"),
    ("cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1", "conv"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8", "conv"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128> >(x)", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char>(x)", "memory"),
    (ADD_K, "elementwise"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int)", "memory"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(x)",
     "memory"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >(x)",
     "reduction"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*)", "reduction"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int)", "norm"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 32, true, 1, true>(x)", "norm"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("Memcpy DtoD (Device -> Device)", "memory"),
    ("triton_poi_fused_add_cos_sin_0", "elementwise"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "norm"),  # RMSNorm: mean + rsqrt
    ("triton_per_fused__softmax_amax_exp_sum_3", "reduction"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("triton__0d1d2d3d", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&)>(int)",
     "elementwise"),  # 'fbgemm' is not a GEMM
    ("void split_embedding_codegen_forward_unweighted_kernel<float, float, float>(x)", "other"),
])  # fmt: skip
def test_kernel_classes(name, cls):
    assert classify_kernel(name) == cls


@pytest.mark.parametrize("name, kind, fp32", [
    ("volta_sgemm_128x64_nn", "no_tensor", True),
    ("ampere_sgemm_32x128_tn", "no_tensor", True),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(x)", "no_tensor", True),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(x)", "tensor", True),  # TF32
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(x)", "tensor", False),
    (GEMM_BF16, "tensor", False),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32", "tensor", True),
    ("cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1", "no_tensor", True),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN", "tensor", True),  # MFMA FP32 (MI250)
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN", "tensor", False),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(x)", "no_tensor", True),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true>(x)", "aux", True),
])  # fmt: skip
def test_tensor_core_detection(name, kind, fp32):
    assert tensor_core_kind(name) == kind
    assert is_fp32_kernel(name) is fp32


def test_short_names():
    assert short_kernel_name(ADD_K) == "vectorized_elementwise_kernel:add"
    assert short_kernel_name(MUL_K) == "vectorized_elementwise_kernel:Mul"
    assert short_kernel_name("triton_poi_fused_add_cos_sin_0") == "triton_poi:add_cos_sin"
    assert short_kernel_name("void (anonymous namespace)::softmax_warp_forward<float>(float*)") == "softmax_warp_forward"


# --- FLOP formulas -------------------------------------------------------------------------------
def test_flop_formulas():
    # mm [64,128]x[128,256] bf16: 2*64*128*256 = 4_194_304 FLOPs; bytes (8192 + 32768 + 16384) * 2 = 114_688
    c = op_cost("aten::mm", "[[64, 128], [128, 256]]", '["c10::BFloat16", "c10::BFloat16"]')
    assert (c.flops, c.bytes, c.dtype, c.category, c.exact) == (4_194_304, 114_688, "bf16", "gemm", True)
    # addmm adds the bias: 2*16*32*8 + 16*8 = 8320; bytes (8 + 512 + 256 + 128) * 4 = 3616
    c = op_cost("aten::addmm", "[[8], [16, 32], [32, 8], [], []]", '["float", "float", "float", "Scalar", "Scalar"]')
    assert (c.flops, c.bytes) == (8320, 3616)
    # bmm [4,8,16]x[4,16,2]: 2*4*8*16*2 = 2048
    assert op_cost("aten::bmm", "[[4, 8, 16], [4, 16, 2]]", '["float", "float"]').flops == 2048
    # matmul broadcasts [3,1,8,16] @ [5,16,4]: batch 3*5 = 15 -> 2*15*8*16*4 = 15360
    assert op_cost("aten::matmul", "[[3, 1, 8, 16], [5, 16, 4]]", '["float", "float"]').flops == 15360
    # linear [2,10,32] x W[8,32] + b[8]: rows 20 -> 2*20*32*8 + 20*8 = 10400
    assert op_cost("aten::linear", "[[2, 10, 32], [8, 32], [8]]", '["float", "float", "float"]').flops == 10400
    # conv2d [2,3,32,32] * [16,3,3,3]: no stride known -> output 32x32 assumed: 2*2*16*1024*3*9 = 1_769_472, inexact
    c = op_cost("aten::conv2d", "[[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]",
                '["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"]')  # fmt: skip
    assert (c.flops, c.exact) == (1_769_472, False)
    # with Concrete Inputs (stride 2, padding 1): output 16x16 -> 2*2*16*256*27 = 442_368, exact
    c = op_cost("aten::conv2d", "[[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]",
                '["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"]',
                '["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]')  # fmt: skip
    assert (c.flops, c.exact) == (442_368, True)
    # SDPA q,k,v [2,4,128,64]: 2*B*H*Lq*Lk*(D+Dv) = 2*8*128*128*128 = 33_554_432 (non-causal upper bound)
    c = op_cost("aten::scaled_dot_product_attention", "[[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]]",
                '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]')  # fmt: skip
    assert (c.flops, c.category, c.exact) == (33_554_432, "attention", False)
    # flash forward uses [B, L, H, D]: same numbers
    assert op_cost("aten::_flash_attention_forward", "[[2, 128, 4, 64], [2, 128, 4, 64], [2, 128, 4, 64]]",
                   '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]').flops == 33_554_432  # fmt: skip
    # element-wise with broadcast [4,1,8] + [3,8] -> [4,3,8]: 96 FLOPs, bytes (32 + 24 + 96) * 4 = 608
    c = op_cost("aten::add", "[[4, 1, 8], [3, 8], []]", '["float", "float", "Scalar"]')
    assert (c.flops, c.bytes, c.category) == (96, 608, "elementwise")
    # a wrapped Python scalar ('double', 0-d) does not make mul_ an fp64 op
    assert op_cost("aten::mul_", "[[10], []]", '["float", "double"]').dtype == "fp32"
    # copy_ bf16 -> fp32 [10,10]: 0 FLOPs, 100*4 + 100*2 = 600 bytes
    c = op_cost("aten::copy_", "[[10, 10], [10, 10], []]", '["float", "c10::BFloat16", "Scalar"]')
    assert (c.flops, c.bytes, c.category) == (0, 600, "memory")
    assert op_cost("aten::mm", "[[64, 128], [64, 256]]", '["float", "float"]') is None  # K mismatch
    assert op_cost("aten::view", "[[4]]", '["float"]') is None


# --- device table --------------------------------------------------------------------------------
def test_device_lookup():
    assert lookup({"name": "Tesla V100-SXM2-32GB"}).key == "v100-sxm2"
    assert lookup({"name": "NVIDIA A100-SXM4-80GB"}).key == "a100-sxm4-80gb"
    assert lookup({"name": "NVIDIA A100-PG509-200", "totalGlobalMem": 42297524224}).key == "a100-sxm4-40gb"
    assert lookup({"name": "NVIDIA H100 80GB HBM3"}).key == "h100-sxm"
    assert lookup("NVIDIA H100 PCIe").key == "h100-pcie"
    assert lookup("NVIDIA H200").key == "h200-sxm"
    assert lookup("NVIDIA B200").key == "b200"
    assert lookup("AMD Instinct MI300X VF").key == "mi300x"
    radeon = {"name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "numSms": 104, "warpSize": 64}
    assert lookup(radeon).key == "mi250-gcd" and lookup(radeon).matched_by == "architecture"
    nameless = {"name": "", "computeMajor": 9, "computeMinor": 4, "numSms": 304, "warpSize": 64,
                "totalGlobalMem": 206141652992}  # fmt: skip
    assert lookup(nameless).key == "mi300x"
    assert lookup("Ascend910B3").key == "ascend910b"
    assert lookup("NVIDIA GeForce RTX 2080 Ti") is None
    assert lookup(None) is None
    h = DEVICES["h100-sxm"]
    assert h.matmul_peak("bf16") == ("bf16", 989.5e12)
    assert h.matmul_peak("fp32") == ("fp32", 67e12)
    assert h.matmul_peak("fp32", fp32_uses_tf32=True) == ("tf32", 494.5e12)
    assert DEVICES["mi300x"].matmul_peak("fp32") == ("fp32_matrix", 163.4e12)
    assert DEVICES["v100-sxm2"].matmul_peak("fp16") == ("fp16", 125e12)
    assert DEVICES["v100-sxm2"].matmul_peak("bf16") == ("fp32", 15.7e12)  # no BF16 tensor cores on Volta


def test_every_device_number_has_a_source():
    for d in DEVICES.values():
        for key in [*d.peak_flops, "hbm"]:
            assert d.sources.get(key, "").startswith("https://"), (d.key, key)
        assert d.hbm_bytes_per_s > 0
        assert all(v > 0 for v in d.peak_flops.values())


# --- hand-made GPU trace ---------------------------------------------------------------------------
def gpu_trace(tmp_path):
    t = Trace()
    bf, f = '"c10::BFloat16"', '"float"'
    # a big bf16 mm: 2*4096^3 = 137_438_953_472 FLOPs, bytes 3*4096*4096*2 = 100_663_296, kernel 200 µs
    t.op("aten::mm", 10, 20, 1, [[4096, 4096], [4096, 4096]], ["c10::BFloat16"] * 2)
    t.kernel(GEMM_BF16, 100, 200, 1, launch_ts=15)
    # a small bf16 mm: 2*64*128*256 = 4_194_304 FLOPs, 114_688 bytes, kernel 50 µs
    t.op("aten::mm", 40, 20, 2, [[64, 128], [128, 256]], ["c10::BFloat16"] * 2)
    t.kernel(GEMM_BF16, 300, 50, 2, launch_ts=45)
    # fp32 add of 2^20 elements: 1_048_576 FLOPs, 3 * 4 MiB = 12_582_912 bytes, kernel 5 µs
    t.op("aten::add", 70, 10, 3, [[1048576], [1048576], []], ["float", "float", "Scalar"])
    t.kernel(ADD_K, 400, 5, 3, launch_ts=72)
    # an NCCL all-reduce (no shapes) on another stream, 100 µs
    t.op("record_param_comms", 90, 5, 4)
    t.kernel(NCCL_K, 500, 100, 4, launch_ts=91, stream=20)
    # a 2 µs HtoD copy
    t.ev.append(X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 700, 2, pid=0, tid=7,
                  args={"device": 0, "stream": 7, "correlation": 99999, "bytes": 4096}))  # fmt: skip
    assert bf and f
    return t.write(tmp_path / "gpu.json")


def test_class_shares_short_kernels_and_tensor_cores(tmp_path):
    fs = facts_of(gpu_trace(tmp_path))
    cls = {f.kernel_class: f for f in fs if f.kind == "kernel_class_share"}
    # device time: gemm 200 + 50 = 250, elementwise 5, communication 100, memory (memcpy) 2 -> total 357
    assert set(cls) == {"gemm", "elementwise", "communication", "memory"}
    assert cls["gemm"].time_us == 250 and cls["gemm"].count == 2
    assert cls["gemm"].share_of_device_time_ratio == pytest.approx(250 / 357)
    assert cls["communication"].share_of_device_time_ratio == pytest.approx(100 / 357)
    assert cls["memory"].time_us == 2 and cls["memory"].evidence.counts == {"kernels": 0, "memcpy_memset": 1}
    assert sum(f.share_of_device_time_ratio for f in cls.values()) == pytest.approx(1.0)
    # one step, 0..1000 µs (the last launched kernel ends at 600 < 1000): gemm busy 250 / 1000
    assert cls["gemm"].share_of_step_time_ratio == pytest.approx(0.25)

    short = next(f for f in fs if f.kind == "short_kernels")
    # kernels: 200, 50, 5, 100 -> one under 10 µs; kernel time 355
    assert (short.kernels_count, short.short_count) == (4, 1)
    assert short.short_time_ratio == pytest.approx(5 / 355)
    assert short.mean_duration_us == pytest.approx(355 / 4) and short.median_duration_us == pytest.approx(75)

    tc = next(f for f in fs if f.kind == "tensor_core_usage")
    assert tc.gemm_time_us == 250 and tc.tensor_core_ratio == 1.0 and tc.fp32_non_tensor_core_gemm_ratio == 0.0


def test_roofline_classes_and_mfu(tmp_path):
    fs = facts_of(gpu_trace(tmp_path))
    rows = [f for f in fs if f.kind == "operator_roofline"]
    by_shape = {f.shape: f for f in rows}
    # longest first: big mm 200 µs, small mm 50 µs, add 5 µs (record_param_comms is not recognised)
    assert [f.time_us for f in rows] == [200, 50, 5]
    big = by_shape["[4096,4096]x[4096,4096]"]
    # P = 137_438_953_472 / 200e-6 = 6.872e14 FLOP/s = 0.6945 of 989.5e12; AI = 1365.3 > AI* = 989.5/3.35 = 295.4
    assert big.achieved_flops_per_s == pytest.approx(2 * 4096**3 / 200e-6)
    assert big.compute_utilisation_ratio == pytest.approx(2 * 4096**3 / 200e-6 / 989.5e12)
    assert big.arithmetic_intensity_flop_per_byte == pytest.approx(2 * 4096**3 / (3 * 4096 * 4096 * 2))
    assert big.ridge_point_flop_per_byte == pytest.approx(989.5e12 / 3.35e12)
    assert big.roofline_class == "compute_bound" and big.peak_dtype == "bf16"
    # small mm: 4_194_304 / 50e-6 = 8.4e10 FLOP/s (1e-4 of peak), 114_688 / 50e-6 = 2.3 GB/s: underutilised
    small = by_shape["[64,128]x[128,256]"]
    assert small.roofline_class == "underutilised"
    assert small.achieved_gbps == pytest.approx(114_688 / 50e-6 / 1e9)
    # add: AI = 1_048_576 / 12_582_912 = 1/12 <= AI* (67e12 / 3.35e12 = 20, the vector FP32 peak);
    # B = 12_582_912 / 5e-6 = 2.517e12 B/s = 0.751 of 3.35e12 >= 0.5: memory bound
    add = by_shape["[1048576]x[1048576]"]
    assert add.peak_dtype == "fp32" and add.ridge_point_flop_per_byte == pytest.approx(20.0)
    assert add.bandwidth_utilisation_ratio == pytest.approx(12_582_912 / 5e-6 / 3.35e12)
    assert add.roofline_class == "memory_bound"

    summary = next(f for f in fs if f.kind == "roofline_summary")
    assert summary.compute_bound_time_us == 200 and summary.underutilised_time_us == 50
    assert summary.memory_bound_time_us == 5
    assert summary.underutilised_ratio == pytest.approx(50 / 255)
    # attributed: 255 µs of the 255 µs of non-communication kernels (the memcpy has no launch)
    assert summary.attributed_time_ratio == pytest.approx(1.0)

    mfu = next(f for f in fs if f.kind == "model_flops_utilization")
    flops = 2 * 4096**3 + 4_194_304 + 1_048_576
    assert mfu.flops == flops and mfu.dominant_dtype == "bf16" and mfu.peak_dtype == "bf16"
    # one 1000 µs window on an H100 (989.5 TFLOP/s bf16)
    assert mfu.mfu_ratio == pytest.approx(flops / 1e-3 / 989.5e12)
    assert mfu.device == "NVIDIA H100 SXM5 80GB"


def test_attribution_falls_back_to_the_enclosing_op(tmp_path):
    # old traces number kernels' External ids differently from cpu ops: the launch at ts 15 on
    # thread 1 lies inside aten::mm (10..30), so its kernel is still the mm's
    t = Trace()
    t.op("aten::mm", 10, 20, 1, [[64, 128], [128, 256]], ["c10::BFloat16"] * 2)
    t.kernel(GEMM_BF16, 100, 50, 555, launch_ts=15)
    rows = facts_of(t.write(tmp_path / "t.json"), "operator_roofline")
    assert len(rows) == 1 and rows[0].operator == "aten::mm" and rows[0].time_us == 50 and rows[0].kernels_count == 1


def test_unknown_device_gives_no_roofline_class(tmp_path):
    t = Trace()
    t.op("aten::mm", 10, 20, 1, [[64, 128], [128, 256]], ["c10::BFloat16"] * 2)
    t.kernel(GEMM_BF16, 100, 50, 1, launch_ts=15)
    p = write_trace(tmp_path / "t.json", t.ev, deviceProperties=[{"id": 0, "name": "Mystery GPU"}])
    fs = facts_of(p)
    row = next(f for f in fs if f.kind == "operator_roofline")
    assert row.roofline_class is None and row.peak_flops_per_s is None
    assert "not in the peak table" in row.evidence.note
    mfu = next(f for f in fs if f.kind == "model_flops_utilization")
    assert mfu.mfu_ratio is None and mfu.achieved_flops_per_s == pytest.approx(4_194_304 / 1e-3)


def test_fusion_candidates(tmp_path):
    t = Trace()
    # stream 7: add mul add mul add mul (5 µs each), then a GEMM; a kernel on stream 8 in between in
    # time must not break the run. 2-gram [add, mul] covers all 6 kernels -> 3 occurrences, 30 µs;
    # [mul, add] occurs twice (< 3) and the longer n-grams at most twice: only one sequence.
    for i, name in enumerate([ADD_K, MUL_K] * 3):
        t.kernel(name, 100 + 10 * i, 5, 10 + i, launch_ts=1 + i)
    t.kernel(ADD_K, 112, 3, 30, launch_ts=20, stream=8)
    t.kernel(GEMM_BF16, 200, 50, 40, launch_ts=21)
    fs = facts_of(t.write(tmp_path / "t.json"), "fusion_candidates")
    assert len(fs) == 1
    f = fs[0]
    assert [s.kernels for s in f.sequences] == [["elementwise:vectorized_elementwise_kernel:add",
                                                  "elementwise:vectorized_elementwise_kernel:Mul"]]  # fmt: skip
    s = f.sequences[0]
    assert (s.occurrences_count, s.total_time_us, s.mean_time_us) == (3, 30, 10)
    # kernel time 6*5 + 3 + 50 = 83; candidates: 7 element-wise kernels, 33 µs
    assert s.share_of_kernel_time_ratio == pytest.approx(30 / 83)
    assert (f.candidate_kernels_count, f.candidate_time_us) == (7, 33)


def test_overlapping_occurrences_are_not_double_counted(tmp_path):
    t = Trace()
    # 8 consecutive adds: seven 2-grams overlap, but they cover 8 kernels -> 4 occurrences of
    # [add, add] (40 µs); [add, add, add, add] covers the same 8 kernels -> 2 occurrences < 3
    for i in range(8):
        t.kernel(ADD_K, 100 + 10 * i, 5, 10 + i, launch_ts=1 + i)
    f = facts_of(t.write(tmp_path / "t.json"), "fusion_candidates")[0]
    assert [(len(s.kernels), s.occurrences_count, s.total_time_us) for s in f.sequences] == [(2, 4, 40)]


# --- CPU-only --------------------------------------------------------------------------------------
def cpu_trace(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        # linear (100) > t (10), addmm (80); relu (20) > clamp_min (15); view (5)
        X("cpu_op", "aten::linear", 10, 100, args={"External id": 1, "Input Dims": [[16, 32], [8, 32], [8]],
                                                   "Input type": ["float", "float", "float"]}),  # fmt: skip
        X("cpu_op", "aten::t", 12, 10, args={"External id": 2, "Input Dims": [[8, 32]], "Input type": ["float"]}),
        X("cpu_op", "aten::addmm", 25, 80, args={"External id": 3, "Input Dims": [[8], [16, 32], [32, 8], [], []],
                                                 "Input type": ["float", "float", "float", "Scalar", "Scalar"]}),  # fmt: skip
        X("cpu_op", "aten::relu", 200, 20, args={"External id": 4, "Input Dims": [[16, 8]], "Input type": ["float"]}),
        X("cpu_op", "aten::clamp_min", 202, 15, args={"External id": 5, "Input Dims": [[16, 8], []],
                                                      "Input type": ["float", "Scalar"]}),  # fmt: skip
        X("cpu_op", "aten::view", 300, 5, args={"External id": 6, "Input Dims": [[16, 8], []],
                                                "Input type": ["float", "ScalarList"]}),  # fmt: skip
    ]
    return write_trace(tmp_path / "cpu.json", ev)


def test_cpu_only_classes_and_flops(tmp_path):
    fs = facts_of(cpu_trace(tmp_path))
    cls = {f.kernel_class: f for f in fs if f.kind == "kernel_class_share"}
    # self times: linear 100-10-80 = 10 and addmm 80 -> gemm 90; relu 20-15 = 5 and clamp_min 15 ->
    # elementwise 20; t 10 and view 5 -> other 15; total 125
    assert {c: f.time_us for c, f in cls.items()} == {"gemm": 90, "elementwise": 20, "other": 15}
    assert cls["gemm"].share_of_device_time_ratio == pytest.approx(90 / 125)
    assert all(f.source == "cpu_op" for f in cls.values())
    assert not [f for f in fs if f.kind in ("short_kernels", "tensor_core_usage", "fusion_candidates")]

    rows = [f for f in fs if f.kind == "operator_roofline"]
    # the outermost recognised op of each tree counts (linear, not the addmm inside it):
    # linear 2*16*32*8 + 16*8 = 8320 FLOPs over its 100 µs; relu 16*8 = 128 FLOPs over 20 µs
    assert [(f.operator, f.flops, f.time_us) for f in rows] == [("aten::linear", 8320, 100), ("aten::relu", 128, 20)]
    assert all(f.roofline_class is None and f.time_source == "cpu" for f in rows)
    mfu = next(f for f in fs if f.kind == "model_flops_utilization")
    assert mfu.flops == 8320 + 128 and mfu.mfu_ratio is None
    assert mfu.achieved_flops_per_s == pytest.approx((8320 + 128) / 1e-3)


def test_bundled_cpu_example():
    fs = facts_of(EXAMPLE)
    cls = {f.kernel_class: f for f in fs if f.kind == "kernel_class_share"}
    assert cls and all(f.source == "cpu_op" for f in cls.values())
    assert sum(f.share_of_device_time_ratio for f in cls.values()) == pytest.approx(1.0)
    # the MLP's matmuls are the largest operator class; the step itself is data loading (>90%)
    assert max(cls.values(), key=lambda f: f.time_us).kernel_class == "gemm"
    assert cls["gemm"].share_of_step_time_ratio < 0.1
    rows = [f for f in fs if f.kind == "operator_roofline"]
    assert rows[0].operator == "aten::linear" and rows[0].shape == "[16,3072]x[128,3072]x[128]"
    # 2*16*3072*128 + 16*128 = 12_584_960 FLOPs per call, 5 calls
    assert rows[0].flops == 5 * (2 * 16 * 3072 * 128 + 16 * 128)


# --- real traces --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name)
def test_runs_on_every_real_trace(path):
    b = hermes_kb.load(path)
    for trace in b:
        ctx, _ = step_context(trace)
        fs = _guarded("compute", trace.rank, lambda: C.per_rank(ctx))
        assert not [f for f in fs if isinstance(f, AnalyzerError)], fs
        assert len(fs) <= 30
        for source in ("kernel", "cpu_op"):
            shares = [f.share_of_device_time_ratio for f in fs if f.kind == "kernel_class_share" and f.source == source]
            if shares:
                assert sum(shares) == pytest.approx(1.0)
        assert len([f for f in fs if f.kind == "operator_roofline"]) <= TOP_OPS
        for f in fs:
            assert f.rank == trace.rank
            if f.kind == "fusion_candidates":
                assert 1 <= len(f.sequences) <= TOP_FUSION
            if f.kind == "operator_roofline":
                assert f.time_us > 0 and f.flops >= 0 and math.isfinite(f.achieved_flops_per_s)
            if f.kind == "model_flops_utilization" and f.mfu_ratio is not None:
                assert 0 <= f.mfu_ratio <= 1


def test_real_h100_qwen(shared):
    fs = facts_of(shared / "tracelens" / "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    cls = {f.kernel_class: f for f in fs if f.kind == "kernel_class_share"}
    # bf16 inference: GEMMs on tensor cores, lots of unfused element-wise work
    assert cls["gemm"].share_of_device_time_ratio > 0.2 and cls["elementwise"].share_of_device_time_ratio > 0.3
    tc = next(f for f in fs if f.kind == "tensor_core_usage")
    assert tc.tensor_core_ratio > 0.99
    mfu = next(f for f in fs if f.kind == "model_flops_utilization")
    assert mfu.dominant_dtype == "bf16" and mfu.device == "NVIDIA H100 SXM5 80GB" and 0.05 < mfu.mfu_ratio < 0.3
    rows = [f for f in fs if f.kind == "operator_roofline"]
    assert rows[0].category == "gemm" and rows[0].roofline_class == "compute_bound"
    assert next(f for f in fs if f.kind == "fusion_candidates").sequences


def test_real_v100_fp32_without_tensor_cores(shared):
    fs = facts_of(shared / "hta" / "df_index_resolver" / "df_index_resolver.json.gz", rank=1)
    tc = next(f for f in fs if f.kind == "tensor_core_usage")
    # FP32 DDP on V100: every GEMM is a volta_sgemm (CUDA cores) apart from split-K helpers
    assert tc.tensor_core_ratio == 0.0 and tc.fp32_non_tensor_core_gemm_ratio > 0.9
    assert not [f for f in fs if f.kind == "operator_roofline"]  # shapes were not recorded
