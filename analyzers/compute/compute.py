"""compute: what the device computes, how well, and what could be fused.

Per rank, over the analysed step windows (see docs/analysis/compute.md for every formula):

- kernel classes (GEMM, convolution, attention, element-wise, reduction, normalisation, memory,
  communication, other) by kernel-name patterns, with their share of device time and of step
  time; on CPU-only traces the ATen operators are classified instead (self time);
- FLOPs and bytes of recognised ATen operators from recorded shapes (analyzers/compute/flops.py), kernel
  time attributed to the operator that launched it (External id, else the enclosing operator at
  the launch), a roofline class per operator and shape (the paper's rule), and MFU;
- tensor-core use of GEMM/convolution kernels, short kernels, and repeated element-wise kernel
  sequences (fusion candidates).

Everything is vectorised: Python loops run over distinct kernel names, distinct operator
shapes, streams and tree depth levels only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from hermes_kb.core.devices import DeviceSpec, device_of_trace
from hermes_kb.core.dtypes import FLOAT_RANK
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.classes import KernelClassShare, ShortKernels
from hermes_kb.facts.compute.fusion import FusionCandidates, FusionSequence
from hermes_kb.facts.compute.precision import TensorCoreUsage
from hermes_kb.facts.compute.roofline import ModelFlopsUtilization, OperatorRoofline, RooflineSummary

from .. import intervals as iv
from ..context import RankContext
from ..host.dispatch import ops_in_optimizer
from ..whatif.sets import WhatIfSet, register
from .flops import ELEMENTWISE_OPS, is_recognised, op_cost, shape_signature

# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
SHORT_KERNEL_US = 10.0  # kernels shorter than this are dominated by launch overhead
U_THR = 0.5  # roofline utilisation threshold (fraction of the vendor peak)
TOP_OPS = 10  # roofline rows per rank
TOP_FUSION = 5  # fusion-candidate sequences per rank
FUSION_MIN_COUNT = 3  # a sequence must repeat at least this often
FUSION_NGRAMS = (2, 3, 4)
FUSION_CLASSES = ("elementwise", "reduction", "norm")
FUSION_MAX_COUNTED = 100  # distinct sequences counted per rank (the fact lists TOP_FUSION of them)
FUSION_HOST_BOUND = 0.4  # exec / (exec + gaps) below this: host bound (msprof-analyze host_threshold)
FUSION_MTE_BOUND = 0.8  # MTE time / core time above this: MTE bound (msprof-analyze mte_threshold)

CLASSES = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "communication", "other")

# --- kernel classification ------------------------------------------------------------------
_I = re.IGNORECASE
# substrings of the lower-cased kernel name (plain `in` tests: kernel names can be kilobytes long)
_COMM = ("nccl", "rccl", "msccl", "multimem_all_reduce", "cross_device_reduce", "allreduce", "all_reduce",
         "allgather", "all_gather", "reducescatter", "reduce_scatter", "alltoall", "all_to_all", "one_shot_",
         "two_shot_")  # fmt: skip
_ATTN = ("flash", "fmha", "attention", "attn", "sdpa", "_mha_", "mha_fwd", "mha_bwd", "xformers")
_KV_MEMORY = ("reshape_and_cache", "store_kvcache", "_copy_page")
_NORM = ("layer_norm", "layernorm", "batch_norm", "batchnorm", "group_norm", "groupnorm", "instance_norm",
         "instancenorm", "rms_norm", "rmsnorm", "bn_fw", "bn_bw", "rowwisemoments", "gammabetabackward",
         "computeinvstd", "normalization")  # fmt: skip
_MEMORY = ("memcpy", "memset", "copy_kernel", "direct_copy", "catarraybatchedcopy", "nchwtonhwc", "nhwctonchw",
           "batched_transpose", "copybuffer", "fillbuffer", "fillfunctor", "copyfunctor", "reshape_and_cache",
           "store_kvcache", "_copy_page", "indexselect", "index_select", "gather_kernel", "scatter_gather",
           "indexfunc", "index_elementwise", "vectorized_gather", "recat_copy", "permute_2d", "permute_pooled_embs", "_to_copy",
           "tofloat32_copy", "tobfloat16_copy")  # fmt: skip
_CONV = ("winograd", "scudnn", "implicit_gemm", "implicitgemm", "fprop", "dgrad", "wgrad", "igemm_fwd", "igemm_bwd",
         "igemm_wrw", "im2col", "im2d2col", "col2im", "fft2d_", "cask_cudnn", "cutlass_cudnn", "xdlops_bwd_weight",
         "miopen")  # fmt: skip
_CONV_RE = re.compile(r"conv(?!ert)")
_GEMM = ("gemm", "gemv", "cijk_", "cublas", "cutlass", "nvjet", "matmul", "xmma", "wmma", "splitkreduce",
         "dot_kernel", "rocblas", "hipblaslt", "magma", "_mm_")  # fmt: skip
_ELEMWISE = ("elementwise", "multi_tensor_apply", "foreach", "unary", "binary", "pointwise", "act_and_mul", "silu",
             "gelu", "relu", "dropout", "rotary", "quant", "activation", "sigmoid", "tanh", "_with_index",
             "distribution_", "subtensorop", "optensor", "adam", "sgd", "scal_kernel", "clamp", "where", "masked")  # fmt: skip
_REDUCE = ("reduce", "softmax", "argmax", "argmin", "topk", "scan", "cumsum", "nll_loss", "cross_entropy", "pool",
           "sum_", "_sum", "mean", "norm_kernel", "sort", "bitmatrix")  # fmt: skip


def _has(text: str, subs: tuple[str, ...]) -> bool:
    return any(s in text for s in subs)


_TRITON = re.compile(r"^triton_(poi|red|per|tem)_(?:fused_)?(.*?)(?:_\d+)?$")


def _head(name: str) -> str:
    """Function name without return type, template arguments and parameters."""
    s = name.strip().replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    if s.startswith("std::enable_if") and "::type " in s:
        s = s.split("::type ", 1)[1]
    for i, ch in enumerate(s):
        if ch in "<(":
            s = s[:i]
            break
    return s


def _demangle_last(name: str) -> str:
    """Last component of an Itanium-mangled nested name (_ZN5aiter24add_rmsnorm_kernelI... -> add_rmsnorm_kernel)."""
    m = re.match(r"_ZN(.*)", name)
    if not m:
        return name
    s, parts = m.group(1), []
    while s and s[0].isdigit():
        d = re.match(r"\d+", s)
        assert d is not None
        n = int(d.group(0))
        s = s[d.end():]
        parts.append(s[:n])
        s = s[n:]
    return parts[-1] if parts else name


def _triton_class(kind: str, ops: str) -> str:
    tok = f"_{ops}_"
    if re.search(r"_(_scaled_dot_product\w*|flash\w*|attention)_", tok):
        return "attention"
    if kind == "tem" or re.search(r"_(mm|bmm|addmm|baddbmm)_", tok):
        return "gemm"
    if "_convolution_" in tok:
        return "conv"
    if re.search(r"native_layer_norm|native_batch_norm|native_group_norm|_rms_norm|layer_norm|batch_norm", tok) or (
        "rsqrt" in tok and ("mean" in tok or "var" in tok)
    ):
        return "norm"
    if kind in ("red", "per"):
        return "reduction"
    return "elementwise"


@lru_cache(maxsize=16384)
def classify_kernel(name: str) -> str:
    """Kernel class from its name (first match wins, in the order of the checks below)."""
    m = _TRITON.match(name)
    if m:
        return _triton_class(m.group(1), m.group(2))
    if name.startswith("triton"):
        return "other"  # triton__0d1d2d...: no op names in the kernel name
    low = name.lower()
    head = _head(name)
    short = (_demangle_last(head) if head.startswith("_Z") else head).lower()
    if _has(short, _COMM):
        return "communication"
    if _has(short, _KV_MEMORY):
        return "memory"  # KV-cache writes (they mention 'flash' in their names)
    if _has(short, _ATTN):
        return "attention"
    if _has(low, _NORM):
        return "norm"
    if _has(low, _MEMORY) or short.startswith("transpose_"):
        return "memory"
    if _has(low, _CONV) or ("conv" in low and _CONV_RE.search(low)):
        return "conv"
    if _has(low.replace("fbgemm", ""), _GEMM) or short.startswith("bmm_"):
        return "gemm"
    if _has(short, _ELEMWISE):
        return "elementwise"
    if _has(short, _REDUCE):
        return "reduction"
    if _has(low, _ELEMWISE):
        return "elementwise"
    if _has(low, _REDUCE):
        return "reduction"
    return "other"


# --- Ascend operator types (kernel_details.csv 'Type', or the last part of the task name) -------
# CANN operator type names (the Ascend op library); prefixes tolerate the V2 / V3 / D / Grad
# variants. First match wins, in this order.
_ASC_COMM = re.compile(r"^(hcom|lccl|lcoc)|^Hcom|^HcclAll|^MatmulAllReduce|AllGatherMatmul|MatmulReduceScatter", _I)
_ASC_ATTN = re.compile(r"Attention")
_ASC_NORM = re.compile(r"LayerNorm|RmsNorm|BatchNorm|GroupNorm|InstanceNorm|DeepNorm|^BN(Training|Infer)|^BNInfer|^SyncBN")
_ASC_GEMM = re.compile(r"^(MatMul|BatchMatMul|GroupedMatmul|QuantBatchMatmul|WeightQuantBatchMatmul|GEMM|Gemm|"
                       r"FullyConnection|Einsum)|^Mm$|^Bmm", _I)  # fmt: skip
_ASC_CONV = re.compile(r"^(Conv\d|Conv2D|Conv3D|Convolution|DepthwiseConv|Deconvolution|Conv2DTranspose|Conv3DTranspose)")
_ASC_REDUCE = re.compile(r"^(Reduce|ArgMax|ArgMin|ArgMaxWithValue|ArgMinWithValue|SoftmaxV2|Softmax|LogSoftmax|"
                         r"SoftmaxGrad|LogSoftmaxGrad|SoftmaxCrossEntropy|SparseSoftmaxCrossEntropy|LpNorm|Norm$|"
                         r"Cumsum|Cumprod|CumSum|TopK|Sort|MaxPool|AvgPool|AdaptiveAvgPool|AdaptiveMaxPool|NLLLoss|"
                         r"CrossEntropy|MseLoss|BinaryCrossEntropy|KlDiv|BiasAddGrad|SquareSumV|Bincount|Var|ScaledMaskedSoftmax|"
                         r"Mean|Sum$|Max$|Min$|Prod$|All$|Any$)")  # fmt: skip
_ASC_MEMORY = re.compile(r"^(TransData|TransposeD?$|Transpose$|ConfusionTranspose|TensorMove|Identity|MemSet|MemCopy|"
                         r"Memcpy|Slice|StridedSlice|SliceD|Concat|ConcatD|ConcatV2|Pack|Unpack|Split|SplitD|SplitV|"
                         r"GatherV2|Gather|GatherElements|GatherNd|Index$|IndexPut|IndexAdd|Scatter|InplaceIndexAdd|"
                         r"Fill|Fills|ZerosLike|OnesLike|BroadcastTo|Tile|Expand|AsStrided|ViewCopy|Reshape|"
                         r"ExpandDims|Squeeze|Unsqueeze|Tril|Triu|Embedding|EmbeddingDenseGrad|Flip|Roll|PadV|Pad$|"
                         r"PadD|Repeat|MaskedSelect|ReverseV2|TransDataRNN)")  # fmt: skip
_ASC_ELEMWISE = re.compile(r"^(Add|AddV2|Adds|AddN|Addcmul|Addcdiv|Sub|Subs|Mul|Muls|Div|Divs|RealDiv|FloorDiv|"
                           r"FloorMod|Mod|Neg|Exp|Expm1|Log|Log1p|Sqrt|Rsqrt|Pow|Pows|Square|SquaredDifference|Abs|"
                           r"Sin|Cos|Tan|Tanh|Sinh|Cosh|Asin|Acos|Atan|Erf|Erfc|Sigmoid|Relu|ReluV2|LeakyRelu|Elu|"
                           r"Selu|Gelu|FastGelu|Silu|Swish|SwiGlu|GeGlu|Mish|Softplus|Softsign|HardSwish|HardSigmoid|"
                           r"Hardtanh|PRelu|Relu6|RotaryPositionEmbedding|RotaryMul|ApplyRotaryPosEmb|Maximum|Minimum|"
                           r"Equal|NotEqual|Greater|GreaterEqual|Less|LessEqual|Logical|IsFinite|IsInf|IsNan|Select|"
                           r"SelectV2|Where|MaskedFill|ClipByValue|ClipByNorm|Clamp|Cast|Sign|Floor|Ceil|Round|Trunc|"
                           r"Reciprocal|Inv$|Axpy|Lerp|BiasAdd$|Apply[A-Z]|Foreach|NpuFused|DropOut|Dropout|"
                           r"DSAGenBitMask|DSAStatelessGenBitMask|StatelessDropOutGenMask|DropOutGenMask|"
                           r"StatelessRandom|Threshold|BitwiseAnd|BitwiseOr|BitwiseNot|BitwiseXor|LinSpace|Range$)")  # fmt: skip
_ASC_GRAD_EW = re.compile(r"^(Relu|Gelu|FastGelu|Silu|Swish|SwiGlu|GeGlu|Sigmoid|Tanh|Mish|Softplus|HardSwish|"
                          r"LeakyRelu|Elu|RotaryPositionEmbedding|RotaryMul|Sqrt|Rsqrt)Grad")  # fmt: skip
_ASC_NAME_SUFFIX = re.compile(r"_\d+$")


def ascend_op_type_of_name(name: str) -> str:
    """The operator type in an Ascend task name when kernel_details gives none (Level0 exports):
    aclnn names end with it (aclnnAdd_AddAiCore_Add -> Add), graph node names carry an index
    (trans_TransData_3 -> TransData)."""
    s = _ASC_NAME_SUFFIX.sub("", name.strip())
    return s.rsplit("_", 1)[-1] if "_" in s else s


@lru_cache(maxsize=16384)
def classify_ascend_op(op_type: str) -> str | None:
    """Kernel class of an Ascend (CANN) operator type; None when the type is not in the tables."""
    t = op_type.strip()
    if not t or t.lower() == "nan":
        return None
    if _ASC_COMM.search(t):
        return "communication"
    if _ASC_ATTN.search(t):
        return "attention"
    if _ASC_NORM.search(t):
        return "norm"
    if _ASC_GEMM.search(t):
        return "gemm"
    if _ASC_CONV.search(t):
        return "conv"
    if _ASC_GRAD_EW.match(t):
        return "elementwise"
    if _ASC_REDUCE.match(t):
        return "reduction"
    if _ASC_MEMORY.match(t):
        return "memory"
    if _ASC_ELEMWISE.match(t):
        return "elementwise"
    return None


@lru_cache(maxsize=16384)
def classify_ascend_task(op_type: str, name: str, task_type: str = "") -> str:
    """Kernel class of an Ascend device task: HCCL tasks are communication; else the operator
    type (kernel_details 'Type'), else the type in the task name, else the kernel-name rules."""
    if task_type.upper() in ("HCCL", "COMMUNICATION"):
        return "communication"
    c = classify_ascend_op(op_type)
    if c is None:
        c = classify_ascend_op(ascend_op_type_of_name(name))
    return c if c is not None else classify_kernel(name)


_FUNCTOR_PATTERNS = [
    re.compile(r"(\w+?)_kernel_cuda"),
    re.compile(r"binary_internal::(\w+?)Functor"),
    re.compile(r"CUDAFunctor(?:OnSelf)?_(\w+)"),
    re.compile(r"native::(\w+?)Ops<"),
    re.compile(r"(\w+?)_functor"),
    re.compile(r"(?:native::|namespace\)::)(\w+?)_kernel(?:_impl)?(?:\(|<)"),
    re.compile(r"native::(\w+?)Functor<"),
]
_GENERIC = {"gpu", "gpu_kernel_impl", "gpu_kernel_impl_nocast", "Binary", "AUnary", "BUnary", "func_wrapper_t",
            "Reduce", "vectorized_elementwise", "elementwise", "unrolled_elementwise", "reduce", "launch",
            "index_elementwise", "elementwise_kernel_with_index"}  # fmt: skip


@lru_cache(maxsize=16384)
def short_kernel_name(name: str) -> str:
    """A readable short name: the functor of an ATen element-wise/reduce kernel, the fused ops of a
    Triton kernel, else the kernel's function name."""
    m = _TRITON.match(name)
    if m:
        return f"triton_{m.group(1)}:{m.group(2)}"[:60]
    head = _head(name)
    if head.startswith("_Z"):
        head = _demangle_last(head)
    base = head.rsplit("::", 1)[-1]
    if base in ("Kernel", "Kernel2", "kernel", "kentry", "globalKernel"):
        arg = re.match(r"[^<]*<\s*([A-Za-z_][\w:]*)", name)
        parts = head.split("::")
        if arg and base in ("Kernel", "Kernel2") and arg.group(1).startswith("cutlass"):
            base = arg.group(1).rsplit("::", 1)[-1]
        elif len(parts) > 1:
            base = "::".join(parts[-2:])
    if "at::native" in name:
        body = (name[len(head) :] if name.startswith(head) else name)[:400]
        for pat in _FUNCTOR_PATTERNS:
            for mm in pat.finditer(body):
                fn = mm.group(1).rsplit("::", 1)[-1]
                if fn and fn not in _GENERIC:
                    return f"{base}:{fn}"[:60]
    return base[:60]


