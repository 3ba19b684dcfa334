"""Kernel classes (GEMM, convolution, attention, element-wise, reduction, normalisation, memory,
communication, other): from kernel-name patterns on GPU traces, from the CANN operator type on
Ascend traces, and from the ATen operator name on CPU-only traces. First match wins, in the order
of each classifier's checks."""

from __future__ import annotations

import re
from functools import lru_cache

from .flops import ELEMENTWISE_OPS
from .kernel_names import TRITON_KERNEL, demangle_last, function_head


CLASSES = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "communication", "other")
CLS_INDEX = {c: i for i, c in enumerate(CLASSES)}

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
    m = TRITON_KERNEL.match(name)
    if m:
        return _triton_class(m.group(1), m.group(2))
    if name.startswith("triton"):
        return "other"  # triton__0d1d2d...: no op names in the kernel name
    low = name.lower()
    head = function_head(name)
    short = (demangle_last(head) if head.startswith("_Z") else head).lower()
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


# --- CPU operator classes (CPU-only traces) ---------------------------------------------------
_CPU_GEMM = re.compile(r"^aten::(mm|addmm|_addmm_activation|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm|mv|addmv|"
                       r"dot|vdot|einsum|mkldnn_linear|_mkldnn_linear)$|gemm")  # fmt: skip
_CPU_CONV = re.compile(r"^aten::\w*conv(?!ert)")
_CPU_ATTN = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|_attention")
_CPU_NORM = re.compile(r"^aten::(native_)?(layer|batch|group|instance|rms)_norm|^aten::_batch_norm|batch_norm")
CPU_COMM = re.compile(r"^(c10d|nccl|gloo|record_param_comms)|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
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
    if CPU_COMM.search(name):
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
