"""kernels analyzer: the per-kernel part of the compute analysis (analyzers/compute/kernels.py).

Every expected number is worked out by hand in the comment next to its assertion; the real-trace
tests recompute theirs from the raw JSON with the standard library.
"""

from __future__ import annotations

import gzip
import json

import pytest

import hermes_kb
from hermes_kb.analyzers.compute import compute as C
from hermes_kb.analyzers.compute import kernels as K
from hermes_kb.analyzers.compute import npu_tasks
from hermes_kb.analyzers.compute.kernel_roofline import TOP_KERNELS
from hermes_kb.analyzers.compute.layouts import copy_kind_of_name, narrow_alignment
from hermes_kb.analyzers.compute.npu_tasks import cube_inner_axes_aligned, fa_dims
from hermes_kb.analyzers.compute.precision import is_fp64_kernel
from hermes_kb.analyzers.compute.training_step import optimizer_kernel_kind
from hermes_kb.analysis.rank import _guarded, analyze_rank
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, kineto_traces, write_trace
from hermes_kb.facts.steps import AnalyzerError

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936, "computeMajor": 9,
         "computeMinor": 0, "numSms": 132, "warpSize": 32}]  # fmt: skip
BF, F32 = "c10::BFloat16", "float"

GEMM_BF16 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true>(x)"
ALIGN1 = "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1>(x)"
ALIGN8 = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(x)"
ADD_K = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
         "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")  # fmt: skip
ADD64 = ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<double>, at::detail::Array<char*, 3>, "
         "TrivialOffsetCalculator<2, unsigned int> >(int, at::native::CUDAFunctor_add<double>)")  # fmt: skip
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int)"
CAT = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(x)"  # noqa: E501
NCHW = "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(x)"
STRIDED = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
           "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int)")  # fmt: skip
CAST_UNROLLED = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
                 "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(int)")  # fmt: skip
COPY_VEC = ("void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::"
            "TensorIteratorBase&)::{lambda()#3}>(int)")  # fmt: skip
CONV = "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4"
MTA = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
       "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0> >(x)")  # fmt: skip
FUSED_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
              "FusedAdamMathFunctor<float, 4> >(x)")  # fmt: skip
