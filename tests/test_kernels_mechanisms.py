"""Per-kernel mechanisms added for issue 20 (analyzers/compute/kernels.py): wave quantisation, element-wise
kernels on ATen's generic strided path, training-mode layers in a forward-only run, FP32 Cube
operators on Ascend, and element-wise epilogues left behind GEMMs. Every expected number is
worked out by hand in the comment next to its assertion."""

from __future__ import annotations

from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analysis.rank import analyze_rank
from hermes_kb.analyzers.compute.fusion import epilogue_kind
from hermes_kb.analyzers.compute.layers import is_sort_kernel
from hermes_kb.analyzers.compute.npu_tasks import first_input_dims, npu_all_fp32
from hermes_kb.analyzers.compute.occupancy import resident_blocks
from conftest import X, write_trace
from hermes_kb.facts.steps import AnalyzerError

# H100 with the per-SM limits the CUDA occupancy calculator needs
H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936, "computeMajor": 9,
         "computeMinor": 0, "numSms": 132, "warpSize": 32, "maxThreadsPerMultiprocessor": 2048,
         "regsPerMultiprocessor": 65536, "sharedMemPerMultiprocessor": 233472}]  # fmt: skip
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"  # noqa: E501
ADD_VEC = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")  # fmt: skip  # noqa: E501
MUL_GENERIC = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
               "BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > > >(int)")  # fmt: skip  # noqa: E501
STRIDED_COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
                "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int)")  # fmt: skip
DROPOUT = "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>(x)"  # noqa: E501
BN_TRAIN = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(x)"


class T:
    def __init__(self, step_us=10000.0):
        self.ev = [X("user_annotation", "ProfilerStep#1", 0, step_us, tid=1)]
        self.n = 0

    def op(self, name, ts, dur, ext, tid=1):
        self.ev.append(X("cpu_op", name, ts, dur, tid=tid, args={"External id": ext}))

    def kernel(self, name, ts, dur, ext, launch_ts, grid=(1, 1, 1), block=(128, 1, 1), regs=32, smem=0, stream=7):  # noqa: E501
        self.n += 1
        corr = 100000 + self.n
        self.ev.append(X("cuda_runtime", "cudaLaunchKernel", launch_ts, 1, tid=1,
                         args={"External id": ext, "correlation": corr}))  # fmt: skip
        self.ev.append(X("kernel", name, ts, dur, pid=0, tid=stream, args={
            "External id": ext, "correlation": corr, "device": 0, "stream": stream, "grid": list(grid),
            "block": list(block), "registers per thread": regs, "shared memory": smem}))  # fmt: skip

    def facts(self, tmp_path: Path, kind: str):
        b = hermes_kb.load(write_trace(tmp_path / "t.json", self.ev, deviceProperties=H100))
        _, fs = analyze_rank(next(iter(b)))
        assert not [f for f in fs if isinstance(f, AnalyzerError)]
        return [f for f in fs if f.kind == kind]


# --- occupancy and waves ------------------------------------------------------------------------------
def test_resident_blocks_by_hand():
    # RTX 2080 Ti (cc 7.5), volta_sgemm_64x64: 64 threads = 2 warps; 126 registers -> 126*32 = 4032,
    # rounded up to 4096 per warp -> 65536 / 4096 = 16 warps = 8 blocks; shared 65536 // 8704 = 7 (no
    # per-block reservation before sm80); threads 1024 / 64 = 16; cc 7.5 holds at most 16 -> 7
    turing = {"maxThreadsPerMultiprocessor": 1024, "regsPerMultiprocessor": 65536,
              "sharedMemPerMultiprocessor": 65536, "computeMajor": 7, "computeMinor": 5}  # fmt: skip
    assert resident_blocks(64, 126, 8704, turing) == 7
    # H100: 256 threads = 8 warps, 32 registers -> 1024 per warp -> 64 warps = 8 blocks; threads 2048 / 256
    # = 8; shared 233472 // (50000 + 1024) = 4 -> 4
    assert resident_blocks(256, 32, 50000, H100[0]) == 4
    assert resident_blocks(128, 32, 0, {"computeMajor": 9}) == 0  # limits unknown


