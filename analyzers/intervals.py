"""Vectorised interval arithmetic on (start, end) arrays in µs.

A *set* is a pair of sorted numpy arrays of disjoint, non-touching intervals, as returned by
``union``. Everything is numpy: no Python loop over events.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping intervals into a sorted disjoint set (zero-length ones dropped)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new group starts where an interval begins after everything before it has ended
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    group_end = np.append(idx[1:] - 1, len(s) - 1)
    return s[idx], run_end[group_end]


def length(a: Intervals) -> float:
    return float((a[1] - a[0]).sum())


def clip(a: Intervals, lo: float, hi: float) -> Intervals:
    s = np.clip(a[0], lo, hi)
    e = np.clip(a[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def _sweep(a: Intervals, b: Intervals):
    """Elementary segments between all boundaries, with how many intervals of a and b cover each."""
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    na, nb = len(a[0]), len(b[0])
    wa = np.concatenate([np.ones(na), -np.ones(na), np.zeros(2 * nb)])
    wb = np.concatenate([np.zeros(2 * na), np.ones(nb), -np.ones(nb)])
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    ca = np.cumsum(wa[order])[:-1]
    cb = np.cumsum(wb[order])[:-1]
    seg_s, seg_e = pts[:-1], pts[1:]
    return seg_s, seg_e, ca, cb, seg_e > seg_s


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two sets."""
    if not len(a[0]) or not len(b[0]):
        return EMPTY
    s, e, ca, cb, nonempty = _sweep(a, b)
    m = nonempty & (ca > 0) & (cb > 0)
    return union(s[m], e[m])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of a not covered by b."""
    if not len(a[0]) or not len(b[0]):
        return a
    s, e, ca, cb, nonempty = _sweep(a, b)
    m = nonempty & (ca > 0) & (cb <= 0)
    return union(s[m], e[m])


def covered_by(points: np.ndarray, a: Intervals) -> np.ndarray:
    """Boolean: which points fall inside the set (half-open [start, end))."""
    if not len(a[0]):
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(a[0], points, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = points[ok] < a[1][i[ok]]
    return out


def overlap_length(starts, ends, a: Intervals) -> np.ndarray:
    """For each interval (starts[i], ends[i]), how much of it the set a covers (vectorised)."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if not len(a[0]) or not len(starts):
        return np.zeros(len(starts))
    # prefix sums of covered length up to each point
    cum = np.concatenate([[0.0], np.cumsum(a[1] - a[0])])

    def covered_before(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(a[0], x, side="right")  # intervals starting at or before x
        full = cum[np.maximum(i - 1, 0)]
        last_s = a[0][np.maximum(i - 1, 0)]
        last_e = a[1][np.maximum(i - 1, 0)]
        part = np.clip(np.minimum(x, last_e) - last_s, 0, None)
        return np.where(i > 0, full + part, 0.0)

    return np.clip(covered_before(ends) - covered_before(starts), 0, None)
