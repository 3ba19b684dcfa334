"""What the NPU analyses share: the analysed step windows (or the whole trace when it has none),
the rank's device compute tasks in them (not HCCL) and their union, a column of the task frame
read as text, and a ratio clipped to [0, 1]."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import intervals as iv
from ..context import RankContext


def window_mask(ctx: RankContext, ts: np.ndarray) -> np.ndarray:
    """Which of the times ``ts`` fall in an analysed step (all of them when there are no steps)."""
    if not ctx.windows:
        return np.ones(len(ts), dtype=bool)
    return ctx.step_of(ts) >= 0


def window_us(ctx: RankContext) -> float:
    """Time analysed: the step windows' total, else the trace's span."""
    if ctx.windows:
        return ctx.windows_us
    lo, hi = ctx.trace.time_span()
    return hi - lo


def compute_tasks(ctx: RankContext) -> pd.DataFrame:
    """Device compute tasks (not HCCL) in the analysed windows."""
    k = ctx.trace.kernels
    if not len(k) or "task_type" not in k.columns:
        return k.iloc[0:0]
    k = k[k["task_type"].astype(str) != "HCCL"]
    return k[window_mask(ctx, k["ts"].to_numpy(float))]


def col(k: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` of ``k`` as text (empty strings when ``k`` has none)."""
    return k[name].astype(str) if name in k.columns else pd.Series([""] * len(k), index=k.index)


def compute_union(ctx: RankContext) -> iv.Intervals:
    """Union of the device compute tasks in the analysed windows (``compute_tasks``)."""
    k = compute_tasks(ctx)
    if not len(k):
        return iv.EMPTY
    return iv.union(k["ts"].to_numpy(float), k["end"].to_numpy(float))


def ratio(a, b) -> float:
    """a / b clipped to [0, 1]; 0 when b is not positive."""
    a, b = float(a), float(b)
    return min(max(a / b, 0.0), 1.0) if b > 0 else 0.0


__all__ = ["col", "compute_tasks", "compute_union", "ratio", "window_mask", "window_us"]