def test_wave_tail(tmp_path):
    t = T()
    t.op("aten::mm", 10, 5, 1)
    # A: GEMM, 128 threads (4 warps), 128 registers -> 4096 per warp -> 16 warps = 4 blocks per SM;
    # wave = 132 * 4 = 528 blocks; 600 blocks -> w = 600/528 = 1.13636, 2 waves, the second holds
    # 72 of 528: tail idle = 100 * (2 - 1.13636) / 2 = 43.1818 µs
    t.kernel(GEMM, 100, 100, 1, launch_ts=11, grid=(600, 1, 1), block=(128, 1, 1), regs=128)
    # B: 256 threads, 32 registers, 50000 B shared -> 4 blocks per SM (shared memory), wave 528;
    # 1056 blocks = exactly 2 waves: multi-wave, no tail
    t.op("aten::add", 20, 5, 2)
    t.kernel(ADD_VEC, 300, 80, 2, launch_ts=21, grid=(1056, 1, 1), block=(256, 1, 1), regs=32, smem=50000)
    # C: 100 blocks, under one wave: judged, not multi-wave; D: 5 µs, left out
    t.kernel(ADD_VEC, 500, 50, 2, launch_ts=22, grid=(100, 1, 1))
    t.kernel(ADD_VEC, 600, 5, 2, launch_ts=23, grid=(5000, 1, 1))
    (f,) = t.facts(tmp_path, "kernel_waves")
    tail = 100 * (2 - 600 / 528) / 2
    assert (f.sm_count, f.judged_count, f.multi_wave_count, f.multi_wave_time_us) == (132, 3, 2, 180)
    assert f.kernels_time_us == 235  # 100 + 80 + 50 + 5
    assert f.tail_idle_time_us == pytest.approx(tail) and f.tail_idle_ratio == pytest.approx(tail / 235)
    assert f.matmul_tail_idle_time_us == pytest.approx(tail)
    # time-weighted median of w over (1.136 for 100 µs, 2.0 for 80 µs): the first reaches half of 180
    assert f.median_waves == pytest.approx(600 / 528)
    assert f.top_kernel_waves == pytest.approx(600 / 528)


def test_no_waves_without_occupancy_limits(tmp_path):
    t = T()
    t.op("aten::mm", 10, 5, 1)
    t.kernel(GEMM, 100, 100, 1, launch_ts=11, grid=(600, 1, 1), regs=128)
    b = hermes_kb.load(write_trace(tmp_path / "t.json", t.ev, deviceProperties=[
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
         "warpSize": 32}]))  # fmt: skip
    _, fs = analyze_rank(next(iter(b)))
    assert not [f for f in fs if f.kind == "kernel_waves"]


# --- element-wise kernels on the generic strided path -----------------------------------------------------
def test_strided_elementwise(tmp_path):
    t = T()
    t.op("aten::mul", 10, 5, 1)
    t.kernel(MUL_GENERIC, 100, 30, 1, launch_ts=11)  # generic path: 30 µs
    t.op("aten::add", 20, 5, 2)
    t.kernel(ADD_VEC, 200, 10, 2, launch_ts=21)  # vectorised: 10 µs
    t.op("aten::contiguous", 30, 5, 3)
    t.kernel(STRIDED_COPY, 300, 20, 3, launch_ts=31)  # a copy: memory class, not element-wise
    (f,) = t.facts(tmp_path, "strided_elementwise")
    # element-wise 30 + 10 = 40, generic 30 (share 0.75); device time 30 + 10 + 20 = 60 -> 0.5
    assert (f.elementwise_time_us, f.generic_time_us, f.generic_count, f.vectorized_time_us) == (40, 30, 1, 10)  # noqa: E501
    assert f.generic_share_ratio == pytest.approx(0.75) and f.share_of_device_time_ratio == pytest.approx(0.5)
    assert f.top_operator == "aten::mul"


# --- training-mode layers in a forward-only run ----------------------------------------------------------
def _forward(t: T) -> None:
    t.op("aten::dropout", 10, 10, 1)
    t.op("aten::native_dropout", 11, 8, 1)
    t.kernel(DROPOUT, 100, 20, 1, launch_ts=12)
    t.op("aten::cudnn_batch_norm", 30, 5, 2)
    t.kernel(BN_TRAIN, 200, 30, 2, launch_ts=31)
    t.op("aten::mm", 40, 5, 3)
    t.kernel(GEMM, 300, 50, 3, launch_ts=41)


def test_train_mode_in_forward_only_run(tmp_path):
    t = T()
    _forward(t)
    (f,) = t.facts(tmp_path, "train_mode_inference")
    # dropout 20 + batch statistics 30 = 50 µs of 100 µs device time; one call of each
    assert (f.backward_nodes_count, f.dropout_calls_count, f.batchnorm_train_calls_count) == (0, 1, 1)
    assert (f.train_mode_kernels_count, f.train_mode_time_us) == (2, 50)
    assert f.share_of_device_time_ratio == pytest.approx(0.5) and f.top_kernel and f.measured_on == "kernels"