EFF = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)"
FLASH = "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128> >(x)"
UNSCALE = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<_amp_foreach_non_finite_check_and_unscale_cuda_kernel>(x)"  # noqa: E501
DEPTHWISE = "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<0, float, int>(x)"
# a hand-written RMSNorm: cast up, pow, mean, add eps, rsqrt, multiply, cast down, weight
NORM = ["void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>(int)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::pow_tensor_scalar_kernel_impl<float, float>>(int)",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(x)",  # noqa: E501
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, std::array<char*, 2ul> >(int)",  # noqa: E501
        "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)>(int)",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > > >(int)",  # noqa: E501
        "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)>(int)",  # noqa: E501
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >(int)"]  # noqa: E501


class Trace:
    """cpu ops, their launches and kernels; External ids link kernels to the op that launched them."""

    def __init__(self, step_us: float = 10000.0):
        self.ev = [X("user_annotation", "ProfilerStep#1", 0, step_us, tid=1)]
        self.n = 0

    def op(self, name, ts, dur, ext, dims=None, types=None, concrete=None, tid=1):
        args = {"External id": ext}
        if dims is not None:
            args.update({"Input Dims": dims, "Input type": types})
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        self.ev.append(X("cpu_op", name, ts, dur, tid=tid, args=args))

    def ann(self, name, ts, dur, tid=1):
        self.ev.append(X("user_annotation", name, ts, dur, tid=tid))

    def kernel(self, name, ts, dur, ext, launch_ts, stream=7, grid=None, tid=1):
        self.n += 1
        corr = 100000 + self.n
        self.ev.append(X("cuda_runtime", "cudaLaunchKernel", launch_ts, 1, tid=tid,
                         args={"External id": ext, "correlation": corr}))  # fmt: skip
        args = {"External id": ext, "correlation": corr, "device": 0, "stream": stream}
        if grid is not None:
            args.update({"grid": grid, "block": [128, 1, 1]})
        self.ev.append(X("kernel", name, ts, dur, pid=0, tid=stream, args=args))

    def memcpy(self, name, ts, dur, nbytes=4096):
        self.n += 1
        self.ev.append(X("gpu_memcpy", name, ts, dur, pid=0, tid=7,
                         args={"device": 0, "stream": 7, "correlation": 900000 + self.n, "bytes": nbytes}))  # fmt: skip

    def write(self, path, props=H100):
        return write_trace(path, self.ev, deviceProperties=props)


def facts_of(path, kind=None):
    """Every fact of the trace's first rank (all analyzers: the optimizer's device work comes from the
    dispatch analyzer's optimizer steps)."""
    b = hermes_kb.load(path)
    _, fs = analyze_rank(next(iter(b)))
    assert not [f for f in fs if isinstance(f, AnalyzerError)]
    return [f for f in fs if kind is None or f.kind == kind]


def one(fs, kind, **match):
    got = [f for f in fs if f.kind == kind and all(getattr(f, k) == v for k, v in match.items())]
    assert len(got) == 1, (kind, match, got)
    return got[0]


# --- per-kernel roofline ---------------------------------------------------------------------------
def test_kernels_inherit_flops_and_bytes_from_their_call(tmp_path):
    t = Trace()
    # linear [64,128] x W[256,128] bf16, no bias: 2*64*128*256 = 4_194_304 FLOPs,
    # bytes (64*128 + 256*128 + 64*256) * 2 = 114_688; a GEMM kernel (30 µs) and a split-K reduce (10 µs)
    t.op("aten::linear", 10, 20, 1, [[64, 128], [256, 128], []], [BF, BF, ""])
    t.kernel(GEMM_BF16, 100, 30, 1, launch_ts=12)
    t.kernel(SPLITK, 130, 10, 1, launch_ts=14)
    # mm [4096,4096] x [4096,4096] bf16 on two GEMM kernels of 20 and 60 µs: the FLOPs
    # (2*4096^3 = 137_438_953_472) split 1/4 : 3/4 by duration
    t.op("aten::mm", 40, 20, 2, [[4096, 4096], [4096, 4096]], [BF, BF])
    t.kernel(ALIGN8, 200, 20, 2, launch_ts=42)
    t.kernel(GEMM_BF16, 220, 60, 2, launch_ts=44)
    # fp32 add of 1024 elements: 1024 FLOPs, (4096 * 3) = 12_288 bytes, one 4 µs kernel
    t.op("aten::add", 70, 10, 3, [[1024], [1024], []], [F32, F32, "Scalar"])
    t.kernel(ADD_K, 300, 4, 3, launch_ts=72)
    fs = facts_of(t.write(tmp_path / "t.json"))
    rows = {f.kernel_name: f for f in fs if f.kind == "kernel_roofline"}
    gemm = rows[GEMM_BF16]
    # GEMM_BF16 launches: the linear's 30 µs (all its FLOPs: the split-K helper takes none) and 3/4 of the mm
    assert gemm.launches_count == 2 and gemm.time_us == 90
    assert gemm.flops == pytest.approx(4_194_304 + 0.75 * 2 * 4096**3)
    mm_bytes = 3 * 4096 * 4096 * 2
    assert gemm.bytes == pytest.approx(114_688 + 0.75 * mm_bytes)
    assert gemm.achieved_flops_per_s == pytest.approx(gemm.flops / 90e-6)
    assert gemm.peak_dtype == "bf16" and gemm.peak_flops_per_s == 989.5e12 and gemm.operator == "aten::mm"
    a8 = rows[ALIGN8]
    assert a8.flops == pytest.approx(0.25 * 2 * 4096**3) and a8.bytes == pytest.approx(0.25 * mm_bytes)
    assert SPLITK not in rows  # no FLOPs, no bytes: left out (its time counts as not attributed)
    add = rows[ADD_K]
    assert (add.flops, add.bytes, add.dtype, add.peak_dtype) == (1024, 12_288, "fp32", "fp32")
    s = one(fs, "kernel_roofline_summary")
    # non-communication kernel time 30 + 10 + 20 + 60 + 4 = 124, attributed 114 (all but the split-K)
    assert s.kernels_time_us == 124 and s.attributed_time_us == 114
    assert s.attributed_time_ratio == pytest.approx(114 / 124)


def test_bandwidth_starved_kernels(tmp_path):
    t = Trace()
    # add of 2^20 fp32 elements: 12_582_912 bytes in 50 µs = 251.7 GB/s, 7.5% of 3350 GB/s, mean
    # duration 50 >= 10 µs: starved; the same op with a 4 µs kernel (3.1 TB/s) is not
    t.op("aten::add", 10, 10, 1, [[1048576], [1048576], []], [F32, F32, "Scalar"])
    t.kernel(ADD_K, 100, 50, 1, launch_ts=12)
    t.op("aten::mul", 30, 10, 2, [[1048576], [1048576], []], [F32, F32, "Scalar"])
    t.kernel(NORM[7], 200, 4, 2, launch_ts=32)
    s = one(facts_of(t.write(tmp_path / "t.json")), "kernel_roofline_summary")
    assert s.bandwidth_starved_time_us == 50 and s.bandwidth_starved_ratio == pytest.approx(50 / 54)
    assert s.bandwidth_starved_utilisation_ratio == pytest.approx(12_582_912 / 50e-6 / 3.35e12)


# --- grid fill ----------------------------------------------------------------------------------
def test_grid_fill(tmp_path):
    t = Trace()
    t.op("aten::relu", 10, 5, 1)
    # 33 blocks on 132 SMs, 100 µs alone: fill 0.25, idle 75 µs
    t.kernel(ADD_K, 100, 100, 1, launch_ts=11, grid=[33, 1, 1])
    # 66 blocks (fill 0.5), 100 µs, of which 40 µs overlap a full kernel on stream 8: alone 60, idle 30
    t.kernel(GEMM_BF16, 300, 100, 1, launch_ts=12, grid=[33, 2, 1])
    t.kernel(ADD_K, 360, 50, 1, launch_ts=13, stream=8, grid=[264, 1, 1])
    # short (5 µs): left out
    t.kernel(ADD_K, 500, 5, 1, launch_ts=14, grid=[1, 1, 1])
    f = one(facts_of(t.write(tmp_path / "t.json")), "kernel_grid_fill")
    assert f.sm_count == 132 and f.long_kernels_count == 3 and f.underfilled_count == 2
    assert f.underfilled_time_us == 200 and f.underfilled_alone_time_us == pytest.approx(160)
    # kernel time 100 + 100 + 50 + 5 = 255
    assert f.idle_sm_time_us == pytest.approx(105) and f.idle_sm_ratio == pytest.approx(105 / 255)
    assert f.matmul_idle_sm_time_us == pytest.approx(30) and f.other_idle_sm_time_us == pytest.approx(75)
    # fill weighted by alone time: (0.25 * 100 + 0.5 * 60) / 160
    assert f.fill_ratio == pytest.approx(55 / 160)


def test_no_grid_fill_on_amd(tmp_path):
    t = Trace()
    t.op("aten::relu", 10, 5, 1)
    t.kernel(ADD_K, 100, 100, 1, launch_ts=11, grid=[33, 1, 1])
    props = [{"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "numSms": 304, "warpSize": 64}]
    assert not facts_of(t.write(tmp_path / "t.json", props=props), "kernel_grid_fill")


# --- memory-class time by kind -----------------------------------------------------------------------
def test_copy_kinds(tmp_path):
    t = Trace()
    t.op("aten::zero_", 10, 5, 1)
    t.kernel(FILL, 100, 10, 1, launch_ts=11)
    t.op("aten::cat", 20, 5, 2, [[[4, 4], [4, 4]]], ["TensorList"])
    t.kernel(CAT, 120, 20, 2, launch_ts=21)
    t.op("aten::conv2d", 30, 5, 3)
    t.kernel(NCHW, 150, 30, 3, launch_ts=31)
    t.kernel(CONV, 180, 90, 3, launch_ts=32)
    t.op("aten::contiguous", 40, 5, 4, [[16, 16, 559, 64]], [BF])
    t.kernel(STRIDED, 300, 40, 4, launch_ts=41)
    t.op("aten::to", 50, 8, 5, [[16, 559, 1024]], [BF])
    t.kernel(CAST_UNROLLED, 350, 50, 5, launch_ts=51)
    # a vectorised copy whose aten::copy_ has dst fp32 and src bf16: a cast by its dtypes
    t.op("aten::copy_", 60, 5, 6, [[10, 10], [10, 10], []], [F32, BF, "Scalar"])
    t.kernel(COPY_VEC, 420, 6, 6, launch_ts=61)
    t.memcpy("Memcpy DtoD (Device -> Device)", 450, 3)
    t.memcpy("Memcpy HtoD (Pinned -> Device)", 460, 7)
    fs = facts_of(t.write(tmp_path / "t.json"))
    kinds = {f.copy_kind: f for f in fs if f.kind == "device_copy_kind"}
    # device time: 10 + 20 + 30 + 90 + 40 + 50 + 6 + 3 + 7 = 256; memory-class: all but the conv = 166
    assert {k: v.time_us for k, v in kinds.items()} == {
        "fill": 10, "concat": 20, "layout_transpose": 30, "strided_copy": 40, "dtype_cast": 56,
        "contiguous_copy": 3, "host_transfer": 7}
    cast = kinds["dtype_cast"]
    assert cast.count == 2 and cast.share_of_device_time_ratio == pytest.approx(56 / 256)
    assert cast.share_of_memory_time_ratio == pytest.approx(56 / 166)
    assert cast.top_operator == "aten::to" and cast.top_operator_shape == "[16,559,1024]"
    lay = kinds["layout_transpose"]
    assert lay.conv_time_us == 90 and lay.layout_to_conv_ratio == pytest.approx(30 / 120)
    assert kinds["strided_copy"].top_operator == "aten::contiguous"


def test_copy_of_equal_dtypes_is_not_a_cast(tmp_path):
    t = Trace()
    # the unrolled (dynamic-casting) path, but the launching copy_ has equal dtypes: not a cast
    t.op("aten::copy_", 10, 5, 1, [[10, 10], [10, 10], []], [F32, F32, "Scalar"])
    t.kernel(CAST_UNROLLED, 100, 10, 1, launch_ts=11)
    kinds = {f.copy_kind for f in facts_of(t.write(tmp_path / "t.json"), "device_copy_kind")}
    assert kinds == {"contiguous_copy"}


@pytest.mark.parametrize("name, kind", [
    (STRIDED, "strided_copy"), (CAST_UNROLLED, "dtype_cast"), (COPY_VEC, "contiguous_copy"), (CAT, "concat"),
    (FILL, "fill"), (NCHW, "layout_transpose"), ("batched_transpose_16x32_half", "layout_transpose"),
    (NORM[6], "dtype_cast"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda"
     "(at::TensorIteratorBase&)::{lambda()#3}> >(int)", "dtype_cast"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(x)",
     "index"),
])  # fmt: skip
def test_copy_kind_of_name(name, kind):
    assert copy_kind_of_name(name) == kind


# --- GEMM alignment ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, narrow", [
    (ALIGN1, True), (ALIGN8, False),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(x)", True),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x5_nt_align4>(x)", False),  # TF32: 4 is full
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_64x4_nn_align4>(x)", True),
    (GEMM_BF16, False),
])  # fmt: skip
def test_narrow_alignment(name, narrow):
    assert narrow_alignment(name) is narrow


