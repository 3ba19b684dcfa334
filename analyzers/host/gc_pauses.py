"""Garbage collection (``gc_pauses``, rank-level, only when the trace records 'Python GC' events):
the collections in the steps, how much of the step they take, and which of them the program
asked for with an explicit gc.collect()."""

from __future__ import annotations

import re

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import GcPauses

from .. import intervals as iv
from ..context import RankContext
from ..selection import GC_NAME, div, name_is, name_mask, step_pos, window_arrays
from ..whatif.sets import WhatIfSet, register

# an explicit gc.collect() (the built-in frame the Python tracer records)
GC_COLLECT_RE = re.compile(r"^<built-in (method|function) collect( of module object at 0x[0-9a-f]+)?>$")


def gc_pauses(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    py = tr.python
    if not len(py):
        return []
    gm = name_is(py["name"], GC_NAME)
    if not gm.any():
        return []
    ts, dur = py["ts"].to_numpy()[gm], py["dur"].to_numpy()[gm]
    register(ctx, WhatIfSet.of_intervals("gc", "Python garbage collection pauses", py["tid"].to_numpy(np.int64)[gm],
                                         ts, ts + dur))  # fmt: skip
    st = ctx.step_of(ts)
    ok = st >= 0
    if not ok.any():
        return []
    ts, dur, st = ts[ok], dur[ok], st[ok]
    ws, we = window_arrays(ctx)
    steps = np.array([w.step for w in ctx.windows])
    per = np.zeros(len(steps))
    pos, okp = step_pos(steps, st)
    np.add.at(per, pos[okp], dur[okp])
    win = we - ws
    ann = tr.annotations
    dl = ann[(ann["kind"] == "dataloader").to_numpy()]
    in_dl = (
        int(iv.covered_by(ts, iv.union(dl["ts"].to_numpy(), dl["end"].to_numpy())).sum()) if len(dl) else 0
    )
    with_gc = sorted({int(s) for s in st})
    # collections the program asked for: inside a gc.collect() built-in frame on the same thread
    explicit = np.zeros(len(ts), dtype=bool)
    cm = name_mask(py["name"], GC_COLLECT_RE)
    if cm.any():
        gtid = py["tid"].to_numpy()[gm][ok]
        for t in np.unique(gtid):
            on_t = cm & (py["tid"].to_numpy() == t)
            if on_t.any():
                u = iv.union(py["ts"].to_numpy()[on_t], py["end"].to_numpy()[on_t])
                explicit[gtid == t] = iv.covered_by(ts[gtid == t], u)
    top = np.argsort(-dur)[:5]
    return [GcPauses(
        rank=tr.rank, gc_count=len(ts), gc_us=float(dur.sum()), longest_us=float(dur.max()), steps_with_gc=with_gc,
        steps_with_gc_ratio=div(len(with_gc), len(steps)), step_time_ratio=div(float(dur.sum()), float(win.sum())),
        max_step_ratio=float(max(div(per[i], win[i]) for i in range(len(steps)))), in_dataloader_count=in_dl,
        explicit_count=int(explicit.sum()), explicit_ratio=div(float(dur[explicit].sum()), float(dur.sum())),
        evidence=Evidence(time_ranges_us=[(float(ts[i]), float(ts[i] + dur[i])) for i in top], events=[GC_NAME],
                          counts={GC_NAME: len(ts)}),
    )]  # fmt: skip