@pytest.mark.parametrize("backward", [
    "autograd::engine::evaluate_function: MmBackward0",
    "CudnnBatchNormBackward",  # 2021 traces: function nodes without the engine wrapper
    "aten::cudnn_batch_norm_backward",
])  # fmt: skip
def test_no_train_mode_fact_in_a_training_step(tmp_path, backward):
    t = T()
    _forward(t)
    t.op(backward, 60, 5, 4, tid=2)
    assert not t.facts(tmp_path, "train_mode_inference")


# --- the what-if set of written-out normalisations -----------------------------------------------------
# --- Ascend: Cube operators fed FP32 ---------------------------------------------------------------------
@pytest.mark.parametrize("dtypes,fp32", [
    ("FLOAT;FLOAT;FLOAT", True), ("FLOAT;INT32;FLOAT", True), ("DT_BF16;DT_BF16", False),
    ("FLOAT16;FLOAT", False), ("INT32;INT64", False), ('"FLOAT;FLOAT"', True),
])  # fmt: skip
def test_npu_all_fp32(dtypes, fp32):
    assert npu_all_fp32(dtypes) is fp32


def test_npu_fp32_cube(tmp_path):
    header = ("Step Id,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),HF32 Eligible,"
              "Input Data Types")  # fmt: skip
    rows = [
        "1,2,MatMul1,MatMulV2,AI_CORE,1000,100,NO,FLOAT;FLOAT",  # FP32 MatMul: 100
        "1,2,Conv2D1,Conv2D,AI_CORE,1100,60,YES,FLOAT;FLOAT;FLOAT",  # FP32 conv, HF32 eligible: 60
        "1,2,MatMul2,MatMulV3,AI_CORE,1200,40,NO,DT_BF16;DT_BF16",  # BF16 MatMul: 40
        "1,2,Add1,Add,AI_VECTOR_CORE,1300,50,NO,FLOAT;FLOAT",  # vector op: not Cube
        "1,2,hcom_allReduce_1,hcom_allReduce_,HCCL,1400,500,N/A,N/A",  # communication
    ]
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "kernel_details.csv").write_text("\n".join([header] + rows) + "\n")
    b = hermes_kb.load(tmp_path / "rank0_ascend_pt")
    _, fs = analyze_rank(next(iter(b)))
    (f,) = [x for x in fs if x.kind == "npu_fp32_cube"]
    # compute 100 + 60 + 40 + 50 = 250; Cube 200; FP32 Cube 160 (MatMul 100, conv 60, HF32-eligible 60)
    assert (f.device_compute_us, f.cube_us, f.fp32_cube_count, f.fp32_cube_us) == (250, 200, 2, 160)
    assert f.fp32_cube_ratio == pytest.approx(0.8) and f.fp32_share_of_compute_ratio == pytest.approx(160 / 250)  # noqa: E501
    assert (f.matmul_fp32_us, f.conv_fp32_us, f.hf32_eligible_us, f.not_hf32_eligible_us) == (100, 60, 60, 100)
    assert f.op_types == ["MatMulV2", "Conv2D"]


# --- element-wise epilogues after GEMMs ---------------------------------------------------------------
SILU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel("
        "at::TensorIteratorBase&)::{lambda()#1}::operator()() const>(int)")  # fmt: skip
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true>(x)"  # noqa: E501


@pytest.mark.parametrize("name,kind", [
    (ADD_VEC, "add"), (SILU, "activation"), (MUL_GENERIC, ""),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(x)>(int)", "activation"),  # noqa: E501
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(x)>(int)",  # noqa: E501
     "activation"),
])  # fmt: skip
def test_epilogue_kind(name, kind):
    assert epilogue_kind(name) == kind