def test_gemm_alignment(tmp_path):
    t = Trace()
    # attention scores [16,5185,64] x [16,64,5185] bf16: N = 5185 is not a multiple of 8, on an align1 kernel
    # FLOPs 2*16*5185*64*5185 = 55_062_732_800 in 1000 µs -> 5.506e13 FLOP/s = 5.56% of 989.5e12
    t.op("aten::bmm", 10, 10, 1, [[16, 5185, 64], [16, 64, 5185]], [BF, BF])
    t.kernel(ALIGN1, 100, 1000, 1, launch_ts=11)
    # an aligned mm 2*4096^3 in 250 µs -> 5.4976e14 FLOP/s = 55.6% of the peak
    t.op("aten::mm", 30, 10, 2, [[4096, 4096], [4096, 4096]], [BF, BF])
    t.kernel(GEMM_BF16, 1200, 250, 2, launch_ts=31)
    g = one(facts_of(t.write(tmp_path / "t.json")), "gemm_alignment")
    assert g.gemm_time_us == 1250 and g.misaligned_time_us == 1000 and g.misaligned_count == 1
    assert g.misaligned_by_name_us == 1000 and g.misaligned_by_shape_us == 1000
    assert g.share_of_device_time_ratio == pytest.approx(1000 / 1250)
    assert g.misaligned_utilisation_ratio == pytest.approx(2 * 16 * 5185 * 64 * 5185 / 1000e-6 / 989.5e12)
    assert g.aligned_utilisation_ratio == pytest.approx(2 * 4096**3 / 250e-6 / 989.5e12)
    assert g.misaligned_slower is True
    assert (g.example_operator, g.example_shape) == ("aten::bmm", "[16,5185,64]x[16,64,5185]")
    assert g.example_dims == "N=5185 (not a multiple of 8 in bf16)"


