"""Facts of the roofline: FLOPs, bytes and achieved rates against the device's peaks, per operator
shape (analyzers/compute/roofline.py), per kernel (analyzers/compute/kernel_roofline.py), the
rank's MFU, and thin GEMMs on CPU-only traces (analyzers/host/cpu_batch.py); formulas in
docs/analysis/compute.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us
from .classes import KernelClass

RooflineClass = Literal["memory_bound", "compute_bound", "underutilised"]


class OperatorRoofline(Fact):
    """One operator + input shapes + dtype (aggregated over its calls): FLOPs, bytes, achieved rates
    and the paper's roofline class. At most 10 per rank, the longest first."""

    kind: Literal["operator_roofline"] = "operator_roofline"
    operator: str = Field(description="ATen operator name, e.g. aten::addmm")
    category: Literal["gemm", "conv", "attention", "elementwise", "reduction", "memory"]
    shape: str = Field(description="input tensor shapes, e.g. [16,559,1024]x[1024,1024]")
    dtype: str = Field(description="data type of the computation (widest float input): fp32, bf16, fp16, fp8, ...")
    time_source: Literal["device", "cpu"] = Field(description="device: kernel time attributed to the operator; "
                                                            "cpu: operator duration on a CPU-only trace")  # fmt: skip
    calls_count: int = measure("count", "operator calls aggregated")
    kernels_count: int = measure("count", "kernels attributed to these calls")
    time_us: float = us("device time of the attributed kernels (CPU duration on CPU-only traces)")
    share_of_time_ratio: float = ratio("time_us / all device activity time (CPU op self time on CPU-only traces)")
    flops: float = measure("flops", "FLOPs of all calls (analyzers/compute/flops.py)")
    bytes: float = measure("bytes", "bytes read and written by all calls (each operand once)")
    flops_exact: bool = Field(description="false when FLOPs/bytes rest on an assumption (conv stride, causal mask, ...)")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / time")
    achieved_gbps: float = measure("gbps", "bytes / time")
    arithmetic_intensity_flop_per_byte: float | None = measure("flop_per_byte", "flops / bytes (null: no bytes)")
    peak_dtype: str | None = Field(default=None, description="which peak of the device table was used")
    peak_flops_per_s: float | None = measure("flops_per_s", "device peak FLOP/s for this dtype (null: unknown)")
    peak_gbps: float | None = measure("gbps", "device HBM bandwidth (null: unknown)")
    ridge_point_flop_per_byte: float | None = measure("flop_per_byte", "AI* = peak FLOP/s / peak bandwidth")
    compute_utilisation_ratio: float | None = ratio("achieved FLOP/s / peak (capped at 1)")
    bandwidth_utilisation_ratio: float | None = ratio("achieved bandwidth / peak (capped at 1)")
    roofline_class: RooflineClass | None = Field(
        description="memory_bound: AI <= AI* and B >= U_thr*B_peak; compute_bound: AI > AI* and "
        "P >= U_thr*P_peak; underutilised otherwise; null when the device peak is unknown or CPU-only"
    )
    utilisation_threshold_ratio: float = ratio("U_thr used")


class RooflineSummary(Fact):
    """How the time of recognised operators splits over the roofline classes on a rank."""

    kind: Literal["roofline_summary"] = "roofline_summary"
    time_source: Literal["device", "cpu"]
    device: str | None = Field(default=None, description="device from the peak table (null: unknown)")
    operators_count: int = measure("count", "distinct operator + shape + dtype groups with time")
    attributed_time_us: float = us("kernel time attributed to recognised operators")
    attributed_time_ratio: float = ratio("attributed_time_us / non-communication device time")
    memory_bound_time_us: float = us("time of memory-bound groups")
    compute_bound_time_us: float = us("time of compute-bound groups")
    underutilised_time_us: float = us("time of underutilised groups")
    unclassified_time_us: float = us("time of groups without a class (unknown peak)")
    memory_bound_ratio: float | None = ratio("of classified time")
    compute_bound_ratio: float | None = ratio("of classified time")
    underutilised_ratio: float | None = ratio("of classified time (the paper's 'underutilisation' share)")
    utilisation_threshold_ratio: float = ratio("U_thr used")