def test_gemm_epilogue(tmp_path):
    t = T()
    for i in range(4):
        t.op("aten::linear", 10 + 10 * i, 5, i + 1)
    t.kernel(GEMM, 100, 100, 1, launch_ts=11)
    t.kernel(ADD_VEC, 200, 10, 1, launch_ts=12)  # add right after a GEMM: 10
    t.kernel(GEMM, 300, 100, 2, launch_ts=21)
    t.kernel(SILU, 400, 20, 2, launch_ts=22)  # activation right after a GEMM: 20
    t.kernel(GEMM, 500, 100, 3, launch_ts=31)
    t.kernel(MUL_GENERIC, 600, 5, 3, launch_ts=32)  # a multiply: not an epilogue
    t.kernel(ADD_VEC, 700, 7, 4, launch_ts=41)  # an add after a multiply: not after a GEMM
    t.kernel(SPLITK, 710, 3, 4, launch_ts=42)  # a GEMM helper: not a GEMM
    t.kernel(ADD_VEC, 720, 4, 4, launch_ts=43)  # an add after the helper: not counted
    t.kernel(GEMM, 800, 50, 4, launch_ts=44)
    t.kernel(ADD_VEC, 900, 6, 4, launch_ts=45, stream=8)  # after a GEMM, but on another stream
    (f,) = t.facts(tmp_path, "gemm_epilogue")
    # GEMMs 100 + 100 + 100 + 50 = 350; epilogues 10 (add) + 20 (activation)
    assert (f.gemm_count, f.gemm_time_us, f.epilogue_count, f.epilogue_time_us) == (4, 350, 2, 30)
    assert (f.add_time_us, f.activation_time_us) == (10, 20)
    # device time 350 + 10 + 20 + 5 + 7 + 3 + 4 + 6 = 405
    assert f.share_of_device_time_ratio == pytest.approx(30 / 405)
    assert f.epilogue_to_gemm_ratio == pytest.approx(30 / 350)


# --- Ascend: vector operators over full logits -------------------------------------------------------------
@pytest.mark.parametrize("shapes,dims", [
    ('"4096,1,151936;4096,1,1"', [4096, 1, 151936]), ("151936,1024;151936,1024", [151936, 1024]),
    ('""', None), ("N/A", None),
])  # fmt: skip
def test_first_input_dims(shapes, dims):
    assert first_input_dims(shapes) == dims


def test_npu_vocab_vector_ops(tmp_path):
    header = "Step Id,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),Input Shapes,Input Data Types"  # noqa: E501
    rows = [
        '1,2,Cast1,Cast,AI_VECTOR_CORE,1000,40,"4096,1,151936",DT_BF16',  # logits cast up: 40
        '1,2,Sub1,Sub,AI_VECTOR_CORE,1040,30,"4096,1,151936;4096,1,1",FLOAT;FLOAT',  # FP32: 30
        '1,2,Exp1,Exp,AI_VECTOR_CORE,1070,30,"4096,1,151936",FLOAT',  # FP32: 30
        '1,2,Add1,Add,AI_VECTOR_CORE,1100,50,"151936,1024;151936,1024",FLOAT;DT_BF16',  # last axis 1024: no
        '1,2,MatMul1,MatMulV3,AI_CORE,1150,100,"4096,1024;151936,1024",DT_BF16;DT_BF16',  # Cube: no
        '1,2,Sum1,ReduceSum,MIX_AIV,1250,10,"2048,65536;1",FLOAT;INT64',  # MIX_AIV, 65536 >= 32768: 10 (FP32)
    ]
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "kernel_details.csv").write_text("\n".join([header] + rows) + "\n")
    b = hermes_kb.load(tmp_path / "rank0_ascend_pt")
    _, fs = analyze_rank(next(iter(b)))
    (f,) = [x for x in fs if x.kind == "npu_vocab_vector_ops"]
    # logits tasks 40 + 30 + 30 + 10 = 110 of 260 µs compute; FP32 ones 30 + 30 + 10 = 70
    assert (f.tasks_count, f.time_us, f.fp32_time_us, f.device_compute_us) == (4, 110, 70, 260)
    assert f.share_of_compute_ratio == pytest.approx(110 / 260)
    # the largest input: 4096 x 151936 (622 M elements) against 2048 x 65536
    assert (f.vocab_size, f.rows, f.logits_fp32_bytes) == (151936, 4096, 4096 * 151936 * 4.0)
    assert f.op_types[0] == "Cast" and set(f.op_types) == {"Cast", "Sub", "Exp", "ReduceSum"}


# --- sorting and top-k ------------------------------------------------------------------------------------
ONESWEEP = ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, long, int>::Policy800, false, "  # noqa: E501
            "long, long, int, int, cub::detail::identity_decomposer_t>(x)")  # fmt: skip
HIST = "void cub::DeviceRadixSortHistogramKernel<cub::DeviceRadixSortPolicy<long, long, int>::Policy800, false, long>(x)"  # noqa: E501


@pytest.mark.parametrize("name,sort", [
    (ONESWEEP, True), (HIST, True), ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>(x)", True),  # noqa: E501
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(x)", True), (ADD_VEC, False), (GEMM, False),  # noqa: E501
])  # fmt: skip
def test_is_sort_kernel(name, sort):
    assert is_sort_kernel(name) is sort