_TC = re.compile(r"hmma|xmma|wgmma|tensorop|tfloat32|s16816|s1688|h1688|h16816|h884|s884|i8816|i16832|\d+x\d+x\d+gemm|"
                 r"wmma|tf32|bf16|f16|fp16|e4m3|e5m2|fp8|mxfp|nvjet|sm90_|sm100|_MI\d+x\d+x\d+|mfma|xdl|gtcx|"
                 r"BBS_|HHS_|_HSS_|cutlass_80_tensorop|_bf16|bfloat16|half", _I)  # fmt: skip
# cuBLAS/cuDNN xmma kernels name their math instruction: "_ffma_" is FP32 FMA on the CUDA cores
# (e.g. sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_..._ffma_aligna4_...: FP32 GEMMs with TF32 off on
# Ampere/Hopper), where tensor-core ones say hmma/imma/wgmma/tf32
_NO_TC = re.compile(r"sgemm|simt|gemv|dot_kernel|gcgemm|dgemm|scudnn|winograd|implicit_convolve|gemmSN|gemmk1|_ffma|"
                    r"fft2d|_engine<|conv2d_grouped_direct|naive_conv", _I)  # fmt: skip
_AUX = re.compile(r"splitkreduce|epilogue|reduce_1Block|scal_kernel|cask_cudnn|computeOffsets|"
                  r"reduce_wgrad|nchwToNhwc|nhwcToNchw", _I)  # fmt: skip
