"""Facts of the gradient-bucket search (analyzers/comm/buckets.py): a model of a data-parallel job's
gradient collectives fitted on the trace, checked against the trace's own bucketing, and the
bucket size it recommends. Model and measured error: docs/analysis/buckets.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us


class BucketSearch(Fact):
    """One rank's gradient collectives of one kind and process group, over all analysed steps:
    the tail of communication left after the backward pass, the same tail predicted by a
    simulator of DDP's bucketing for the trace's own buckets, and for each bucket size searched."""

    kind: Literal["bucket_search"] = "bucket_search"
    process_group: str = Field(description="process group name as recorded; 'unknown' when not recorded")
    collective: Literal["all_reduce", "reduce_scatter"] = Field(
        description="all_reduce: DDP's gradient buckets; reduce_scatter: FSDP's per-unit gradient reduction"
    )
    knob: Literal["bucket_cap_mb", "fsdp_unit_size"] = Field(
        description="what sets the bucket size: DDP's bucket_cap_mb, or FSDP's wrapping unit"
    )
    granularity: Literal["parameter", "parameter_scaled", "bucket_even_split", "collective"] = Field(
        description="how the bytes becoming ready during the backward are known: per parameter (AccumulateGrad "
        "shapes summing to the buckets' sizes), per parameter scaled to the buckets' sizes, each bucket split "
        "evenly over its AccumulateGrad events, or per collective only (buckets can only be merged)"
    )
    sizes_known: bool = Field(description="false when the trace records no message sizes: nothing is searched")
    searched: bool = Field(description="true when the model was fitted and the bucket sizes were searched")
    reason: str | None = Field(default=None, description="why nothing was searched")
    steps_count: int = measure("count", "analysed steps with gradient collectives")
    collectives_count: int = measure("count", "gradient collectives in those steps")
    buckets_per_step_count: float = measure("count", "mean gradient collectives per step")
    grads_per_step_count: float = measure(
        "count", "mean gradients (AccumulateGrad events) per step assigned to a bucket; 0 at collective granularity"
    )
    gradient_bytes: float | None = measure("bytes", "mean gradient bytes reduced per step (the gradient collectives' sizes)", default=None)
    mean_bucket_bytes: float | None = measure("bytes", "mean size of the trace's buckets", default=None)
    latency_us: float | None = us("fitted fixed cost of one collective (alpha)", default=None)
    bandwidth_gbps: float | None = measure("gbps", "fitted bandwidth (beta): bytes / (duration - alpha)", default=None)
    fit: Literal["affine", "bandwidth_only"] | None = Field(
        default=None,
        description="affine: duration = alpha + bytes / beta by least squares; bandwidth_only: fewer than two "
        "distinct sizes (or no positive slope), alpha = 0 and beta = total bytes / total time",
    )
    fit_points_count: int = measure("count", "collectives the fit used", default=0)
    fit_error_ratio: float | None = ratio(
        "mean |fitted - measured duration| / mean measured duration over the fitted collectives", default=None
    )
    analysed_us: float = us("summed length of the analysed steps")
    comm_time_us: float = us("summed duration of the gradient collectives")
    measured_exposed_us: float = us(
        "measured: summed over steps, the time the last gradient collective ends after the backward's device work "
        "(the work launched up to the end of the last backward operator) ends"
    )
    measured_exposed_share_ratio: float = ratio("measured_exposed_us / analysed_us")
    predicted_current_us: float | None = us(
        "the simulator's exposed time for the trace's own buckets (same definition as measured_exposed_us)",
        default=None,
    )
    model_error_us: float | None = us("predicted_current_us - measured_exposed_us (signed)", default=None)
    model_error_ratio: float | None = ratio(
        "|model_error_us| / max(measured_exposed_us, 5% of the gradient collectives' time), capped at 1", default=None
    )
    recommended_cap_mb: float | None = measure(
        "MiB", "the bucket size (MiB, as bucket_cap_mb) with the least predicted exposed time (the smallest within 1% or "
        "10 µs per step of it), among explicit sizes of 1..200 MiB and DDP's default",
        default=None,
    )
    recommended_first_bucket_mb: float | None = measure(
        "MiB", "the first bucket's size at the recommendation: the cap itself (an explicit bucket_cap_mb), or 1 MiB "
        "when DDP's default (bucket_cap_mb unset: 1 MiB first bucket, then 25 MiB) does best",
        default=None,
    )
    recommended_buckets_count: float | None = measure(
        "count", "mean buckets per step at the recommended size", default=None
    )
    predicted_best_us: float | None = us("predicted exposed time at the recommended size", default=None)
    predicted_default_us: float | None = us(
        "predicted exposed time at DDP's default bucket_cap_mb = 25", default=None
    )
    saving_us: float | None = us(
        "predicted_current_us - predicted_best_us: what the recommended size removes from the analysed steps "
        "(both from the model, so its bias cancels)",
        default=None,
    )
    saving_low_us: float | None = us(
        "saving_us less the model's error on the trace's own buckets (|model_error_us|), at least 0", default=None
    )
    saving_share_ratio: float | None = ratio("saving_us / analysed_us", default=None)
    curve_us: dict[str, float] = Field(
        default_factory=dict, description="predicted exposed µs (all analysed steps) at a few bucket sizes, by MiB"
    )