def test_sort_kernels(tmp_path):
    t = T()
    t.op("aten::unique", 10, 20, 1)
    t.op("aten::_unique2", 11, 18, 1)  # launched from inside aten::unique: the top-level op is aten::unique
    t.kernel(HIST, 100, 10, 1, launch_ts=12)
    t.kernel(ONESWEEP, 110, 30, 1, launch_ts=13)
    t.op("aten::argsort", 40, 5, 2)
    t.kernel(ONESWEEP, 200, 20, 2, launch_ts=41)
    t.op("aten::mm", 50, 5, 3)
    t.kernel(GEMM, 300, 140, 3, launch_ts=51)
    (f,) = t.facts(tmp_path, "sort_kernels")
    # sorts 10 + 30 + 20 = 60 of 200 µs: unique 40, argsort 20
    assert (f.kernels_count, f.time_us) == (3, 60) and f.share_of_device_time_ratio == pytest.approx(0.3)
    assert f.operators == ["aten::unique", "aten::argsort"] and f.top_operator == "aten::unique"


# --- training-mode layers in a forward-only run, CPU-only trace (operators, no kernels) ----------------
BN_TRAIN_ARGS = ["", "", "", "", "", "True", "0.1", "1e-05"]  # training is Concrete Input 5
BN_EVAL_ARGS = ["", "", "", "", "", "False", "0.1", "1e-05"]


def _cop(t: T, name: str, ts, dur, ext: int, concrete: list | None = None) -> None:
    args = {"External id": ext, **({"Concrete Inputs": concrete} if concrete else {})}
    t.ev.append(X("cpu_op", name, ts, dur, args=args))


def _cpu_eval_ops(t: T) -> None:
    # eval mode: aten::dropout(train=False) returns its input and calls nothing; batch norm training=False
    _cop(t, "aten::conv2d", 10, 100, 1)
    _cop(t, "aten::batch_norm", 300, 10, 8, BN_EVAL_ARGS + ["True"])
    _cop(t, "aten::native_batch_norm", 301, 8, 9, BN_EVAL_ARGS)
    _cop(t, "aten::dropout", 320, 1, 10, ["", "0.3", "False"])


def _cpu_forward(t: T) -> None:
    # train mode: aten::dropout(train=True) draws a mask (bernoulli_, div_, mul inside it), and a batch
    # norm called with training=True; beside them the eval-mode calls of _cpu_eval_ops
    _cpu_eval_ops(t)
    _cop(t, "aten::dropout", 120, 40, 2, ["", "0.3", "True"])
    _cop(t, "aten::bernoulli_", 125, 20, 3)
    _cop(t, "aten::div_", 146, 5, 4)
    _cop(t, "aten::mul", 152, 6, 5)
    _cop(t, "aten::batch_norm", 200, 30, 6, BN_TRAIN_ARGS + ["True"])
    _cop(t, "aten::native_batch_norm", 202, 26, 7, BN_TRAIN_ARGS)


def _cpu_facts(tmp_path: Path, t: T, kind: str):
    b = hermes_kb.load(write_trace(tmp_path / "t.json", t.ev))
    _, fs = analyze_rank(next(iter(b)))
    assert not [f for f in fs if isinstance(f, AnalyzerError)]
    return [f for f in fs if f.kind == kind]


def test_train_mode_in_forward_only_cpu_run(tmp_path):
    t = T()
    _cpu_forward(t)
    (f,) = _cpu_facts(tmp_path, t, "train_mode_inference")
    # the train-mode dropout call (40) and the training batch norm (30): 70 µs; the eval-mode batch norm
    # and dropout do not count. Operator self time: conv 100 + dropout 40 + batch norms 30 + 10 + dropout 1
    # = 181 µs -> 70 / 181
    assert (f.backward_nodes_count, f.dropout_calls_count, f.batchnorm_train_calls_count) == (0, 1, 1)
    assert (f.train_mode_kernels_count, f.train_mode_time_us) == (2, 70)
    assert f.share_of_device_time_ratio == pytest.approx(70 / 181)
    assert f.top_kernel == "aten::dropout" and f.measured_on == "operators"


def test_no_train_mode_fact_in_a_cpu_training_step(tmp_path):
    t = T()
    _cpu_forward(t)
    _cop(t, "autograd::engine::evaluate_function: ConvolutionBackward0", 400, 50, 11)
    assert not _cpu_facts(tmp_path, t, "train_mode_inference")


def test_no_train_mode_fact_in_an_eval_mode_cpu_run(tmp_path):
    t = T()
    _cpu_eval_ops(t)
    assert not _cpu_facts(tmp_path, t, "train_mode_inference")