# --- optimizer ---------------------------------------------------------------------------------------
def _optimizer_trace(tmp_path, kernel_name):
    t = Trace()
    t.op("aten::mm", 10, 10, 1, [[64, 64], [64, 64]], [F32, F32])
    t.kernel(GEMM_BF16, 100, 300, 1, launch_ts=11)
    t.ann("Optimizer.step#AdamW.step", 50, 100)
    for i in range(4):  # 4 multi-tensor kernels of 25 µs launched inside the step
        t.op("aten::_foreach_add_", 60 + 10 * i, 5, 10 + i)
        t.kernel(kernel_name, 500 + 30 * i, 25, 10 + i, launch_ts=61 + 10 * i)
    return facts_of(t.write(tmp_path / "t.json"), "optimizer_device")


def test_optimizer_device_foreach(tmp_path):
    o = one(_optimizer_trace(tmp_path, MTA), "optimizer_device")
    # 4 kernels, 100 µs, of 400 µs of non-communication device time
    assert (o.optimizer, o.implementation, o.calls_count, o.kernels_count) == ("AdamW", "foreach", 1, 4)
    assert o.device_us == 100 and o.share_of_device_time_ratio == pytest.approx(0.25)
    assert o.kernels_per_call == 4 and o.mean_kernel_us == 25