_FP32 = re.compile(r"sgemm|tfloat32|scudnn|float, float, float|_s_?gemm|s1688gemm|s16816gemm|<float,|<int, int, float, float|tf32f32|"
                   r"float const\*|_f32_f32|fp32|_f32f32_f32f32_f32", _I)  # fmt: skip
_LOW = re.compile(r"bf16|bfloat16|half|f16|fp16|hgemm|h884|h1688|h16816|e4m3|e5m2|fp8|_i8|int8|BBS|HHS|HSS|"
                  r"mxfp|__nv_bfloat16|c10::BFloat16|c10::Half|double|dgemm", _I)  # fmt: skip


@lru_cache(maxsize=16384)
def tensor_core_kind(name: str) -> str:
    """'tensor' (tensor/matrix cores), 'no_tensor' (CUDA cores / SIMD), or 'aux' (split-K reduce,
    epilogues, layout transforms: GEMM/conv helpers that do no matrix math)."""
    head = _head(name)
    if _AUX.search(_demangle_last(head) if head.startswith("_Z") else head):
        return "aux"
    if _NO_TC.search(name):
        return "no_tensor"
    if _TC.search(name):
        return "tensor"
    return "no_tensor"


def _is_tf32(name: str) -> bool:
    """FP32 matmul on tensor cores: 'tf32' / cutlass::tfloat32_t, or CUTLASS 'tensorop_s1688gemm' (FP32
    operands; 'tensorop_bf16_s16816gemm' has BF16 operands and FP32 accumulation)."""
    n = name.lower()
    return "tf32" in n or "tfloat32" in n or bool(re.search(r"tensorop_s\d+gemm", n))


_TENSILE = re.compile(r"^Cijk_A[a-z]+_B[a-z]+_([A-Za-z0-9]+)_")


@lru_cache(maxsize=16384)
def is_fp32_kernel(name: str) -> bool:
    """True for FP32 (single-precision) GEMM/conv kernels, including TF32 ones."""
    m = _TENSILE.match(name)
    if m:  # Tensile (rocBLAS/hipBLASLt): the data-type token after the layouts, S = single
        return m.group(1).startswith("S")
    if _is_tf32(name):
        return True
    return bool(_FP32.search(name)) and not _LOW.search(name)


# --- CPU operator classes (CPU-only traces) ---------------------------------------------------
_CPU_GEMM = re.compile(r"^aten::(mm|addmm|_addmm_activation|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm|mv|addmv|"
                       r"dot|vdot|einsum|mkldnn_linear|_mkldnn_linear)$|gemm")  # fmt: skip