class ModelFlopsUtilization(Fact):
    """Model FLOPs utilisation of a rank over the analysed steps."""

    kind: Literal["model_flops_utilization"] = "model_flops_utilization"
    flops: float = measure("flops", "FLOPs of recognised operators in the analysed windows")
    flops_per_step: float = measure("flops", "flops / analysed steps")
    window_time_us: float = us("total analysed step window time")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / window time")
    dominant_dtype: str = Field(description="dtype with the most matmul (GEMM/conv/attention) FLOPs")
    peak_dtype: str | None = Field(default=None, description="peak used: tf32 when FP32 matmuls ran on TF32 kernels")
    peak_flops_per_s: float | None = measure("flops_per_s", "device peak for the dominant dtype × devices")
    mfu_ratio: float | None = ratio("achieved_flops_per_s / peak_flops_per_s; null when the device is unknown")
    inexact_flops_ratio: float = ratio("share of the FLOPs that are estimates (conv without stride, attention "
                                       "without the causal flag, reductions)")  # fmt: skip
    device: str | None = None
    devices_count: int = measure("count", "devices with kernels on this rank")


class CpuThinMatmuls(Fact):
    """CPU-only trace: matrix multiplies with a thin dimension (a few rows, typically the batch) and
    what a larger batch would do to the per-sample time, over all analysed steps (step = null).
    Emitted when the analysed steps hold GEMMs whose smallest dimension is at most ``thin_max_rows``.

    Model (docs/analysis/compute.md): at ``batch_factor`` times the batch, the thin GEMMs do
    that many times their FLOPs at no less than their present time, at most the CPU's FMA peak
    (fast end) or ``attainable_ratio`` of the smaller peak the CPU flags allow (slow end); other
    GEMMs grow with the batch; everything else (optimizer, element-wise work on small tensors,
    Python) is taken as fixed per step. Peaks need the CPU model and clock the monitor records,
    so on a bare trace the peak and prediction fields are null."""

    kind: Literal["cpu_thin_matmuls"] = "cpu_thin_matmuls"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    step_us: float = us("window_us / steps_count")
    gemm_us: float = us("time of all GEMM operators (outermost recognised operator, CPU duration)")
    thin_gemm_us: float = us("time of the GEMM groups whose smallest dimension is <= thin_max_rows")
    thin_gemm_ratio: float = ratio("thin_gemm_us / gemm_us")
    thin_share_of_step_ratio: float = ratio("thin_gemm_us / window_us")
    thin_max_rows: int = measure("count", "a GEMM is thin at or below this many rows")
    thin_rows: int = measure("count", "smallest GEMM dimension of the thin groups (time-weighted median)")
    target_rows: int = measure("count", "rows from which CPU GEMM kernels run near their peak")
    batch_factor: float = measure("x", "target_rows / thin_rows: the batch multiple the prediction is for")
    thin_gemm_flops: float = measure("FLOP", "FLOPs of the thin GEMMs in the window")
    thin_achieved_flops_per_s: float = measure("FLOP/s", "thin_gemm_flops / thin_gemm_us")
    other_gemm_us: float = us("time of the GEMMs that are not thin (grow with the batch)")
    cpu_model: str | None = Field(default=None, description="the CPU model the monitor recorded")
    threads_count: int | None = measure("count", "intra-op threads the GEMMs can use (torch threads, at most the usable cores)", default=None)
    attainable_ratio: float = ratio("share of the smaller peak the slow end assumes a 64-row GEMM reaches")
    peak_low_flops_per_s: float | None = measure("FLOP/s", "FP32 FMA peak of the threads, fewest FMA units the flags allow", default=None)
    peak_high_flops_per_s: float | None = measure("FLOP/s", "FP32 FMA peak of the threads, most FMA units the flags allow", default=None)
    thin_utilisation_max_ratio: float | None = ratio(
        "thin_achieved_flops_per_s / peak_low_flops_per_s, at most 1: the highest share of the peak the thin "
        "GEMMs can be reaching (the peak is known only within its range)", default=None
    )
    target_step_fast_us: float | None = us("predicted step at batch_factor x the batch, GEMMs at the high peak", default=None)
    target_step_slow_us: float | None = us("predicted step at batch_factor x the batch, GEMMs at attainable_ratio x the low peak", default=None)
    per_sample_saving_high_us: float | None = us(
        "step_us - target_step_fast_us / batch_factor: time saved per present batch's worth of samples", default=None
    )
    per_sample_saving_low_us: float | None = us("step_us - target_step_slow_us / batch_factor", default=None)