def test_optimizer_device_fused(tmp_path):
    assert one(_optimizer_trace(tmp_path, FUSED_ADAM), "optimizer_device").implementation == "fused"


@pytest.mark.parametrize("name, kind", [
    (MTA, "foreach"), (FUSED_ADAM, "fused"), (ADD_K, "per_tensor"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, adamMode_t, float>(int)",
     "fused"),  # apex FusedAdam
    ("void at::native::vectorized_elementwise_kernel<4, at::native::addcmul_cuda_kernel(at::TensorIteratorBase&, "
     "c10::Scalar const&)::{lambda()#2}::operator()() const::{lambda(float, float, float)#1}>(int)", "per_tensor"),
])  # fmt: skip
def test_optimizer_kernel_kind(name, kind):
    assert optimizer_kernel_kind(name) == kind


# --- recomputation ------------------------------------------------------------------------------------
def test_activation_recompute(tmp_path):
    t = Trace()
    # forward: a linear launching a 40 µs GEMM
    t.op("aten::linear", 10, 10, 1)
    t.kernel(GEMM_BF16, 100, 40, 1, launch_ts=11)
    # backward node: the same layer recomputed (30 µs GEMM) and its gradient (50 µs, not recompute)
    t.op("autograd::engine::evaluate_function: AddmmBackward0", 30, 40, 2)
    t.op("aten::linear", 32, 8, 3)
    t.kernel(GEMM_BF16, 200, 30, 3, launch_ts=33)
    t.op("aten::mm", 45, 10, 4)
    t.kernel(GEMM_BF16, 300, 50, 4, launch_ts=46)
    r = one(facts_of(t.write(tmp_path / "t.json")), "activation_recompute")
    assert r.recompute_calls_count == 1 and r.recompute_device_us == 30 and r.forward_device_us == 40
    assert r.recompute_to_forward_ratio == pytest.approx(0.75)
    assert r.share_of_device_time_ratio == pytest.approx(30 / 120) and r.checkpoint_frames_count == 0


def test_scripted_backward_graph_is_not_a_recompute(tmp_path):
    t = Trace()
    t.op("autograd::engine::evaluate_function: DifferentiableGraphBackward", 30, 40, 2)
    t.op("<backward op>", 31, 30, 5)
    t.op("aten::linear", 32, 8, 3)
    t.kernel(GEMM_BF16, 200, 30, 3, launch_ts=33)
    assert not facts_of(t.write(tmp_path / "t.json"), "activation_recompute")


# --- written-out normalisations -----------------------------------------------------------------------
def test_decomposed_norms(tmp_path):
    t = Trace()
    ts = 100
    for rep in range(3):
        for j, name in enumerate(NORM):  # 8 kernels of 10 µs
            ext = 10 * rep + j + 1
            t.op("aten::mul", ts - 90, 2, ext)
            t.kernel(name, ts, 10, ext, launch_ts=ts - 89)
            ts += 12
        ts += 5
    t.op("aten::add", 600, 2, 99)
    t.kernel(ADD_K, 700, 10, 99, launch_ts=601)  # unrelated
    d = one(facts_of(t.write(tmp_path / "t.json")), "decomposed_norm")
    # 3 occurrences of 8 kernels: 240 µs of 250 µs device time
    assert (d.occurrences_count, d.kernels_count, d.kernels_per_occurrence) == (3, 24, 8.0)
    assert d.time_us == 240 and d.share_of_device_time_ratio == pytest.approx(240 / 250)
    assert d.example[2] == "reduce_kernel:Mean" and len(d.example) == 8


