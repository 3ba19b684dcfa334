"""Facts of the precision the device computes in: tensor-core use of GEMM/convolution kernels, FP64
kernels and GradScaler's kernels (analyzers/compute/precision.py; formulas in
docs/analysis/compute.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us


class TensorCoreUsage(Fact):
    """Whether GEMM/convolution kernels use tensor (matrix) cores, from kernel names."""

    kind: Literal["tensor_core_usage"] = "tensor_core_usage"
    gemm_time_us: float = us("GEMM kernel time")
    conv_time_us: float = us("convolution kernel time")
    tensor_core_time_us: float = us("GEMM+conv kernels on tensor/matrix cores")
    non_tensor_core_time_us: float = us("GEMM+conv kernels on CUDA cores / SIMD (sgemm, simt, gemv, scudnn, ...)")
    fp32_non_tensor_core_time_us: float = us("FP32 GEMM+conv kernels not on tensor cores")
    tf32_time_us: float = us("FP32 GEMM+conv kernels on tensor cores (TF32)")
    tensor_core_ratio: float = ratio("tensor_core_time_us / (gemm + conv time)")
    fp32_non_tensor_core_gemm_ratio: float = ratio("FP32 non-tensor-core GEMM time / GEMM time")
    fp32_non_tensor_core_ratio: float = ratio("fp32_non_tensor_core_time_us / (gemm + conv time)")
    fp32_non_tensor_core_gemm_time_us: float = us("FP32 GEMM kernels not on tensor cores", default=0.0)
    tensor_core_removes_low_ratio: float | None = ratio(
        "share of the FP32 CUDA-core GEMM time that tensor-core math removes at the low end, from this device's "
        "peaks: 1 - 2 x FP32 peak / TF32 peak (FP16 where there is no TF32): the tensor-core kernels reaching "
        "half their peak advantage (small or odd shapes); null when the device is not known", default=None)
    tensor_core_removes_high_ratio: float | None = ratio(
        "the same at the high end: 1 - FP32 peak / BF16 (else FP16) tensor-core peak, large GEMMs under "
        "16-bit autocast; null when the device is not known", default=None)


class Fp64DeviceWork(Fact):
    """Kernels that compute in double precision (FP64) on the device."""

    kind: Literal["fp64_device_work"] = "fp64_device_work"
    kernels_count: int = measure("count", "FP64 kernels in the analysed windows")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    fp64_to_fp32_peak_ratio: float | None = measure("ratio", "the device's FP64 / FP32 vector peak (null: device "
                                                    "unknown)", default=None, le=None)  # fmt: skip
    top_kernel: str = Field(description="the FP64 kernel with the most time (short name)")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")


class GradScalerKernels(Fact):
    """Loss-scaling kernels of torch.amp.GradScaler (unscale and inf check, scale update) and the
    precision of the matrix kernels beside them. Emitted when GradScaler kernels ran."""

    kind: Literal["grad_scaler_kernels"] = "grad_scaler_kernels"
    kernels_count: int = measure("count", "_amp_foreach_non_finite_check_and_unscale_ / _amp_update_scale_ kernels")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    bf16_matmul_ratio: float = ratio("share of GEMM/conv/attention kernel time in BF16 kernels (by name)")
    fp16_matmul_ratio: float = ratio("share of GEMM/conv/attention kernel time in FP16 kernels (by name)")
