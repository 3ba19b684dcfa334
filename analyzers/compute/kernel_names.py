"""What a kernel's name says beyond its class: the function name inside a C++ signature or an
Itanium-mangled name, a readable short name, whether it runs on tensor cores, and whether it
computes in FP32."""

from __future__ import annotations

import re
from functools import lru_cache


_I = re.IGNORECASE

TRITON_KERNEL = re.compile(r"^triton_(poi|red|per|tem)_(?:fused_)?(.*?)(?:_\d+)?$")


def function_head(name: str) -> str:
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


def demangle_last(name: str) -> str:
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
    m = TRITON_KERNEL.match(name)
    if m:
        return f"triton_{m.group(1)}:{m.group(2)}"[:60]
    head = function_head(name)
    if head.startswith("_Z"):
        head = demangle_last(head)
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
    head = function_head(name)
    if _AUX.search(demangle_last(head) if head.startswith("_Z") else head):
        return "aux"
    if _NO_TC.search(name):
        return "no_tensor"
    if _TC.search(name):
        return "tensor"
    return "no_tensor"


def is_tf32(name: str) -> bool:
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
    if is_tf32(name):
        return True
    return bool(_FP32.search(name)) and not _LOW.search(name)
