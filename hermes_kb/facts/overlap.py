"""Facts of the overlap analyzer: how host, device compute and communication share each step.

Two families (docs/analysis/overlap.md has every formula):

* ``step_overlap``: hermes' multi-component parallel analysis (after the Hermes paper): each
  step window split exactly into non-overlapped compute, non-overlapped communication,
  non-overlapped host, compute overlapped with communication, compute overlapped with host,
  and free time; plus HolisticTraceAnalysis' temporal breakdown (idle / compute / non-compute)
  measured on the same window. One per analysed step and one aggregate (step = null).
* ``hta_*``: HolisticTraceAnalysis 0.5.0's own definitions over the whole trace (minus the
  last ProfilerStep, as HTA does), for cross-checking against HTA: temporal breakdown,
  communication/computation overlap, idle-time breakdown per stream.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us


class StepOverlap(Fact):
    """Multi-component breakdown of one step window (or, with step = null, of all analysed
    steps together: every ``_us`` field is the sum over the steps, every ratio is recomputed
    from those sums).

    The six components ``compute_only_us + comm_only_us + host_only_us +
    compute_comm_overlap_us + compute_host_overlap_us + free_us`` add up to ``duration_us``.
    """

    kind: Literal["step_overlap"] = "step_overlap"
    start_us: float = us("window start (first analysed step's start for the aggregate)")
    end_us: float = us("window end (last analysed step's end for the aggregate)")
    duration_us: float = us("window length; for the aggregate the sum of the step windows")

    # the exact partition
    compute_only_us: float = us("device compute (kernels other than communication, memcpy, memset) with neither communication nor host work")  # fmt: skip
    comm_only_us: float = us("communication kernels running while no device compute runs (not hidden)")
    host_only_us: float = us("host busy while the device runs nothing")
    compute_comm_overlap_us: float = us("device compute and communication at the same time")
    compute_host_overlap_us: float = us("device compute together with host work, no communication")
    free_us: float = us("nothing running: device idle and host not busy")

    compute_only_ratio: float = ratio("compute_only_us / duration_us")
    comm_only_ratio: float = ratio("comm_only_us / duration_us")
    host_only_ratio: float = ratio("host_only_us / duration_us")
    compute_comm_overlap_ratio: float = ratio("compute_comm_overlap_us / duration_us")
    compute_host_overlap_ratio: float = ratio("compute_host_overlap_us / duration_us")
    free_ratio: float = ratio("free_us / duration_us")

    # the sets themselves
    compute_us: float = us("length of the device compute set C (incl. memcpy/memset)")
    memory_us: float = us("length of the memcpy/memset part of the device activity (included in compute_us)")
    comm_us: float = us("length of the communication set M")
    host_us: float = us("length of the host-busy set H")
    device_busy_us: float = us("length of C ∪ M: any device activity")

    overlap_us: float = us("compute overlapped with communication or host work: |C ∩ (M ∪ H)|")
    overlap_ratio: float | None = ratio(
        "overlap_us / |M ∪ H|: share of communication and host work hidden under device compute "
        "(null without device activity or without communication and host work)",
        default=None,
    )
    comm_hidden_ratio: float | None = ratio(
        "|C ∩ M| / |M|: share of communication hidden under device compute (null without communication)",
        default=None,
    )

    # HolisticTraceAnalysis' temporal breakdown, measured on this window (null without GPU events)
    gpu_idle_us: float | None = us("HTA temporal breakdown on this window: no GPU event (kernel/memcpy/memset/cuda_sync) runs", default=None)  # fmt: skip
    gpu_compute_us: float | None = us("HTA temporal breakdown on this window: union of HTA COMPUTATION events", default=None)  # fmt: skip
    gpu_non_compute_us: float | None = us("HTA temporal breakdown on this window: GPU busy without HTA COMPUTATION", default=None)  # fmt: skip
    gpu_idle_ratio: float | None = ratio("gpu_idle_us / duration_us", default=None)
    gpu_compute_ratio: float | None = ratio("gpu_compute_us / duration_us", default=None)
    gpu_non_compute_ratio: float | None = ratio("gpu_non_compute_us / duration_us", default=None)


class HtaTemporalBreakdown(Fact):
    """HTA 0.5.0 ``get_temporal_breakdown`` for one rank (step = null): the interval runs from
    the first kept GPU event's start to the last one's end, where HTA keeps only the GPU events
    launched before the last ProfilerStep starts."""

    kind: Literal["hta_temporal_breakdown"] = "hta_temporal_breakdown"
    interval_start_us: float = us("first kept GPU event start")
    interval_end_us: float = us("last kept GPU event end")
    kernel_time_us: float = us("interval length (HTA's kernel_time)")
    idle_us: float = us("interval minus the union of all kept GPU events")
    compute_us: float = us("union of the COMPUTATION events")
    non_compute_us: float = us("union of all kept GPU events minus compute_us")
    idle_ratio: float = ratio("idle_us / kernel_time_us (HTA idle_time_pctg / 100)")
    compute_ratio: float = ratio("compute_us / kernel_time_us")
    non_compute_ratio: float = ratio("non_compute_us / kernel_time_us")
    last_step_filter: bool = Field(description="true when HTA's filter (launch before the last ProfilerStep) applied")
    last_step_start_us: float | None = us("start of the last ProfilerStep, when the filter applied", default=None)
    events_count: int = measure("count", "GPU events kept (kernels, memcpy, memset, cuda_sync)")


class HtaCommCompOverlap(Fact):
    """HTA 0.5.0 ``get_comm_comp_overlap`` for one rank (step = null): the share of
    communication time during which computation also runs."""

    kind: Literal["hta_comm_comp_overlap"] = "hta_comm_comp_overlap"
    comm_us: float = us("union of COMMUNICATION kernels (names nccl...Kernel)")
    compute_us: float = us("union of COMPUTATION events")
    overlap_us: float = us("|compute ∩ communication|")
    overlap_ratio: float = ratio("overlap_us / comm_us (HTA comp_comm_overlap_pctg / 100)")
    comm_kernels_count: int = measure("count", "communication kernels kept")


class HtaIdleBreakdown(Fact):
    """HTA 0.5.0 ``get_idle_time_breakdown`` for one stream of one rank (step = null): the gaps
    between consecutive kernels/memcpys/memsets of the stream, by cause."""

    kind: Literal["hta_idle_breakdown"] = "hta_idle_breakdown"
    stream: int = Field(description="CUDA/HIP stream id")
    device: int = Field(description="device of the stream's events (-1 when unknown)")
    threshold_us: float = us("consecutive-kernel delay: a gap shorter than this, not caused by the host, is kernel_wait")
    host_wait_us: float = us("gaps where the next event was launched only after the previous one ended")
    kernel_wait_us: float = us("other gaps shorter than threshold_us (can include small negative gaps, as in HTA)")
    other_us: float = us("the remaining gaps")
    idle_us: float = us("sum of all gaps of the stream")
    host_wait_ratio: float | None = ratio("host_wait_us / idle_us (null when idle_us is 0)", default=None)
    kernel_wait_ratio: float | None = ratio("kernel_wait_us / idle_us", default=None)
    other_ratio: float | None = ratio("other_us / idle_us", default=None)
    host_wait_count: int = measure("count", "gaps counted as host_wait")
    kernel_wait_count: int = measure("count", "gaps counted as kernel_wait")
    other_count: int = measure("count", "gaps counted as other (without the stream's first event)")
    events_count: int = measure("count", "events of the stream")