# --- FP64, embedding, loss, attention, GradScaler, conv fallback --------------------------------------
def test_fp64_kernels(tmp_path):
    t = Trace()
    t.op("aten::add_", 10, 5, 1)
    t.kernel(ADD64, 100, 30, 1, launch_ts=11)
    t.op("aten::add", 20, 5, 2)
    t.kernel(ADD_K, 200, 70, 2, launch_ts=21)
    f = one(facts_of(t.write(tmp_path / "t.json")), "fp64_device_work")
    # H100: FP64 vector 34 TFLOP/s over FP32 67
    assert f.kernels_count == 1 and f.time_us == 30 and f.share_of_device_time_ratio == pytest.approx(0.3)
    assert f.fp64_to_fp32_peak_ratio == pytest.approx(34 / 67) and f.top_operator == "aten::add_"
    assert not is_fp64_kernel(ADD_K)
    assert not is_fp64_kernel("void at::native::vectorized_elementwise_kernel<4, X<float> >(int, double)")


def test_embedding_dense_backward(tmp_path):
    t = Trace()
    t.op("aten::mm", 5, 3, 9)
    t.kernel(GEMM_BF16, 50, 60, 9, launch_ts=6)
    t.op("autograd::engine::evaluate_function: EmbeddingBackward0", 10, 30, 1)
    t.op("aten::embedding_backward", 11, 25, 2)
    t.op("aten::embedding_dense_backward", 12, 20, 3, [[8, 512, 768], [8, 512], [], [], []],
         [F32, "long int", "Scalar", "Scalar", "Scalar"], ["", "", "50257", "-1", "False"])  # fmt: skip
    t.kernel(ADD_K, 200, 40, 3, launch_ts=13)
    e = one(facts_of(t.write(tmp_path / "t.json")), "embedding_backward")
    assert e.dense_calls_count == 1 and e.dense_device_us == 40 and e.weight_rows == 50257
    assert e.share_of_device_time_ratio == pytest.approx(0.4) and e.sparse_calls_count == 0


def test_large_vocab_loss(tmp_path):
    t = Trace()
    t.op("aten::mm", 5, 3, 9)
    t.kernel(GEMM_BF16, 50, 100, 9, launch_ts=6)
    t.op("aten::cross_entropy_loss", 10, 30, 1)
    t.op("aten::log_softmax", 11, 10, 2, [[4096, 50304], [], []], [F32, "Scalar", ""])
    t.op("aten::_log_softmax", 12, 8, 3, [[4096, 50304], [], []], [F32, "Scalar", "Scalar"])
    t.kernel(ADD_K, 200, 30, 3, launch_ts=13)
    t.op("aten::nll_loss_nd", 25, 10, 4)
    t.kernel(ADD_K, 240, 20, 4, launch_ts=26)
    v = one(facts_of(t.write(tmp_path / "t.json")), "large_vocab_loss")
    # two log_softmax calls (the composite and the inner one) over [4096, 50304] fp32: 4096*50304*4 bytes
    assert (v.vocab_size, v.rows, v.dtype, v.calls_count) == (50304, 4096, "fp32", 2)
    assert v.logits_bytes == 4096 * 50304 * 4 and v.device_us == 50
    assert v.share_of_device_time_ratio == pytest.approx(50 / 150)


def test_attention_backends(tmp_path):
    t = Trace()
    t.op("aten::scaled_dot_product_attention", 10, 10, 1)
    t.kernel(EFF, 100, 75, 1, launch_ts=11)
    t.op("aten::scaled_dot_product_attention", 30, 10, 2)
    t.kernel(FLASH, 200, 25, 2, launch_ts=31)
    t.op("aten::mm", 50, 5, 3)
    t.kernel(GEMM_BF16, 300, 100, 3, launch_ts=51)
    a = one(facts_of(t.write(tmp_path / "t.json")), "attention_backends")
    assert (a.attention_time_us, a.efficient_us, a.flash_us) == (100, 75, 25)
    assert a.efficient_share_ratio == 0.75 and a.share_of_device_time_ratio == pytest.approx(0.5)
    assert a.sdpa_dtype == "bf16" and a.compute_capability == 9.0  # dtype from the fmha kernel's name


def test_grad_scaler_kernels(tmp_path):
    t = Trace()
    t.op("aten::mm", 5, 3, 9)
    t.kernel(GEMM_BF16, 50, 90, 9, launch_ts=6)
    t.op("aten::_amp_foreach_non_finite_check_and_unscale_", 10, 5, 1)
    t.kernel(UNSCALE, 200, 10, 1, launch_ts=11)
    g = one(facts_of(t.write(tmp_path / "t.json")), "grad_scaler_kernels")
    assert (g.kernels_count, g.time_us, g.bf16_matmul_ratio, g.fp16_matmul_ratio) == (1, 10, 1.0, 0.0)
    assert g.share_of_device_time_ratio == pytest.approx(0.1)


