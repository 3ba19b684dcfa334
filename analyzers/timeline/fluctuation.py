"""Step-time fluctuation: statistics of the step-time series of each rank (``per_rank``, from
the analysed step windows) and of the job (``cross_rank``: per step, the slowest rank's time,
over the steps every rank analysed).

- p50, p95, max, mean, std, coefficient of variation;
- spikes: step i is a spike when t_i > m_i + max(k x 1.4826 x MAD_i, 5% x m_i), with m_i and
  MAD_i the median and median absolute deviation of a centred window of ``ROLL`` steps (the
  whole series when shorter); k = ``SPIKE_K`` (3). Needs at least 3 steps;
- periodicity: the lag (>= 2) of the highest local peak of the autocorrelation of the series
  (winsorised to median ± k x 1.4826 x MAD first), reported when it reaches max(0.3, 2/sqrt(n));
  needs at least 8 steps.

Besides the window series (the analysed step windows, as the step_time facts), a second
``device`` series is reported when the device's own step times (first device activity launched
in a step to the first launched in the next) differ from the windows by more than 5% of the
median step: the CPU runs ahead of the device and the windows then show launch time, not
the device's pace (and the last window absorbs the queued work).

Formulas and choices: docs/analysis/fluctuation.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.fluctuation import StepTimeSeries

from ..context import RankContext

SPIKE_K = 3.0
MAD_SCALE = 1.4826  # MAD x 1.4826 estimates the standard deviation of normal data
ROLL = 9  # steps in the rolling window of the spike test
MIN_REL = 0.05  # a step less than 5% above its local median is never a spike (MAD can be ~0)
MIN_SPIKE_STEPS = 3
MIN_PERIOD_STEPS = 8
MIN_ACF = 0.3
DEVICE_DIFF = 0.05  # report the device series when it differs from the windows by > 5% of the median step


def _rolling_median_mad(x: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(x)
    if n <= window:
        m = float(np.median(x))
        return np.full(n, m), np.full(n, float(np.median(np.abs(x - m))))
    med = np.empty(n)
    mad = np.empty(n)
    h = window // 2
    for i in range(n):  # over steps, not events
        lo = min(max(i - h, 0), n - window)
        seg = x[lo : lo + window]
        m = np.median(seg)
        med[i] = m
        mad[i] = np.median(np.abs(seg - m))
    return med, mad


def _period(x: np.ndarray, k: float = SPIKE_K) -> tuple[int | None, float | None]:
    n = len(x)
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    if mad > 0:  # winsorise: one huge warm-up step would otherwise flatten the whole autocorrelation
        x = np.clip(x, med - k * MAD_SCALE * mad, med + k * MAD_SCALE * mad)
    d = x - x.mean()
    denom = float((d * d).sum())
    if denom <= 0:
        return None, None
    lags = np.arange(1, n // 2 + 1)
    acf = np.array([float((d[:-k] * d[k:]).sum()) / denom for k in lags])  # over lags, not events
    best, best_v = None, -np.inf
    for i in range(1, len(lags)):  # lag >= 2; a local peak (a trend decays from lag 1 and has none)
        v = acf[i]
        if v > acf[i - 1] and (i + 1 >= len(lags) or v >= acf[i + 1]) and v > best_v:
            best, best_v = int(lags[i]), float(v)
    if best is None or best_v < max(MIN_ACF, 2.0 / np.sqrt(n)):
        return None, None
    return best, min(best_v, 1.0)


def series_fact(
    steps: np.ndarray,
    dur: np.ndarray,
    rank: int | None,
    series: str = "window",
    k: float = SPIKE_K,
    note: str = "",
    drain_us: float = 0.0,
) -> StepTimeSeries | None:
    """The StepTimeSeries fact of one series (``steps`` numbers, ``dur`` µs, same order)."""
    steps = np.asarray(steps, dtype=np.int64)
    dur = np.asarray(dur, dtype=np.float64)
    n = len(dur)
    if n == 0:
        return None
    mean = float(dur.mean())
    std = float(dur.std())
    med = float(np.median(dur))
    mad = float(np.median(np.abs(dur - med)))
    spikes: list[int] = []
    excess = 0.0
    if n >= MIN_SPIKE_STEPS:
        m, d = _rolling_median_mad(dur, ROLL)
        thr = m + np.maximum(k * MAD_SCALE * d, MIN_REL * m)
        hit = dur > thr
        order = np.argsort(-dur[hit], kind="stable")
        spikes = steps[hit][order].tolist()
        excess = float((dur[hit] - m[hit]).sum())
    period = acf = None
    if n >= MIN_PERIOD_STEPS:
        period, acf = _period(dur, k)
    imax = int(np.argmax(dur))
    return StepTimeSeries(
        rank=rank,
        series=series,
        steps_count=n,
        first_step=int(steps.min()),
        last_step=int(steps.max()),
        mean_us=mean,
        std_us=std,
        min_us=float(dur.min()),
        p50_us=med,
        p95_us=float(np.percentile(dur, 95)),
        max_us=float(dur.max()),
        max_step=int(steps[imax]),
        cv_ratio=float(min(std / mean, 1.0)) if mean > 0 else 0.0,
        spikes_checked=n >= MIN_SPIKE_STEPS,
        spikes_count=len(spikes),
        spike_steps=spikes[:10],
        spike_excess_us=excess,
        median_us=med,
        mad_us=mad,
        last_step_drain_us=max(drain_us, 0.0),
        periodicity_checked=n >= MIN_PERIOD_STEPS,
        period_steps=period,
        period_acf_ratio=acf,
        evidence=Evidence(
            counts={"steps": n, "spikes": len(spikes)},
            events=[f"ProfilerStep#{s}" for s in spikes[:3]],
            note=(
                f"spike: t > rolling median + max({k:g} x 1.4826 x MAD, {MIN_REL:.0%} of the median), window "
                f"{ROLL} steps; period: autocorrelation peak at lag >= 2 of the winsorised series "
                f"reaching max({MIN_ACF}, 2/sqrt(n))" + (f"; {note}" if note else "")
            ),
        ),
    )


def _series(ctx: RankContext) -> tuple[np.ndarray, np.ndarray]:
    w = ctx.windows
    return np.array([x.step for x in w], dtype=np.int64), np.array(
        [x.duration_us for x in w], dtype=np.float64
    )


def device_series(ctx: RankContext) -> np.ndarray | None:
    """Step times as the device runs them: d_i = start of the earliest device activity launched
    in window i; time_i = d_(i+1) - d_i, and for the last step its window end (the end of the
    device work launched in it, or of the step annotation if later) minus d_last. None when
    some window launched nothing."""
    links = ctx.trace.links
    if not len(links) or not ctx.windows:
        return None
    launch = links["launch_ts"].to_numpy(float)
    gpu_ts = links["gpu_ts"].to_numpy(float)
    step = ctx.step_of(launch)
    ok = step >= 0
    if not ok.any():
        return None
    starts = pd.Series(gpu_ts[ok]).groupby(step[ok]).min()
    want = [w.step for w in ctx.windows]
    if not set(want) <= set(starts.index.tolist()):
        return None
    d = starts.loc[want].to_numpy(float)
    return np.diff(np.append(d, max(ctx.windows[-1].end_us, d[-1])))


def per_rank(ctx: RankContext) -> list:
    steps, dur = _series(ctx)
    if not len(dur):
        return []
    last = ctx.windows[-1]
    drain = last.end_us - max(last.cpu_end_us, last.start_us)
    out = [series_fact(steps, dur, ctx.rank, note=f"steps from {ctx.step_source}", drain_us=drain)]
    dev = device_series(ctx)
    if dev is not None and np.max(np.abs(dev - dur)) > DEVICE_DIFF * float(np.median(dur)):
        out.append(
            series_fact(
                steps,
                dev,
                ctx.rank,
                series="device",
                note="device series: from the first device activity launched in a step to the first "
                "launched in the next",
            )
        )
    for f in out:
        f.evidence.time_ranges_us = [ctx.span]
    return out


def cross_rank(digests: dict, facts: list) -> list:
    """From the ranks' digests (comm/digest.py): only their step windows are read."""
    series = {r: _series(d) for r, d in digests.items() if d.windows}
    if len(series) < 2:
        return []
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in series.values())))
    if not common:
        return []
    cols = []
    for s, d in series.values():
        first = {}
        for st, du in zip(s.tolist(), d.tolist()):  # steps, not events
            first.setdefault(st, du)
        cols.append([first[c] for c in common])
    table = np.array(cols)  # ranks x steps
    worst = table.max(axis=0)
    f = series_fact(
        np.array(common),
        worst,
        None,
        series="job_max",
        note=f"job series: per step the slowest of {len(series)} ranks, over {len(common)} common steps",
    )
    return [f] if f is not None else []
