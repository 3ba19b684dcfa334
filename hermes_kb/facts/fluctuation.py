"""Facts of the fluctuation analyzer (analyzers/timeline/fluctuation.py): statistics of the step-time
series of each rank and of the job. Formulas: docs/analysis/fluctuation.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us


class StepTimeSeries(Fact):
    """The step-time series of one rank (rank set) or of the job (rank null: per step, the
    slowest rank's step time, over the steps every rank analysed)."""

    kind: Literal["step_time_series"] = "step_time_series"
    series: Literal["window", "device", "job_max"] = Field(
        description="window: the analysed step windows (as the step_time facts); device: step times as the "
        "device runs them (from the first device activity launched in a step to the first of the next), "
        "given "
        "when they differ from the windows by more than 5% of the median; job_max: per step the slowest rank"
    )
    steps_count: int = measure("count", "steps in the series")
    first_step: int | None = None
    last_step: int | None = None
    mean_us: float = us("mean step time")
    std_us: float = us("population standard deviation")
    min_us: float = us("shortest step")
    p50_us: float = us("median step time")
    p95_us: float = us("95th percentile (linear interpolation)")
    max_us: float = us("longest step")
    max_step: int | None = Field(default=None, description="step number of the longest step")
    cv_ratio: float = ratio("coefficient of variation std/mean (values above 1 are reported as 1)")
    spikes_checked: bool = Field(description="false with fewer than 3 steps: no spike test")
    spikes_count: int = measure("count", "steps above their rolling robust threshold", default=0)
    spike_steps: list[int] = Field(
        default_factory=list, description="the spike steps, longest first (at most 10)"
    )
    spike_excess_us: float = us("sum over spikes of (step time - rolling median)", default=0.0)
    median_us: float = us("median used for the spike test over the whole series")
    mad_us: float = us("median absolute deviation over the whole series")
    last_step_drain_us: float = us(
        "how far the last window reaches past its step annotation to the end of the device work launched in "
        "it (work queued in earlier steps lands here when the CPU runs ahead)",
        default=0.0,
    )
    periodicity_checked: bool = Field(description="false with fewer than 8 steps")
    period_steps: int | None = measure(
        "count", "lag (in steps) of the autocorrelation peak, when significant", default=None
    )
    period_acf_ratio: float | None = ratio("autocorrelation at that lag", default=None)