_CPU_CONV = re.compile(r"^aten::\w*conv(?!ert)")
_CPU_ATTN = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|_attention")
_CPU_NORM = re.compile(r"^aten::(native_)?(layer|batch|group|instance|rms)_norm|^aten::_batch_norm|batch_norm")
_CPU_COMM = re.compile(r"^(c10d|nccl|gloo|record_param_comms)|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                       r"broadcast_|^c10d::")  # fmt: skip
_CPU_RED = re.compile(r"^aten::(sum|mean|max|min|amax|amin|argmax|argmin|_?softmax|_?log_softmax|nll_loss\w*|"
                      r"cross_entropy_loss|norm|linalg_vector_norm|prod|var|std|var_mean|cumsum|topk|sort|all|any|"
                      r"logsumexp|_softmax_backward_data|_log_softmax_backward_data|mse_loss\w*)$")  # fmt: skip
_CPU_MEM = re.compile(r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|index|index_select|index_put_|gather|"
                      r"scatter\w*|embedding\w*|fill_|zero_|zeros|zeros_like|ones|ones_like|full|full_like|"
                      r"constant_pad_nd|pad|flip|roll|repeat|_index_put_impl_|masked_select|take|narrow_copy)$")  # fmt: skip
_CPU_EW_NAMES = set(ELEMENTWISE_OPS)


@lru_cache(maxsize=16384)
def classify_cpu_op(name: str) -> str:
    if _CPU_COMM.search(name):
        return "communication"
    if _CPU_ATTN.search(name):
        return "attention"
    if _CPU_CONV.search(name):
        return "conv"
    if _CPU_GEMM.search(name):
        return "gemm"
    if _CPU_NORM.search(name):
        return "norm"
    if _CPU_RED.search(name):
        return "reduction"
    if _CPU_MEM.search(name):
        return "memory"
    if name.startswith("aten::") and (name[6:] in _CPU_EW_NAMES or name.startswith("aten::_foreach_")
                                       or name[6:].rstrip("_") in _CPU_EW_NAMES or name.endswith("dropout")):
        return "elementwise"
    return "other"


# --- helpers --------------------------------------------------------------------------------
def _cat_apply(cat: pd.Series, fn, dtype=object) -> tuple[np.ndarray, np.ndarray]:
    """fn applied once per category value: (values per category + one for missing, row codes)."""
    cats = cat.cat.categories
    vals = np.array([fn(str(c)) for c in cats] + [fn("")], dtype=dtype)
    codes = cat.cat.codes.to_numpy().astype(np.int64)
    return vals, np.where(codes < 0, len(cats), codes)


def _windows(ctx: RankContext) -> iv.Intervals:
    return iv.union([w.start_us for w in ctx.windows], [w.end_us for w in ctx.windows])


def _in_windows(ctx: RankContext, ts: np.ndarray) -> np.ndarray:
    return ctx.step_of(ts) >= 0


def _spread(parent: np.ndarray, depth: np.ndarray, values: np.ndarray, combine) -> np.ndarray:
    """Values carried down the call trees, level by level: each op's becomes
    ``combine(its own, its parent's)``."""
    out = values.copy()
    if not len(out):
        return out
    for d in range(1, int(depth.max()) + 1):
        rows = np.flatnonzero(depth == d)
        p = parent[rows]
        ok = p >= 0
        out[rows[ok]] = combine(out[rows[ok]], out[p[ok]])
    return out


def _down(parent: np.ndarray, depth: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """flag spread down the call trees: an op is flagged when it or an ancestor is."""
    return _spread(parent, depth, flag, np.logical_or)


def _root(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Row of each op's top-level (depth 0) ancestor, itself at the top."""
    return _spread(parent, depth, np.arange(len(parent)), lambda own, up: up)


_SDPA_MATH = frozenset({"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_attention_math_for_mps"})


def sdpa_math_ops(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per cpu-op row (the math call itself, ops under a math call, ops of its backward) when SDPA
    ran its math path in the analysed steps, else None. The backward's autograd nodes carry the
    sequence number of the forward operator that made them. Computed once per rank (the compute
    and kernel analyzers both need it)."""
    if "sdpa_math_ops" in ctx.shared:
        return ctx.shared["sdpa_math_ops"]
    ctx.shared["sdpa_math_ops"] = found = _sdpa_math_ops(ctx)
    return found


def _sdpa_math_ops(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return None
    names_v, ncodes = _cat_apply(ops["name"], str)
    is_math = np.array([n in _SDPA_MATH for n in names_v], dtype=bool)[ncodes]
    win = _in_windows(ctx, ops["ts"].to_numpy())
    if not (is_math & win).any():
        return None
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    under = _down(parent, depth, is_math)
    bwd = np.zeros(len(ops), dtype=bool)
    if "seq" in ops.columns:
        seq = ops["seq"].to_numpy()
        fseq = np.unique(seq[under & (seq >= 0)])  # a forward before the first window still has its backward in it
        bnames = np.array([("Backward" in n) for n in names_v], dtype=bool)[ncodes]
        bwd = ~under & bnames & np.isin(seq, fseq) & (seq >= 0)
        bwd = _down(parent, depth, bwd) if bwd.any() else bwd
    return is_math, under, bwd


def _ratio(x: float) -> float:
    if not np.isfinite(x):
        return 0.0
    return float(min(1.0, max(0.0, x)))


def _top_names(name_id: np.ndarray, weights: np.ndarray, names: np.ndarray, n: int = 3) -> list[str]:
    """The n names with the largest summed weight."""
    if not len(name_id):
        return []
    tot = np.bincount(name_id, weights=weights, minlength=len(names))
    top = np.argsort(-tot, kind="stable")[:n]
    return [str(names[i])[:200] for i in top if tot[i] > 0]


@dataclass
class _Acts:
    """Device activities (kernels, then memcpy/memset) of the analysed windows, as numpy arrays."""

    row: np.ndarray  # row in kernels / memcpy
    name_id: np.ndarray  # index into names
    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    cls: np.ndarray  # index into CLASSES
    kernel: np.ndarray  # bool: kernel (else memcpy/memset)
    names: np.ndarray  # name table

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, m: np.ndarray) -> _Acts:
        return _Acts(self.row[m], self.name_id[m], self.ts[m], self.end[m], self.dur[m], self.stream[m],
                     self.device[m], self.cls[m], self.kernel[m], self.names)  # fmt: skip


_CLS_INDEX = {c: i for i, c in enumerate(CLASSES)}


def _device_activities(ctx: RankContext) -> _Acts:
    tr = ctx.trace
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "name_id", "ts", "end", "dur", "stream", "device",
                                                          "cls", "kernel")}  # fmt: skip
    names: list[np.ndarray] = []
    offset = 0
    for frame, is_kernel in ((tr.kernels, True), (tr.memcpy, False)):
        if not len(frame):
            continue
        cats = frame["name"].cat.categories
        table = np.array([str(c) for c in cats] + [""], dtype=object)
        m = _in_windows(ctx, frame["ts"].to_numpy())
        codes = frame["name"].cat.codes.to_numpy().astype(np.int64)
        codes = np.where(codes < 0, len(cats), codes)[m]
        if is_kernel:
            full = frame["name"].cat.codes.to_numpy().astype(np.int64)
            full = np.where(full < 0, len(cats), full)
            if _is_ascend(ctx, frame):
                row_cls = _ascend_classes(frame, table, full)
            else:
                ccls = np.array([_CLS_INDEX[classify_kernel(n)] for n in table], dtype=np.int64)
                row_cls = ccls[full]
            # hand the class of every kernel row to later analyzers (index into CLASSES)
            ctx.shared["compute"] = {"classes": CLASSES, "kernel_class": row_cls}
            cls = row_cls[m]
        else:
            cls = np.full(len(codes), _CLS_INDEX["memory"], dtype=np.int64)
        cols["row"].append(np.flatnonzero(m))
        cols["name_id"].append(codes + offset)
        for c in ("ts", "end", "dur", "stream", "device"):
            cols[c].append(frame[c].to_numpy()[m])
        cols["cls"].append(cls)
        cols["kernel"].append(np.full(len(codes), is_kernel))
        names.append(table)
        offset += len(table)
    if not names:
        e = np.zeros(0)
        ei = np.zeros(0, dtype=np.int64)
        return _Acts(ei, ei, e, e, e, ei, ei, ei, np.zeros(0, dtype=bool), np.zeros(0, dtype=object))
    return _Acts(*(np.concatenate(cols[k]) for k in ("row", "name_id", "ts", "end", "dur", "stream", "device",
                                                      "cls", "kernel")), np.concatenate(names))  # fmt: skip


def _is_ascend(ctx: RankContext, frame: pd.DataFrame) -> bool:
    return getattr(ctx.trace.meta, "format", "") == "ascend" and "op_type" in frame.columns


def _ascend_classes(frame: pd.DataFrame, table: np.ndarray, name_codes: np.ndarray) -> np.ndarray:
    """Class per kernel row of an Ascend trace, from (operator type, task name, task type),
    classified once per distinct combination."""
    def codes_of(col: str) -> tuple[np.ndarray, np.ndarray]:
        if col not in frame.columns:
            return np.array([""], dtype=object), np.zeros(len(frame), dtype=np.int64)
        c = frame[col].astype("category")
        vals = np.array([str(v) for v in c.cat.categories] + [""], dtype=object)
        k = c.cat.codes.to_numpy().astype(np.int64)
        return vals, np.where(k < 0, len(vals) - 1, k)

    ops, op_codes = codes_of("op_type")
    tts, tt_codes = codes_of("task_type")
    key = (name_codes * len(ops) + op_codes) * len(tts) + tt_codes
    uniq, inv = np.unique(key, return_inverse=True)
    cls = np.empty(len(uniq), dtype=np.int64)
    for i, kk in enumerate(uniq):
        rest, t = divmod(int(kk), len(tts))
        n, o = divmod(rest, len(ops))
        cls[i] = _CLS_INDEX[classify_ascend_task(str(ops[o]), str(table[n]), str(tts[t]))]
    return cls[inv.reshape(-1)]


def _register_device(ctx: RankContext, name: str, description: str, act: _Acts) -> None:
    if len(act):
        register(ctx, WhatIfSet(name, description, kernels=act.row[act.kernel], memcpy=act.row[~act.kernel]))


def _class_facts(ctx: RankContext, act: _Acts) -> list[Fact]:
    total = float(act.dur.sum())
    win = _windows(ctx)
    wtot = ctx.windows_us
    out: list[Fact] = []
    comm = _CLS_INDEX["communication"]
    _register_device(ctx, "device_compute", "every device activity but collectives", act.take(act.cls != comm))
    _register_device(ctx, "fusable", "element-wise, reduction and normalisation kernels",
                     act.take(np.isin(act.cls, [_CLS_INDEX[c] for c in FUSION_CLASSES])))
    for ci, c in enumerate(CLASSES):
        m = act.cls == ci
        n = int(m.sum())
        if not n:
            continue
        if c != "communication":  # the comm analyzer's set holds the collectives
            _register_device(ctx, f"class:{c}", f"{c} kernels", act.take(m))
        busy = iv.length(iv.intersect(iv.union(act.ts[m], act.end[m]), win))
        t = float(act.dur[m].sum())
        nk = int((m & act.kernel).sum())
        out.append(KernelClassShare(
            rank=ctx.rank, kernel_class=c, source="kernel", time_us=t, busy_us=busy, count=n,
            share_of_device_time_ratio=_ratio(t / total) if total > 0 else 0.0,
            share_of_step_time_ratio=_ratio(busy / wtot) if wtot > 0 else 0.0,
            mean_duration_us=t / n,
            evidence=Evidence(
                time_ranges_us=[ctx.span],
                events=_top_names(act.name_id[m], act.dur[m], act.names),
                counts={"kernels": nk, "memcpy_memset": n - nk},
                note="time = sum of durations; busy = union of the class's intervals inside the step windows; "
                     "share of device time = time / time of all kernels and memcpy/memset; events = longest kernels",
            ),
        ))  # fmt: skip
    return out


def _cpu_self_time(ops: pd.DataFrame) -> np.ndarray:
    dur = ops["dur"].to_numpy()
    parent = ops["parent"].to_numpy()
    has = parent >= 0
    child = np.bincount(parent[has], weights=dur[has], minlength=len(ops))
    return np.clip(dur - child, 0.0, None)


def _cpu_class_facts(ctx: RankContext) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return []
    m = _in_windows(ctx, ops["ts"].to_numpy())
    if not m.any():
        return []
    vals, codes = _cat_apply(ops["name"], lambda n: _CLS_INDEX[classify_cpu_op(n)], dtype=np.int64)
    table = np.array([str(c) for c in ops["name"].cat.categories] + [""], dtype=object)
    cls = vals[codes][m]
    st = _cpu_self_time(ops)[m]
    opt = ops_in_optimizer(ctx)[m]
    codes = codes[m]
    total = float(st.sum())
    wtot = ctx.windows_us
    out: list[Fact] = []
    rows = np.flatnonzero(m)
    otid, ots, oend = (ops[c].to_numpy() for c in ("tid", "ts", "end"))
    for ci, c in enumerate(CLASSES):
        sel = cls == ci
        n = int(sel.sum())
        if not n:
            continue
        r = rows[sel & ~opt]
        if len(r):  # the operators' own intervals (children of another class included: an approximation)
            register(ctx, WhatIfSet.of_intervals(f"class:{c}", f"{c} operators on the CPU (outside the optimizer)",
                                                 otid[r], ots[r], oend[r]))  # fmt: skip
        t = float(st[sel].sum())
        t_opt = float(st[sel & opt].sum())
        out.append(KernelClassShare(
            rank=ctx.rank, kernel_class=c, source="cpu_op", time_us=t, busy_us=min(t, wtot), count=n,
            share_of_device_time_ratio=_ratio(t / total) if total > 0 else 0.0,
            share_of_step_time_ratio=_ratio(t / wtot) if wtot > 0 else 0.0,
            mean_duration_us=t / n, in_optimizer_us=t_opt, outside_optimizer_us=t - t_opt,
            outside_optimizer_share_ratio=_ratio((t - t_opt) / total) if total > 0 else 0.0,
            evidence=Evidence(
                time_ranges_us=[ctx.span],
                events=_top_names(codes[sel], st[sel], table),
                counts={"cpu_ops": n},
                note="CPU-only trace: ATen operators classified by name; time = self time (duration minus "
                     "nested operators); share of step time = time / window time, capped at 1",
            ),
        ))  # fmt: skip
    return out


def _short_kernels(ctx: RankContext, k: _Acts) -> list[Fact]:
    if not len(k):
        return []
    dur = k.dur
    short = dur < SHORT_KERNEL_US
    total = float(dur.sum())
    st = float(dur[short].sum())
    return [ShortKernels(
        rank=ctx.rank, threshold_us=SHORT_KERNEL_US, kernels_count=len(k), short_count=int(short.sum()),
        short_time_us=st, short_count_ratio=_ratio(float(short.mean())),
        short_time_ratio=_ratio(st / total) if total else 0.0,
        mean_duration_us=float(dur.mean()), median_duration_us=float(np.median(dur)),
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=_top_names(k.name_id[short], np.ones(int(short.sum())), k.names),
            counts={"kernels": len(k), "short_kernels": int(short.sum())},
            note=f"short = duration < {SHORT_KERNEL_US:g} µs; events = the most frequent short kernels",
        ),
    )]  # fmt: skip


def tensor_core_removes(dev: DeviceSpec | None) -> tuple[float | None, float | None]:
    """Share of FP32 CUDA-core GEMM time that tensor-core math removes on ``dev`` (low, high): the
    kernels' time scales with the peak rate, the low end assuming the tensor-core kernels realise
    only half their peak advantage (TF32, or FP16 where there is no TF32), the high end all of it
    (BF16, else FP16)."""
    fp32 = dev.peak("fp32") if dev is not None else None
    if not fp32:
        return None, None
    low_peak = dev.peak("tf32") or dev.peak("fp16")
    high_peak = dev.peak("bf16") or dev.peak("fp16")
    if not low_peak or not high_peak or high_peak <= fp32:
        return None, None
    hi = 1.0 - fp32 / high_peak
    return min(max(0.0, 1.0 - 2.0 * fp32 / low_peak), hi), hi


def _tensor_cores(ctx: RankContext, k: _Acts, dev: DeviceSpec | None = None,
                  attention_math: np.ndarray | None = None) -> tuple[list[Fact], bool]:
    """The tensor-core fact, and whether FP32 matmuls run as TF32 (for choosing peaks).
    ``attention_math`` (per kernel): kernels of SDPA's math path, which upcasts to FP32 by design;
    their fix is a fused attention backend (C-COMP-007), not the model's precision, so they are
    left out of the FP32 CUDA-core GEMMs."""
    keep = (k.cls == _CLS_INDEX["gemm"]) | (k.cls == _CLS_INDEX["conv"])
    if attention_math is not None:
        keep &= ~attention_math
    mm = k.take(keep)
    if not len(mm):
        return [], False
    uid, inv = np.unique(mm.name_id, return_inverse=True)
    un = [str(mm.names[i]) for i in uid]
    kind = np.array([tensor_core_kind(n) for n in un])[inv]
    fp32 = np.array([is_fp32_kernel(n) for n in un], dtype=bool)[inv]
    tf32 = np.array([_is_tf32(n) for n in un], dtype=bool)[inv]
    dur = mm.dur
    gemm = mm.cls == _CLS_INDEX["gemm"]
    gt = float(dur[gemm].sum())
    ct = float(dur[~gemm].sum())
    tot = gt + ct
    tc = float(dur[kind == "tensor"].sum())
    notc = float(dur[kind == "no_tensor"].sum())
    sel = (kind == "no_tensor") & fp32
    _register_device(ctx, "fp32_gemm", "FP32 GEMM kernels on CUDA cores (no tensor cores)", mm.take(sel & gemm))
    _register_device(ctx, "fp32_conv", "FP32 convolution kernels on CUDA cores (no tensor cores)", mm.take(sel & ~gemm))
    fp32_notc_g = float(dur[gemm & sel].sum())
    removes = tensor_core_removes(dev)
    fp32_notc_all = float(dur[sel].sum())
    fp32_tc = float(dur[fp32 & tf32 & (kind == "tensor")].sum())
    fact = TensorCoreUsage(
        rank=ctx.rank, gemm_time_us=gt, conv_time_us=ct,
        tensor_core_time_us=tc, non_tensor_core_time_us=notc,
        fp32_non_tensor_core_time_us=fp32_notc_all, tf32_time_us=fp32_tc,
        tensor_core_ratio=_ratio(tc / tot) if tot else 0.0,
        fp32_non_tensor_core_gemm_ratio=_ratio(fp32_notc_g / gt) if gt else 0.0,
        fp32_non_tensor_core_ratio=_ratio(fp32_notc_all / tot) if tot else 0.0,
        fp32_non_tensor_core_gemm_time_us=fp32_notc_g,
        tensor_core_removes_low_ratio=removes[0], tensor_core_removes_high_ratio=removes[1],
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=_top_names(mm.name_id[sel], dur[sel], mm.names) if sel.any() else
                   _top_names(mm.name_id, dur, mm.names),
            counts={"gemm_kernels": int(gemm.sum()), "conv_kernels": int((~gemm).sum()),
                    "fp32_non_tensor_core_kernels": int(sel.sum())},
            note="tensor-core kernels by name (hmma/xmma/wgmma/tensorop/s1688/tf32/bf16/f16/MFMA 'MI..' ...); "
                 "no tensor core: sgemm/simt/gemv/scudnn/winograd ...; split-K reduce and layout helpers are "
                 "neither; ratios are of GEMM+conv kernel time (fp32_non_tensor_core_gemm_ratio: of GEMM time); "
                 "events = longest FP32 non-tensor-core kernels (else longest GEMM/conv kernels)",
        ),
    )  # fmt: skip
    fp32_time = float(dur[fp32].sum())
    return [fact], fp32_time > 0 and fp32_tc >= 0.5 * fp32_time


def _pipe_times(ctx: RankContext, k: _Acts) -> tuple[np.ndarray, np.ndarray] | None:
    """Ascend pipe metrics per kernel of k: (MTE time, AI Core + AI Vector busy time), as
    msprof-analyze's fusible-operator check counts them; None without the columns."""
    kf = ctx.trace.kernels
    mte_cols = ("aic_mte2_time_us", "aiv_mte2_time_us", "aic_fixpipe_time_us", "aiv_mte3_time_us")
    core_cols = ("aicore_time_us", "aiv_time_us")
    if not any(c in kf.columns for c in mte_cols) or not any(c in kf.columns for c in core_cols):
        return None
    rows = k.row[k.kernel]
    if len(rows) != len(k):
        return None

    def col(c: str) -> np.ndarray:
        if c not in kf.columns:
            return np.zeros(len(rows))
        v = kf[c].to_numpy(dtype=float)[rows]
        return np.where(np.isfinite(v), v, 0.0)

    mte = np.maximum(col(mte_cols[0]), col(mte_cols[1])) + np.maximum(col(mte_cols[2]), col(mte_cols[3]))
    return mte, col(core_cols[0]) + col(core_cols[1])


def _fusion(ctx: RankContext, k: _Acts) -> list[Fact]:
    if len(k) < 2:
        return []
    order = np.lexsort((k.ts, k.stream, k.device))
    k = k.take(order)
    cand = np.isin(k.cls, [_CLS_INDEX[c] for c in FUSION_CLASSES])
    if cand.sum() < 2:
        return []
    # token = class + short name, per distinct (kernel name, class)
    pair = k.name_id * len(CLASSES) + k.cls
    uid, inv = np.unique(pair, return_inverse=True)
    labels = np.array([f"{CLASSES[p % len(CLASSES)]}:{short_kernel_name(str(k.names[p // len(CLASSES)]))}"
                       for p in uid], dtype=object)  # fmt: skip
    lab_u, lab_inv = np.unique(labels, return_inverse=True)
    tok = np.where(cand, lab_inv[inv.reshape(-1)], -1).astype(np.int64)
    V = len(lab_u) + 1
    cands: list[tuple[float, int, int, int]] = []  # (total time, count, n, key)
    found: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # n -> (keys, start, key index)
    nk = len(tok)
    for n in FUSION_NGRAMS:
        if nk < n or V**n > 2**62:
            continue
        L = nk - n + 1
        ok = np.ones(L, dtype=bool)
        key = np.zeros(L, dtype=np.int64)
        for j in range(n):
            tj = tok[j : j + L]
            ok &= tj >= 0
            if j:
                ok &= (k.stream[j : j + L] == k.stream[:L]) & (k.device[j : j + L] == k.device[:L])
            key = key * V + np.maximum(tj, 0)
        if not ok.any():
            continue
        starts = np.flatnonzero(ok)
        keys, kinv, counts = np.unique(key[ok], return_inverse=True, return_counts=True)
        kinv = kinv.reshape(-1)
        pre = counts[kinv] >= FUSION_MIN_COUNT  # overlapping count is an upper bound of the real one
        if not pre.any():
            continue
        # occurrences of a sequence may overlap (a run of 10 'add' kernels holds seven 4-grams): count
        # the kernels covered by a sequence's occurrences once, occurrences = covered kernels // n
        sv, kid = starts[pre], kinv[pre]
        found[n] = (keys, sv, kid)
        pairs = np.unique((kid[:, None] * nk + sv[:, None] + np.arange(n)[None, :]).reshape(-1))
        pk, pp = pairs // nk, pairs % nk
        covered = np.bincount(pk, minlength=len(keys))
        times = np.bincount(pk, weights=k.dur[pp], minlength=len(keys))
        occ = covered // n
        good = np.flatnonzero(occ >= FUSION_MIN_COUNT)
        cands.extend((float(times[i]), int(occ[i]), n, int(keys[i])) for i in good)
    if not cands:
        return []
    cands.sort(key=lambda x: (-x[0], -x[2]))
    chosen: list[tuple[float, int, tuple[int, ...], int, int]] = []  # (time, count, tokens, n, key)
    for tt, c, n, kk in cands:
        seq = []
        key_v = kk
        for _ in range(n):
            seq.append(key_v % V)
            key_v //= V
        seq_t = tuple(reversed(seq))
        if any(_same_run(s, cs, seq_t, c) for _, cs, s, _, _ in chosen):
            continue
        chosen.append((tt, c, seq_t, n, kk))
        if len(chosen) >= FUSION_MAX_COUNTED:
            break
    pipes = _pipe_times(ctx, k)
    gap_after = np.zeros(nk)  # idle time between kernel i and kernel i+1 on the same stream
    if nk > 1:
        same = (k.stream[1:] == k.stream[:-1]) & (k.device[1:] == k.device[:-1])
        gap_after[:-1] = np.where(same, np.maximum(0.0, k.ts[1:] - k.end[:-1]), 0.0)
    all_kernels: list[np.ndarray] = []
    all_pairs: list[np.ndarray] = []
    measured = []
    for tt, c, seq_t, n, kk in chosen:
        keys, sv, kid = found[n]
        starts = sv[kid == np.searchsorted(keys, kk)]
        kern = np.unique((starts[:, None] + np.arange(n)[None, :]).reshape(-1))
        inner = np.unique((starts[:, None] + np.arange(n - 1)[None, :]).reshape(-1))  # kernel i of pair (i, i+1)
        all_kernels.append(kern)
        all_pairs.append(inner)
        gap = float(gap_after[inner].sum())
        exec_ratio = tt / (tt + gap) if tt + gap > 0 else 1.0
        mte = core = None
        if pipes is not None:
            mte, core = float(pipes[0][kern].sum()), float(pipes[1][kern].sum())
        mte_ratio = mte / core if (mte is not None and core) else None
        measured.append((gap, exec_ratio, mte if mte_ratio is not None else None, mte_ratio))
    host_flags = [m[1] < FUSION_HOST_BOUND for m in measured]
    mte_flags = [m[3] is not None and m[3] > FUSION_MTE_BOUND for m in measured]
    cov = np.unique(np.concatenate(all_kernels))
    cov_pairs = np.unique(np.concatenate(all_pairs)) if all_pairs else np.zeros(0, dtype=np.int64)
    total = float(k.dur.sum())
    cand_time = float(k.dur[cand].sum())
    seqs = [FusionSequence(kernels=[str(lab_u[i]) for i in s], length_count=len(s), occurrences_count=c,
                           total_time_us=tt, mean_time_us=tt / c,
                           share_of_kernel_time_ratio=_ratio(tt / total) if total else 0.0,
                           gap_us=gap, exec_ratio=_ratio(er), host_bound=hb,
                           mte_us=mte, mte_ratio=mr, mte_bound=(mb if mr is not None else None))
            for (tt, c, s, _, _), (gap, er, mte, mr), hb, mb in zip(chosen, measured, host_flags, mte_flags)][:TOP_FUSION]  # fmt: skip
    return [FusionCandidates(
        rank=ctx.rank, sequences=seqs, candidate_kernels_count=int(cand.sum()), candidate_time_us=cand_time,
        candidate_time_ratio=_ratio(cand_time / total) if total else 0.0,
        min_occurrences_count=FUSION_MIN_COUNT,
        sequences_count=len(chosen), sequences_time_us=float(k.dur[cov].sum()),
        sequences_gap_us=float(gap_after[cov_pairs].sum()),
        host_bound_count=int(sum(host_flags)), mte_bound_count=int(sum(mte_flags)),
        host_bound_threshold_ratio=FUSION_HOST_BOUND, mte_bound_threshold_ratio=FUSION_MTE_BOUND,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[" -> ".join(s.kernels)[:200] for s in seqs],
            counts={"kernels": len(k), "candidate_kernels": int(cand.sum()), "sequence_kernels": len(cov)},
            note="n-grams (n=2..4) of consecutive kernels on one stream, all element-wise/reduction/"
                 "normalisation; ranked by total time; a sequence inside, or shifted by one along, a "
                 "higher-ranked one that occurs about as often is the same run and is skipped; host bound: "
                 "exec_ratio < host_bound_threshold_ratio; MTE bound (Ascend pipe metrics): mte_ratio > "
                 "mte_bound_threshold_ratio (msprof-analyze's fusible-operator thresholds)",
        ),
    )]  # fmt: skip


def _same_run(big: tuple[int, ...], big_count: int, small: tuple[int, ...], small_count: int) -> bool:
    """One contains the other, or they overlap shifted along each other with a similar count: both
    describe the same run of kernels, and only the higher-ranked one is kept."""
    n, m = len(big), len(small)
    if m <= n and any(big[i : i + m] == small for i in range(n - m + 1)):
        return True
    if n < m and any(small[i : i + n] == big for i in range(m - n + 1)):
        return True
    if abs(small_count - big_count) > 0.1 * max(big_count, small_count):
        return False
    for ov in range(max(1, min(n, m) - 1), min(n, m)):
        if big[-ov:] == small[:ov] or small[-ov:] == big[:ov]:
            return True
    return False


# --- operators: FLOPs, kernel attribution, roofline, MFU --------------------------------------
def _outermost_recognised(parent: np.ndarray, depth_max: int, rec: np.ndarray) -> np.ndarray:
    """For each cpu op, the row of its outermost recognised ancestor (itself included), else -1."""
    n = len(parent)
    anc = np.where(rec, np.arange(n), -1)
    cur = parent.copy()
    for _ in range(depth_max + 1):
        live = np.flatnonzero(cur >= 0)
        if not len(live):
            break
        idx = cur[live]
        hit = rec[idx]
        anc[live[hit]] = idx[hit]
        nxt = np.full(n, -1, dtype=np.int64)
        nxt[live] = parent[idx]
        cur = nxt
    return anc


def _launching_op(tr, ops: pd.DataFrame, krow: np.ndarray) -> np.ndarray:
    """cpu_ops row that launched each kernel (rows of tr.kernels); -1 when unknown.

    The kernel's External id names the operator that launched it when that operator encloses the
    launch call on its thread; elsewhere (traces of 2022-early 2024 write the correlation id there,
    which can collide with an unrelated op's id) the innermost op enclosing the launch call."""
    res = np.full(len(krow), -1, dtype=np.int64)
    if not len(krow) or not len(ops):
        return res
    ext_k = tr.kernels["ext_id"].to_numpy()[krow]
    ext_c = ops["ext_id"].to_numpy()
    valid = np.flatnonzero(ext_c >= 0)
    idx = pd.Index(ext_c[valid])
    if not idx.is_unique:
        keep = ~idx.duplicated(keep="last")
        idx, valid = idx[keep], valid[keep]
    pos = idx.get_indexer(ext_k)
    hit = (pos >= 0) & (ext_k >= 0)
    res[hit] = valid[pos[hit]]
    links = tr.links
    lk = links[links["gpu_kind"] == "kernel"] if len(links) else links
    lpos = pd.Index(lk["gpu_idx"].to_numpy()).get_indexer(krow) if len(lk) else np.full(len(krow), -1)
    if len(lk):
        # a match by id counts only when the op holds the launch call (same thread, in its span)
        chk = np.flatnonzero(hit & (lpos >= 0))
        ri = lk["runtime_idx"].to_numpy(np.int64)[lpos[chk]]  # the runtime frame is on the bundle's clock
        lts = tr.runtime["ts"].to_numpy()[ri]
        ltid = tr.runtime["tid"].to_numpy()[ri]
        r = res[chk]
        ok = ((ops["tid"].to_numpy()[r] == ltid) & (ops["ts"].to_numpy()[r] <= lts + 1e-3)
              & (ops["end"].to_numpy()[r] >= lts - 1e-3))  # fmt: skip
        res[chk[~ok]] = -1
        hit[chk[~ok]] = False
    miss = np.flatnonzero(~hit)
    if len(miss) and len(lk):
        lpos = lpos[miss]
        has = lpos >= 0
        if has.any():
            ri = lk["runtime_idx"].to_numpy(np.int64)[lpos[has]]
            res[miss[has]] = _enclosing(ops, tr.runtime["ts"].to_numpy()[ri], tr.runtime["tid"].to_numpy()[ri])
    return res


def _enclosing(ops: pd.DataFrame, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Innermost cpu op on thread ``tid`` with start <= ts < end (vectorised per thread)."""
    res = np.full(len(ts), -1, dtype=np.int64)
    otid = ops["tid"].to_numpy()
    ots = ops["ts"].to_numpy()
    oend = ops["end"].to_numpy()
    parent = ops["parent"].to_numpy()
    maxd = int(ops["depth"].max()) + 1
    for t in np.unique(tid):
        sel = np.flatnonzero(otid == t)
        q = np.flatnonzero(tid == t)
        if not len(sel):
            continue
        order = sel[np.argsort(ots[sel], kind="stable")]
        i = np.searchsorted(ots[order], ts[q], side="right") - 1
        cand = np.where(i >= 0, order[np.clip(i, 0, None)], -1)
        for _ in range(maxd + 1):
            bad = (cand >= 0) & (oend[np.clip(cand, 0, None)] <= ts[q])
            if not bad.any():
                break
            cand[bad] = parent[cand[bad]]
        res[q] = cand
    return res


def _text(cats, code: int) -> str:
    return str(cats[code]) if 0 <= code < len(cats) else ""


def _op_costs(ops: pd.DataFrame, rows: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame, np.ndarray]:
    """(groups, group of each row or -1 when not countable, cost per distinct key, key of each row).

    Shapes are parsed once per distinct (name, input_dims, input_types[, concrete_inputs]) value;
    keys that give the same operator + shape + dtype form one group."""
    conc = "concrete_inputs" in ops.columns and isinstance(ops["concrete_inputs"].dtype, pd.CategoricalDtype)
    cols = ["name", "input_dims", "input_types"] + (["concrete_inputs"] if conc else [])
    codes = [ops[c].cat.codes.to_numpy()[rows].astype(np.int64) for c in cols]
    key = np.stack(codes, axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    cats = [ops[c].cat.categories for c in cols]
    recs = []
    for u in uk:
        texts = [_text(cats[j], int(u[j])) for j in range(len(cols))]
        c = op_cost(*texts)
        if c is None:
            recs.append((texts[0], "", "", "", 0.0, 0.0, True, False, 0, 0, 0, 0))
        else:
            sig = shape_signature(texts[1], texts[2])
            m_, k_, n_ = c.mkn or (0, 0, 0)
            recs.append((texts[0], sig, c.dtype, c.category, c.flops, c.bytes, c.exact, True, c.thin, m_, k_, n_))
    u = pd.DataFrame(recs, columns=["op", "shape", "dtype", "category", "flops", "bytes", "exact", "ok", "thin",
                                    "m", "k", "n"])  # fmt: skip
    gid, groups = pd.factorize(pd.MultiIndex.from_frame(u[["op", "shape", "dtype", "category"]]))
    g = groups.to_frame(index=False)
    g.columns = ["op", "shape", "dtype", "category"]
    g["thin"] = u["thin"].groupby(gid).max().to_numpy()  # a group's shape fixes its thinnest dimension
    row_group = np.where(u["ok"].to_numpy()[inv], gid[inv], -1)
    return g, row_group, u, inv


def _op_analysis(ctx: RankContext, k: _Acts, total_dev: float, dev: DeviceSpec | None, fp32_tf32: bool,
                 n_devices: int, launcher: np.ndarray | None = None) -> list[Fact]:  # fmt: skip
    tr = ctx.trace
    ops = tr.cpu_ops
    if not len(ops):
        return []
    dcats = ops["input_dims"].cat.categories
    if not any(str(c) for c in dcats):
        return []  # shapes not recorded
    rec_vals, ncodes = _cat_apply(ops["name"], is_recognised, dtype=bool)
    if not rec_vals.any():
        return []
    dvals, dcodes = _cat_apply(ops["input_dims"], lambda s: bool(s), dtype=bool)
    rec = rec_vals[ncodes] & dvals[dcodes]
    if not rec.any():
        return []
    parent = ops["parent"].to_numpy()
    top = _outermost_recognised(parent, int(ops["depth"].max()), rec)
    counted = np.flatnonzero((top == np.arange(len(ops))) & _in_windows(ctx, ops["ts"].to_numpy()))
    if not len(counted):
        return []
    groups, row_group, ucost, uinv = _op_costs(ops, counted)
    ok = row_group >= 0
    counted, row_group, uinv = counted[ok], row_group[ok], uinv[ok]
    if not len(counted):
        return []
    ng = len(groups)
    flops_row = ucost["flops"].to_numpy()[uinv]
    bytes_row = ucost["bytes"].to_numpy()[uinv]
    exact_row = ucost["exact"].to_numpy()[uinv]
    gpu = len(k) > 0
    if gpu:
        if launcher is None:
            launcher = _launching_op(tr, ops, k.row)
        owner = np.where(launcher >= 0, top[np.clip(launcher, 0, None)], -1)
        pos = pd.Index(counted).get_indexer(owner)
        att = pos >= 0
        # for the per-kernel analysis (analyzers/compute/kernels.py): each kernel's call and the calls' costs
        ctx.shared["compute_ops"] = {
            "kernel_call": pos, "calls": counted, "flops": flops_row, "bytes": bytes_row, "exact": exact_row,
            "dtype": ucost["dtype"].to_numpy()[uinv],
            "category": ucost["category"].to_numpy()[uinv], "op": ucost["op"].to_numpy()[uinv],
            "mkn": ucost[["m", "k", "n"]].to_numpy(np.int64)[uinv], "shape": ucost["shape"].to_numpy()[uinv],
        }  # fmt: skip
        time_row = np.bincount(pos[att], weights=k.dur[att], minlength=len(counted))
        kern_row = np.bincount(pos[att], minlength=len(counted))
        live = kern_row > 0  # operators on CPU tensors launch nothing: not device work
        compute_time = float(k.dur[k.cls != _CLS_INDEX["communication"]].sum())
        attributed_time = float(k.dur[att].sum())
    else:
        time_row = ops["dur"].to_numpy()[counted]
        kern_row = np.zeros(len(counted), dtype=np.int64)
        live = np.ones(len(counted), dtype=bool)
        compute_time = total_dev
        attributed_time = float(time_row.sum())
    if not live.any():
        return []
    counted, row_group = counted[live], row_group[live]
    flops_row, bytes_row, exact_row = flops_row[live], bytes_row[live], exact_row[live]
    time_row, kern_row = time_row[live], kern_row[live]
    g = groups.copy()
    g["count"] = np.bincount(row_group, minlength=ng)
    g["flops"] = np.bincount(row_group, weights=flops_row, minlength=ng)
    g["bytes"] = np.bincount(row_group, weights=bytes_row, minlength=ng)
    g["time"] = np.bincount(row_group, weights=time_row, minlength=ng)
    g["kernels"] = np.bincount(row_group, weights=kern_row, minlength=ng).astype(np.int64)
    g["inexact"] = np.bincount(row_group, weights=(~exact_row).astype(float), minlength=ng)
    first = np.full(ng, -1, dtype=np.int64)
    first[row_group[::-1]] = counted[::-1]
    g["first_row"] = first
    g = g[g["time"] > 0].sort_values("time", ascending=False, kind="stable").reset_index(drop=True)
    if not len(g):
        return []
    if not gpu:  # for cpu_batch: every operator group's CPU time, FLOPs and thinnest GEMM dimension
        ctx.shared["cpu_op_groups"] = g[["op", "shape", "dtype", "category", "count", "flops", "time", "thin"]].copy()

    def peaks(category: str, dtype: str) -> tuple[str | None, float | None, float | None]:
        if dev is None:
            return None, None, None
        p = dev.matmul_peak(dtype, fp32_tf32) if category in ("gemm", "conv", "attention") else dev.vector_peak()
        bw = dev.hbm_bytes_per_s * n_devices
        return (p[0], p[1] * n_devices, bw) if p else (None, None, bw)

    cls_time = {"memory_bound": 0.0, "compute_bound": 0.0, "underutilised": 0.0, "unclassified": 0.0}
    rows = []
    for r in g.itertuples(index=False):
        pk, pp, bp = peaks(r.category, r.dtype)
        sec = r.time * 1e-6
        p_ach = r.flops / sec
        b_ach = r.bytes / sec
        ai = r.flops / r.bytes if r.bytes > 0 else None
        label = None
        if gpu and pp and bp and ai is not None:
            ridge = pp / bp
            if ai <= ridge and b_ach >= U_THR * bp:
                label = "memory_bound"
            elif ai > ridge and p_ach >= U_THR * pp:
                label = "compute_bound"
            else:
                label = "underutilised"
        cls_time[label or "unclassified"] += float(r.time)
        rows.append((r, label, pk, pp, bp, p_ach, b_ach, ai))

    facts: list[Fact] = []
    ots, oend = ops["ts"].to_numpy(), ops["end"].to_numpy()
    for r, label, pk, pp, bp, p_ach, b_ach, ai in rows[:TOP_OPS]:
        if label is None:
            note = "no roofline class: " + ("CPU-only trace (no device peak)" if not gpu else
                                            "device not in the peak table" if dev is None else
                                            "no peak for this dtype" if not pp else "no bytes")  # fmt: skip
        else:
            note = "FLOPs/bytes rest on an assumption (flops_exact=false)" if r.inexact else None
        fr = int(r.first_row)
        facts.append(OperatorRoofline(
            rank=ctx.rank, operator=str(r.op), category=str(r.category), shape=str(r.shape), dtype=str(r.dtype),
            time_source="device" if gpu else "cpu", calls_count=int(r.count), kernels_count=int(r.kernels),
            time_us=float(r.time), share_of_time_ratio=_ratio(r.time / total_dev) if total_dev else 0.0,
            flops=float(r.flops), bytes=float(r.bytes), flops_exact=not r.inexact,
            achieved_flops_per_s=float(p_ach), achieved_gbps=float(b_ach) / 1e9,
            arithmetic_intensity_flop_per_byte=ai,
            peak_dtype=pk, peak_flops_per_s=pp, peak_gbps=bp / 1e9 if bp else None,
            ridge_point_flop_per_byte=(pp / bp) if (pp and bp) else None,
            compute_utilisation_ratio=_ratio(p_ach / pp) if pp else None,
            bandwidth_utilisation_ratio=_ratio(b_ach / bp) if bp else None,
            roofline_class=label, utilisation_threshold_ratio=U_THR,
            evidence=Evidence(
                time_ranges_us=[(float(ots[fr]), float(oend[fr]))] if fr >= 0 else [],
                events=[str(r.op)], counts={"calls": int(r.count), "kernels": int(r.kernels)}, note=note,
            ),
        ))  # fmt: skip

    # summary and MFU
    tot_flops = float(flops_row.sum())
    wtot = ctx.windows_us
    grp_cat = groups["category"].to_numpy()[row_group]
    grp_dt = groups["dtype"].to_numpy()[row_group]
    floaty = np.isin(grp_dt, list(FLOAT_RANK))
    mmask = np.isin(grp_cat, ["gemm", "conv", "attention"]) & floaty
    pool = mmask if flops_row[mmask].sum() > 0 else floaty
    if flops_row[pool].sum() > 0:
        s = pd.Series(flops_row[pool]).groupby(grp_dt[pool]).sum()
        dom = str(s.idxmax())
    else:
        dom = "unknown"
    peak_key, peak = None, None
    if dev is not None:
        p = dev.matmul_peak(dom, fp32_tf32)
        if p is not None:
            peak_key, peak = p[0], p[1] * n_devices
    inexact = float(flops_row[~exact_row].sum())
    classified = sum(v for kk, v in cls_time.items() if kk != "unclassified")
    facts.append(RooflineSummary(
        rank=ctx.rank, time_source="device" if gpu else "cpu", device=dev.name if dev else None,
        operators_count=len(g), attributed_time_us=attributed_time,
        attributed_time_ratio=_ratio(attributed_time / compute_time) if compute_time else 0.0,
        memory_bound_time_us=cls_time["memory_bound"], compute_bound_time_us=cls_time["compute_bound"],
        underutilised_time_us=cls_time["underutilised"], unclassified_time_us=cls_time["unclassified"],
        memory_bound_ratio=_ratio(cls_time["memory_bound"] / classified) if classified else None,
        compute_bound_ratio=_ratio(cls_time["compute_bound"] / classified) if classified else None,
        underutilised_ratio=_ratio(cls_time["underutilised"] / classified) if classified else None,
        utilisation_threshold_ratio=U_THR,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            counts={"operator_shapes": len(g), "operator_calls": len(counted)},
            note="class ratios are of the time of classified operator groups; attributed_time_ratio = kernel "
                 "time attributed to recognised operators / non-communication kernel time"
                 if gpu else "CPU-only trace: no device peak, no roofline classes",
        ),
    ))  # fmt: skip
    facts.append(ModelFlopsUtilization(
        rank=ctx.rank, flops=tot_flops, flops_per_step=tot_flops / max(1, len(ctx.windows)),
        window_time_us=wtot, achieved_flops_per_s=tot_flops / (wtot * 1e-6) if wtot > 0 else 0.0,
        dominant_dtype=dom, peak_dtype=peak_key, peak_flops_per_s=peak,
        mfu_ratio=_ratio(tot_flops / (wtot * 1e-6) / peak) if (peak and wtot > 0) else None,
        inexact_flops_ratio=_ratio(inexact / tot_flops) if tot_flops else 0.0,
        device=dev.name if dev else None, devices_count=n_devices,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            counts={"operator_calls": len(counted), "steps": len(ctx.windows)},
            note="MFU = FLOPs of recognised operators (outermost recognised operator of each call tree"
                 + (", that launched kernels" if gpu else ", run on the CPU")
                 + ") / (step window time × peak of the dominant matmul dtype × devices)"
                 + ("" if dev else "; device unknown: no peak, no MFU"),
        ),
    ))  # fmt: skip
    return facts


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    act = _device_activities(ctx)
    facts: list[Fact] = []
    fp32_tf32 = False
    k = act.take(act.kernel)
    if len(act):
        facts.extend(_class_facts(ctx, act))
        total_dev = float(act.dur.sum())
    else:
        facts.extend(_cpu_class_facts(ctx) if not len(ctx.trace.kernels) else [])
        ops = ctx.trace.cpu_ops
        total_dev = float(_cpu_self_time(ops)[_in_windows(ctx, ops["ts"].to_numpy())].sum()) if len(ops) else 0.0
    devices = np.unique(k.device[k.device >= 0]) if len(k) else np.zeros(0, dtype=np.int64)
    dev = device_of_trace(ctx.trace, int(devices[0]) if len(devices) else None)
    launcher = None
    if len(k) and len(ctx.trace.cpu_ops):
        launcher = _launching_op(ctx.trace, ctx.trace.cpu_ops, k.row)
    if len(k):
        facts.extend(_short_kernels(ctx, k))
        math = sdpa_math_ops(ctx) if launcher is not None else None
        att = None
        if math is not None:
            on = math[1] | math[2]
            att = (launcher >= 0) & on[np.clip(launcher, 0, None)]
        tc, fp32_tf32 = _tensor_cores(ctx, k, dev, att)
        facts.extend(tc)
        facts.extend(_fusion(ctx, k))
    if len(k) or not len(ctx.trace.kernels):  # GPU trace with kernels in the windows, or CPU-only
        facts.extend(_op_analysis(ctx, k, total_dev, dev, fp32_tf32, max(1, len(devices)), launcher))
    # for the per-kernel analysis (analyzers/compute/kernels.py, run next)
    ctx.shared["compute_kernels"] = {"act": act, "k": k, "device": dev, "fp32_tf32": fp32_tf32,
                                     "devices": max(1, len(devices)), "launcher": launcher}  # fmt: skip
    return facts