class KernelRoofline(Fact):
    """One kernel (by name) with the FLOPs and bytes it inherits from the operator calls that launched
    it: each call's cost split over its kernels by duration (matrix kernels take a matmul's FLOPs,
    helpers such as split-K reductions none). At most 10 per rank, the longest first."""

    kind: Literal["kernel_roofline"] = "kernel_roofline"
    kernel: str = Field(description="short kernel name (function, or functor of an ATen element-wise kernel)")
    kernel_name: str = Field(description="the kernel's full name (first 200 characters)")
    kernel_class: KernelClass
    operator: str = Field(description="the outermost recognised operator that launched most of its time")
    dtype: str = Field(description="data type of the launching calls (the one with the most time)")
    launches_count: int = measure("count", "launches with FLOPs/bytes attributed")
    time_us: float = us("duration of those launches")
    share_of_time_ratio: float = ratio("time_us / all device activity time")
    mean_duration_us: float = us("time_us / launches_count")
    flops: float = measure("flops", "FLOPs attributed to the launches")
    bytes: float = measure("bytes", "bytes attributed to the launches")
    flops_exact: bool = Field(description="false when a launching call's count rests on an assumption")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / time")
    achieved_gbps: float = measure("gbps", "bytes / time")
    arithmetic_intensity_flop_per_byte: float | None = measure("flop_per_byte", "flops / bytes (null: no bytes)")
    peak_dtype: str | None = Field(default=None, description="which peak of the device table was used")
    peak_flops_per_s: float | None = measure("flops_per_s", "matrix peak of the dtype for GEMM/conv/attention "
                                             "kernels, vector FP32 peak otherwise (null: unknown)")  # fmt: skip
    peak_gbps: float | None = measure("gbps", "device HBM bandwidth (null: unknown)")
    ridge_point_flop_per_byte: float | None = measure("flop_per_byte", "AI* = peak FLOP/s / peak bandwidth")
    compute_utilisation_ratio: float | None = ratio("achieved FLOP/s / peak (capped at 1)")
    bandwidth_utilisation_ratio: float | None = ratio("achieved bandwidth / peak (capped at 1)")
    roofline_class: RooflineClass | None = Field(description="the paper's rule on this kernel's own rates (as "
                                                 "operator_roofline); null when a peak is unknown")  # fmt: skip
    grid_blocks: int | None = measure("count", "median thread blocks per launch (null: not recorded)", default=None)
    sm_fill_ratio: float | None = ratio("time-weighted min(1, blocks / SMs) (null: SM count or grid unknown, or "
                                        "an AMD trace)", default=None)  # fmt: skip
    utilisation_threshold_ratio: float = ratio("U_thr used")


class KernelRooflineSummary(Fact):
    """How the time of the kernels with attributed FLOPs/bytes splits over the roofline classes, judged
    per kernel, and how much of it is starved: long kernels below half of the roof they sit under."""

    kind: Literal["kernel_roofline_summary"] = "kernel_roofline_summary"
    device: str | None = Field(default=None, description="device from the peak table (null: unknown)")
    kernels_time_us: float = us("non-communication kernel time in the analysed windows")
    attributed_time_us: float = us("time of the kernels that inherit FLOPs/bytes from a recognised operator")
    attributed_time_ratio: float = ratio("attributed_time_us / kernels_time_us")
    kernel_names_count: int = measure("count", "distinct kernels with attributed FLOPs/bytes")
    memory_bound_time_us: float = us("time of memory-bound kernels")
    compute_bound_time_us: float = us("time of compute-bound kernels")
    underutilised_time_us: float = us("time of underutilised kernels")
    unclassified_time_us: float = us("time of kernels without a class (unknown peak)")
    memory_bound_ratio: float | None = ratio("of classified time")
    compute_bound_ratio: float | None = ratio("of classified time")
    underutilised_ratio: float | None = ratio("of classified time")
    min_kernel_us: float = us("kernels shorter than this on average are left out of the starved times "
                              "(launch latency, not the roofs, bounds them)")  # fmt: skip
    bandwidth_starved_time_us: float = us("kernels on the memory side (AI <= AI*) of mean duration >= min_kernel_us "
                                          "reaching less than U_thr of the HBM bandwidth")  # fmt: skip
    bandwidth_starved_ratio: float = ratio("bandwidth_starved_time_us / kernels_time_us")
    bandwidth_starved_utilisation_ratio: float | None = ratio(
        "their bytes / (their time x peak bandwidth): the share of the bandwidth they reach together", default=None
    )
    compute_starved_time_us: float = us("GEMM/conv/attention kernels on the compute side (AI > AI*) of mean "
                                        "duration >= min_kernel_us below U_thr of the matrix peak")  # fmt: skip
    compute_starved_ratio: float = ratio("compute_starved_time_us / kernels_time_us")
    utilisation_threshold_ratio: float = ratio("U_thr used")