def test_conv_fallback(tmp_path):
    t = Trace()
    t.op("aten::_conv_depthwise2d", 10, 5, 1)
    t.kernel(DEPTHWISE, 100, 60, 1, launch_ts=11)
    t.op("aten::conv2d", 20, 5, 2)
    t.kernel(CONV, 200, 40, 2, launch_ts=21)
    f = one(facts_of(t.write(tmp_path / "t.json")), "conv_fallback")
    assert (f.depthwise_us, f.im2col_us, f.library_conv_us) == (60, 0, 40)
    assert f.share_of_conv_time_ratio == pytest.approx(0.6) and f.share_of_device_time_ratio == pytest.approx(0.6)


# --- real traces ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name)
def test_runs_on_every_real_trace(path):
    b = hermes_kb.load(path)
    for trace in b:
        ctx, _ = step_context(trace)
        _guarded("compute", trace.rank, lambda: C.per_rank(ctx))
        fs = _guarded("kernels", trace.rank, lambda: K.per_rank(ctx))
        assert not [f for f in fs if isinstance(f, AnalyzerError)], fs
        assert len(fs) <= 32
        assert len([f for f in fs if f.kind == "kernel_roofline"]) <= TOP_KERNELS
        assert sum(f.share_of_device_time_ratio for f in fs if f.kind == "device_copy_kind") <= 1.0 + 1e-9


