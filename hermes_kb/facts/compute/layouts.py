"""Facts of how tensors are laid out: memory-class time by kind of copy, GEMMs on narrow-alignment
kernels (CUDA) or with inner axes off 256 (Ascend Cube), and element-wise kernels on ATen's
strided path (analyzers/compute/layouts.py, analyzers/compute/npu_tasks.py; docs/analysis/compute.md
"Per kernel")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us

CopyKind = Literal["dtype_cast", "strided_copy", "contiguous_copy", "concat", "fill", "index", "layout_transpose",
                   "host_transfer", "other"]  # fmt: skip


class DeviceCopyKind(Fact):
    """Device time of one kind of data movement (one fact per kind present): memory-class kernels and
    memcpy/memset activities split by what produced them (kernel names, and the dtypes of the launching
    aten::copy_ when shapes were recorded)."""

    kind: Literal["device_copy_kind"] = "device_copy_kind"
    copy_kind: CopyKind = Field(description="dtype_cast: conversions between dtypes; strided_copy: same-dtype copies "
                                "of non-contiguous views (.contiguous(), reshape of a permuted tensor); "
                                "contiguous_copy: plain device copies; concat: torch.cat / stack; fill: zeros, "
                                "fill_, memset; index: gather / scatter / index_select; layout_transpose: "
                                "NCHW<->NHWC conversions around convolutions; host_transfer: host<->device copies")  # fmt: skip
    time_us: float = us("summed duration")
    count: int = measure("count", "activities")
    mean_duration_us: float = us("time_us / count")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    share_of_memory_time_ratio: float = ratio("time_us / memory-class device time")
    top_kernel: str = Field(description="the kernel (short name) with the most time of this kind")
    top_operator: str = Field(default="", description="top-level operator that launched most of this time "
                              "(empty when not known)")  # fmt: skip
    top_operator_shape: str = Field(default="", description="its input shapes, when recorded")
    conv_time_us: float | None = us("layout_transpose only: convolution kernel time beside them", default=None)
    layout_to_conv_ratio: float | None = ratio("layout_transpose only: time_us / (time_us + conv_time_us)",
                                               default=None)  # fmt: skip

    def scope(self) -> str:
        return f"{super().scope()}, {self.copy_kind}"  # one fact per kind: the kind is part of what it covers


class GemmAlignment(Fact):
    """Matrix multiplies whose dimensions are not multiples of what the tensor cores load at once
    (8 elements in 16 bit, 4 in FP32/TF32): cuBLAS/CUTLASS fall back to narrow-alignment kernels
    (``align1``/``align2`` in their names) that run far below the peak."""

    kind: Literal["gemm_alignment"] = "gemm_alignment"
    gemm_time_us: float = us("GEMM kernel time")
    misaligned_time_us: float = us("GEMM kernels with a narrow alignment in their name, or launched by a matmul "
                                   "whose K or N is not a multiple of the alignment")  # fmt: skip
    misaligned_count: int = measure("count", "such kernels")
    misaligned_by_name_us: float = us("the part found by kernel name")
    misaligned_by_shape_us: float = us("the part found from the recorded shapes")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_gemm_time_ratio: float = ratio("misaligned_time_us / gemm_time_us")
    misaligned_utilisation_ratio: float | None = ratio("achieved / peak FLOP/s of the misaligned kernels with "
                                                       "attributed FLOPs (null: none)", default=None)  # fmt: skip
    aligned_utilisation_ratio: float | None = ratio("the same for the other GEMM kernels (null: none)", default=None)
    misaligned_slower: bool | None = Field(default=None, description="misaligned_utilisation_ratio < "
                                           "aligned_utilisation_ratio (null: one of them unknown)")  # fmt: skip
    example_kernel: str = Field(default="", description="the misaligned kernel with the most time")
    example_operator: str = Field(default="", description="a misaligned matmul call: operator")
    example_shape: str = Field(default="", description="its input shapes")
    example_dims: str = Field(default="", description="which dimension is off, e.g. 'K=3601'")


class NpuCubeAlignment(Fact):
    """Ascend MatMul tasks on the AI Core whose inner axes are not multiples of 256 elements (the Cube
    unit's affinity rule of msprof-analyze's AI Core performance check), among the operator + shape
    groups that move at least ``min_group_mb`` of data (that check's filter)."""

    kind: Literal["npu_cube_alignment"] = "npu_cube_alignment"
    cube_time_us: float = us("time of MatMul tasks on the AI Core")
    checked_groups_count: int = measure("count", "operator + input/output shape groups moving at least min_group_mb")
    misaligned_groups_count: int = measure("count", "of them, those with an inner axis not a multiple of 256")
    misaligned_time_us: float = us("time of the misaligned groups' tasks")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_cube_time_ratio: float = ratio("misaligned_time_us / cube_time_us")
    min_group_mb: float = measure("MB", "a group is checked from this much data (inputs + output x 2 bytes, summed)")
    example_operator: str = Field(default="", description="the misaligned group with the most time: task name")
    example_shapes: str = Field(default="", description="its input shapes")


class StridedElementwise(Fact):
    """Arithmetic element-wise kernels on ATen's generic launch path (``elementwise_kernel<...>`` with
    an offset calculator per operand), which ATen takes when an operand is not contiguous (a
    transposed or broadcast view); contiguous operands get the vectorised kernel."""

    kind: Literal["strided_elementwise"] = "strided_elementwise"
    elementwise_time_us: float = us("element-wise class kernel time (copies and casts are memory class, not here)")
    generic_time_us: float = us("element-wise kernels on the generic (non-vectorised) path")
    generic_count: int = measure("count", "such kernels")
    vectorized_time_us: float = us("element-wise kernels on the vectorised / unrolled contiguous paths")
    generic_share_ratio: float = ratio("generic_time_us / elementwise_time_us")
    share_of_device_time_ratio: float = ratio("generic_time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the generic-path kernel (short name) with the most time")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")