def _raw_kernels(path):
    """The kernels of the raw trace that start inside its (single) ProfilerStep window."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    step = min(float(e["ts"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    return [e for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X" and float(e["ts"]) >= step]


def test_real_h100_qwen_copies_and_norms(shared):
    """HF Qwen1.5-0.5B on an H100 (one profiled step, every kernel inside it): the numbers below are
    recomputed from the raw JSON by kernel name."""
    path = shared / "tracelens" / "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    raw = _raw_kernels(path)

    def total(pred):
        sel = [e["dur"] for e in raw if pred(e["name"])]
        return sum(sel), len(sel)

    fs = facts_of(path)
    kinds = {f.copy_kind: f for f in fs if f.kind == "device_copy_kind"}
    # strided copies: the legacy-path same-dtype copy kernels
    t, n = total(lambda s: s.startswith("void at::native::elementwise_kernel<") and "gpu_kernel_impl_nocast<at::native::direct_copy" in s)  # noqa: E501
    assert kinds["strided_copy"].time_us == pytest.approx(t) and kinds["strided_copy"].count == n
    assert kinds["strided_copy"].top_operator == "aten::contiguous"
    # casts: the dynamic-casting copies and the bfloat16 copy kernels (the launching copy_ ops agree)
    t, n = total(lambda s: ("unrolled_elementwise_kernel<at::native::direct_copy" in s) or "bfloat16_copy_kernel_cuda" in s)  # noqa: E501
    assert kinds["dtype_cast"].time_us == pytest.approx(t) and kinds["dtype_cast"].count == n
    t, n = total(lambda s: "CatArrayBatchedCopy" in s)
    assert kinds["concat"].time_us == pytest.approx(t) and kinds["concat"].count == n
    # one written-out RMSNorm per rsqrt kernel, 8 kernels each
    _, n_rsqrt = total(lambda s: "rsqrt_kernel_cuda" in s)
    d = one(fs, "decomposed_norm")
    assert d.occurrences_count == n_rsqrt == 70 and d.kernels_count == 8 * 70
    # the sm90 GEMM tiles: 30x4 = 120 blocks on 132 SMs at most
    g = one(fs, "kernel_grid_fill")
    assert g.sm_count == 132 and g.median_blocks == 120 and g.idle_sm_ratio < 0.05


def test_real_h100_owlv2_misaligned_gemms(shared):
    """OWLv2 on an H100: the attention products over 5185 tokens run on CUTLASS sm75 align1 kernels."""
    path = shared / "tracelens" / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
    raw = _raw_kernels(path)
    fs = facts_of(path)
    g = one(fs, "gemm_alignment")
    align = [e for e in raw if ("_align1" in e["name"] or "_align2" in e["name"]) and "bf16" in e["name"]]
    assert g.misaligned_by_name_us == pytest.approx(sum(e["dur"] for e in align))
    assert g.example_dims == "N=5185 (not a multiple of 8 in bf16)" and g.misaligned_slower is True
    assert g.misaligned_utilisation_ratio < 0.1 < 0.5 < g.aligned_utilisation_ratio


# --- Ascend: MatMul inner axes ---------------------------------------------------------------------
@pytest.mark.parametrize("shapes, aligned", [
    ("4096,1024;4096,1024", True),            # ND: last axes 1024 and 1024
    ('"32,1000;1000,4096"', False),           # 1000 is not a multiple of 256 (quotes as in the db export)
    ("8,16,16,16;8,16,16,16", True),          # NZ: axes 1 x 2 = 256
    ("8,4,16,16;8,16,16,16", False),          # NZ: 4 x 16 = 64
    ("4096", None), ("", None),
])  # fmt: skip
def test_cube_inner_axes(shapes, aligned):
    assert cube_inner_axes_aligned(shapes) is aligned


def test_cube_group_memory():
    # msprof-analyze's memory_size: (32*9216 + 4096*9216 + 2*4096 (bias counted twice) + 32*4096) * 2 bytes in MB
    assert npu_tasks._group_mb("32,9216;4096,9216;4096", "32,4096") == pytest.approx(
        (32 * 9216 + 4096 * 9216 + 2 * 4096 + 32 * 4096) * 2 / 1024 / 1024)


def test_real_ascend_qwen3_cube_alignment(shared):
    """Qwen3-0.6B PP=2 rank 0: the MatMul groups recomputed from kernel_details.csv with the
    standard library (msprof-analyze's filter: AI_CORE MatMul tasks grouped by name and shapes, >= 100 MB)."""
    import csv

    run = shared / "ascend" / "msinsight_st_level2_4rank_qwen3_0.6b_pp2"
    rows = list(csv.DictReader(open(run / "rank_0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")))
    groups: dict = {}
    for r in rows:
        if "matmul" in r["Type"].lower() and r["Accelerator Core"] == "AI_CORE":
            key = (r["Name"], r["Input Shapes"], r["Output Shapes"])
            mb, t = groups.get(key, (0.0, 0.0))
            groups[key] = (mb + npu_tasks._group_mb(r["Input Shapes"], r["Output Shapes"]), t + float(r["Duration(us)"]))
    big = [k for k, (mb, _) in groups.items() if mb >= 100]
    b = hermes_kb.load(run)
    _, fs = analyze_rank(b[0])
    a = one(fs, "npu_cube_alignment")
    assert a.checked_groups_count == len(big) == 11 and a.misaligned_groups_count == 0
    assert a.cube_time_us == pytest.approx(sum(t for _, t in groups.values()))


@pytest.mark.parametrize("name, ins, outs, dims", [
    # Qwen3-0.6B (SBH): q [4096,1,2048], softmax statistics [1,16,4096,8] -> 16 heads of 128, sequence 4096
    ("aclnnFlashAttentionScore", "4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048", "1,16,4096,8;1,16,4096,8;;4096,1,2048",
     (128, 4096)),
    ("FlashAttentionScore", "2,32,1000,80;2,32,1000,80;2,32,1000,80", "2,32,1000,8;2,32,1000,8;;2,32,1000,80", (80, 1000)),
    ("FlashAttentionVarLenScore", "8000,16,96;8000,16,96;8000,16,96", "8000,16,8", (96, None)),
])  # fmt: skip
def test_fa_dims(name, ins, outs, dims):
    assert fa_dims(name, ins, outs) == dims


def test_sdpa_math_fallback(tmp_path):
    t = Trace()
    # SDPA -> its math path -> a bmm (40 µs) and a softmax (20 µs); a flash call elsewhere (30 µs)
    t.op("aten::scaled_dot_product_attention", 10, 40, 1)
    t.op("aten::_scaled_dot_product_attention_math", 11, 38, 2, [[8, 16, 1024, 320], [8, 16, 1024, 320],
         [8, 16, 1024, 320]], [BF, BF, BF])  # fmt: skip
    t.op("aten::bmm", 12, 10, 3)
    t.kernel(GEMM_BF16, 100, 40, 3, launch_ts=13)
    t.op("aten::_softmax", 25, 10, 4)
    t.kernel("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false>(x)", 140, 20, 4,
             launch_ts=26)  # fmt: skip
    t.op("aten::scaled_dot_product_attention", 60, 10, 5)
    t.kernel(FLASH, 200, 30, 5, launch_ts=61)
    m = one(facts_of(t.write(tmp_path / "t.json")), "sdpa_math_fallback")
    # device time 40 + 20 + 30 = 90: the math path's 60
    assert (m.calls_count, m.device_us, m.dtype, m.head_dim) == (1, 60, "bf16", 320)
    assert m.share_of_device_time_ratio == pytest.approx(60 / 90) and m.fused_attention_us == 30
    assert m.shape == "[8,16,1024,320]x[8,16,1024,320]x[8,16,1024,320]"
