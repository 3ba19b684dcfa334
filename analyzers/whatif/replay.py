"""What-if on the dependency graph: shrink the events a fix would shorten and recompute the steps
(docs/analysis/whatif.md).

Analyzers that measure a cause register the events its fix acts on as a ``WhatIfSet`` (host
time intervals on a thread, device activities, and whether the fix removes the waits
themselves, as dropping a synchronisation does); this analyzer, run last, replays the rank's
dependency graph (the critical-path graph: thread and stream order, launches, syncs, event
waits, cross-thread joins) with those events shortened and reports how much shorter the
analysed steps get. What stays hidden under other work is not counted; what the host no longer
blocks on (the device idle behind a sync or a DataLoader stall) is.

The replay is a max-plus schedule: every node keeps its own work and the fixed lag it had after
the predecessor that released it (``slack``), so replaying the unchanged graph gives back the
recorded times exactly. A node waiting for another (a sync call for its kernel, a thread woken
by another) ends when that one ends plus its recorded return latency, or after its own work.
Shortening node weights by d_i shortens the longest chain by at most the sum of d_i over the
original critical path, so a set's removable time never exceeds its time on that path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.whatif import WhatIf
from hermes_kb.core.workers import in_two, two_processes

from .. import intervals as iv
from ..context import RankContext
from ..timeline.graph import Graph
from .sets import WhatIfSet

# the replay runs at f = 0.5 and 1 of each set's time (the curve between them is linear; the
# removable time is concave in the fraction, so interpolating under-states it slightly)
# sets whose time on the critical chain is below this share of the analysed steps are not
# replayed: they cannot remove more than that (under the 1.02x a report shows), and their fact
# carries that bound instead
MIN_CRITICAL_SHARE = 0.02


# ---- the replay model -----------------------------------------------------------------------------


@dataclass
class SimModel:
    """A rank's graph reduced to what the replay needs (plain lists: the replay is a Python loop)."""

    n: int
    n_host: int
    start0: np.ndarray
    end0: np.ndarray
    order: list[int]
    lane_prev: list[int]
    xstart: list[int]  # end-based start edge: device <- other stream; thread's first segment <- other thread
    launch: list[int]  # start-based start edge: device node <- its launch segment
    launch_off: list[float]
    xend: list[int]  # end edge: the node waited for this one (sync, join of a gap)
    xend_off: list[float]  # return latency after the awaited node ended
    own: np.ndarray  # the node's own work (for waiting nodes: what follows the release)
    slack: list[float]  # lag after the latest release; NaN = anchored at its recorded start
    anchors: list[tuple[int, float]]  # per analysed window: (main-thread node, offset of the window start)
    last_members: np.ndarray  # nodes whose end decides the last window's end
    first_start: float
    last_end: float


def build_model(g: Graph, windows, main_tid: int) -> SimModel:
    n, nS = len(g.start), g.n_host
    st, en = g.start, g.end
    idx = np.arange(n)
    lane_prev = g.lane_prev.copy()
    launch = g.launch.copy()
    is_gap = g.is_gap
    host = idx < nS

    # end edges: a sync segment for the device node it waited for, a gap for the thread that woke it
    src = np.where(host & (g.wait >= 0), g.wait, np.where(host & is_gap & (g.join >= 0), g.join, -1))
    src_end = np.where(src >= 0, en[np.clip(src, 0, None)], np.nan)
    blocked = (src >= 0) & (src_end > st) & (src_end <= en + 1e-6)
    xend = np.where(blocked, src, -1)
    xend_off = np.where(blocked, np.maximum(en - src_end, 0.0), 0.0)
    own = np.where(blocked, xend_off, en - st)

    # start edges besides lane order: device event waits / joins; a thread's first segment joined
    xstart = np.where(~host & (g.wait >= 0), g.wait, np.where(host & ~is_gap & (lane_prev < 0) & (g.join >= 0), g.join, -1))

    # launch latency: where the kernel was not queued behind another, the recorded lag after its
    # launch segment began; where it was queued, the median of those (it could not start sooner)
    has_l = launch >= 0
    lag = np.where(has_l, st - st[np.clip(launch, 0, None)], 0.0)
    prev_end = np.where(lane_prev >= 0, en[np.clip(lane_prev, 0, None)], -np.inf)
    lts = np.where(np.isnan(g.launch_ts), st, g.launch_ts)
    # held back by its stream or by the event of another stream it waited for (a kernel after a
    # collective on another stream): not released by its launch, so its lag after the launch
    # is not the launch latency
    x_end = np.where((~host) & (xstart >= 0), en[np.clip(xstart, 0, None)], -np.inf)
    queued = has_l & (np.maximum(prev_end, x_end) > lts)
    free = has_l & ~queued & (lag >= 0)
    med = float(np.median(lag[free])) if free.any() else 5.0
    launch_off = np.where(queued, np.minimum(np.maximum(lag, 0.0), med), np.maximum(lag, 0.0))

    rel = np.full(n, -np.inf)
    rel = np.maximum(rel, prev_end)
    rel = np.maximum(rel, np.where(xstart >= 0, en[np.clip(xstart, 0, None)], -np.inf))
    rel = np.maximum(rel, np.where(has_l, st[np.clip(launch, 0, None)] + launch_off, -np.inf))
    slack = np.where(np.isfinite(rel), st - rel, np.nan)

    # visit by recorded end; among equal ends, every source before the nodes that need its end
    level = np.zeros(n, dtype=np.int64)
    for _ in range(16):
        changed = False
        for src_arr in (lane_prev, xstart, xend):
            d = np.flatnonzero(src_arr >= 0)
            d = d[en[src_arr[d]] >= en[d]]
            want = level[src_arr[d]] + 1
            upd = want > level[d]
            if upd.any():
                np.maximum.at(level, d[upd], want[upd])
                changed = True
        if not changed:
            break
    order = np.lexsort((idx, level, en))

    main = host & (g.tid == main_tid)
    mnodes = np.flatnonzero(main)
    anchors: list[tuple[int, float]] = []
    if len(mnodes) and windows:
        ms = st[mnodes]
        for w in windows:
            i = int(np.searchsorted(ms, w.start_us, side="right")) - 1
            if i < 0 or en[mnodes[i]] <= w.start_us:
                i = min(i + 1, len(mnodes) - 1)
            node = int(mnodes[i])
            anchors.append((node, max(0.0, w.start_us - st[node])))
    last = windows[-1] if windows else None
    if last is not None:
        mem = (main & (st >= last.start_us) & (st < last.end_us)) | (
            ~host & (g.member_ts >= last.start_us) & (g.member_ts < last.cpu_end_us))
        last_members = np.flatnonzero(mem)
    else:
        last_members = np.zeros(0, np.int64)
    first_start = windows[0].start_us if windows else 0.0
    last_end = float(en[last_members].max()) if len(last_members) else (last.end_us if last else 0.0)
    m = SimModel(
        n=n, n_host=nS, start0=st, end0=en, order=order.tolist(), lane_prev=lane_prev.tolist(),
        xstart=xstart.tolist(), launch=launch.tolist(), launch_off=launch_off.tolist(), xend=xend.tolist(),
        xend_off=xend_off.tolist(), own=own, slack=slack.tolist(), anchors=anchors, last_members=last_members,
        first_start=first_start, last_end=last_end,
    )  # fmt: skip
    m.__dict__["_arrays"] = {"lane_prev": lane_prev, "xstart": xstart, "launch": launch, "launch_off": launch_off,
                             "xend": xend, "xend_off": xend_off, "slack": slack}  # fmt: skip
    return m


def _array(m: SimModel, name: str) -> np.ndarray:
    """A list field of the model as the array build_model made it from (a model read back from
    disk converts its list once)."""
    arrays = m.__dict__.setdefault("_arrays", {})
    if name not in arrays:
        arrays[name] = np.asarray(getattr(m, name), dtype=np.float64 if name in ("launch_off", "xend_off", "slack") else np.int64)
    return arrays[name]


def replay(m: SimModel, shrink: np.ndarray | None = None, drop: np.ndarray | None = None) -> tuple[list, list]:
    """Start and end of every node with ``shrink`` µs taken off each node's own work and the waits
    of the ``drop`` nodes removed. Nodes are visited by recorded end; a start needed earlier (a
    kernel's launch segment, a host node: it has no launch edge itself) is computed on demand; a
    predecessor not yet visited (clock skew) counts with its recorded time."""
    w = m.own if shrink is None else np.maximum(m.own - shrink, 0.0)
    W = w.tolist()
    S = m.start0.tolist()
    E = m.end0.tolist()
    started = bytearray(m.n)
    lane, xs, la, lo, xe, xo, sl = m.lane_prev, m.xstart, m.launch, m.launch_off, m.xend, m.xend_off, m.slack
    xe_live = xe if drop is None else [-1 if d else x for x, d in zip(xe, drop.tolist())]
    ninf = float("-inf")
    for i in m.order:
        if not started[i]:
            started[i] = 1
            s = sl[i]
            if s == s:  # not anchored (NaN)
                r = ninf
                p = lane[i]
                if p >= 0:
                    r = E[p]
                p = xs[i]
                if p >= 0 and E[p] > r:
                    r = E[p]
                p = la[i]
                if p >= 0:
                    if not started[p]:  # the launch segment's start, before its own end comes up
                        started[p] = 1
                        sp = sl[p]
                        if sp == sp:
                            rp = ninf
                            q = lane[p]
                            if q >= 0:
                                rp = E[q]
                            q = xs[p]
                            if q >= 0 and E[q] > rp:
                                rp = E[q]
                            S[p] = rp + sp
                    v = S[p] + lo[i]
                    if v > r:
                        r = v
                S[i] = r + s
        e = S[i] + W[i]
        p = xe_live[i]
        if p >= 0:
            v = E[p] + xo[i]
            if v > e:
                e = v
        E[i] = e
    return S, E


def analysed_time(m: SimModel, S: list, E: list) -> float:
    """First analysed window's start to the last one's end, in the replayed schedule."""
    if not m.anchors:
        return 0.0
    a, off = m.anchors[0]
    first = S[a] + min(off, max(E[a] - S[a], 0.0))
    last = max((E[i] for i in m.last_members.tolist()), default=m.last_end)
    return last - first


def baseline_time(m: SimModel) -> float:
    a, off = m.anchors[0]
    return m.last_end - (float(m.start0[a]) + off)


# ---- sets -> per-node amounts -----------------------------------------------------------------------


def node_amounts(g: Graph, s: WhatIfSet, n_kernels: int) -> np.ndarray:
    """µs of each node's time that belongs to the set (its overlap with the set's host intervals
    on the node's thread; the whole duration of its device nodes)."""
    n, nS = len(g.start), g.n_host
    r = np.zeros(n)
    if len(s.host_start):
        htid = g.tid[:nS]
        for t in np.unique(s.host_tid):
            m = s.host_tid == t
            sel = np.flatnonzero(htid == t)
            if len(sel):
                r[sel] = iv.overlap_length(g.start[sel], g.end[sel], iv.union(s.host_start[m], s.host_end[m]))
    dev = np.concatenate([s.kernels[(s.kernels >= 0) & (s.kernels < n_kernels)] + nS,
                          s.memcpy[s.memcpy >= 0] + nS + n_kernels]).astype(np.int64)  # fmt: skip
    dev = dev[dev < n]
    r[dev] = g.end[dev] - g.start[dev]
    if s.launches and len(dev):
        host = launching_host(g, dev)
        r[host] = g.end[host] - g.start[host]
    return np.clip(r, 0.0, None)


def launching_host(g: Graph, dev: np.ndarray) -> np.ndarray:
    """The host segments of the operators that launched only these device nodes (a fused kernel
    replaces their calls: the operator's dispatch and launch go with its kernels). An operator that
    also launched device work outside the set stays, as the fix keeps it; unlinked kernels name no
    operator."""
    nS = g.n_host
    la = g.launch[nS:]
    linked = la >= 0
    if not linked.any():
        return np.zeros(0, np.int64)
    inst_of = g.inst[la[linked]]  # the launching operator of every linked device node
    in_set = np.zeros(len(g.start) - nS, dtype=bool)
    in_set[dev - nS] = True
    ours, other = np.unique(inst_of[in_set[linked]]), np.unique(inst_of[~in_set[linked]])
    pure = np.setdiff1d(ours, other)
    return np.flatnonzero(np.isin(g.inst[:nS], pure) & ~g.is_gap[:nS])


@dataclass
class Chain:
    """The replay's critical chain over the analysed span, as pieces in time order: ``node`` is
    the graph node the piece belongs to; ``slack`` marks the lag between a node's release and its
    start (device idle before a device node, a wait nothing traced explains before a host node)."""

    node: np.ndarray
    start: np.ndarray
    end: np.ndarray
    slack: np.ndarray  # bool


def critical_chain(m: SimModel) -> Chain:
    """Walk back from the end of the last analysed step along the constraint that set each time
    (the latest release of a start, the awaited node of a waiting node's end) to the first step's
    start. The pieces tile [first step start, last step end]; the chain is the longest path of the
    replay model, so shortening nodes by d shortens the span by at most d on it.

    Vectorised: every node has an end state (2i) and a start state (2i + 1); each state's binding
    predecessor is found for all at once and the chain followed by pointer doubling."""
    n = m.n
    empty = Chain(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, bool))
    if not len(m.last_members):
        return empty
    st, en, own, first = m.start0, m.end0, m.own, m.first_start
    lane, xs, la = _array(m, "lane_prev"), _array(m, "xstart"), _array(m, "launch")
    lo, xe, xo = _array(m, "launch_off"), _array(m, "xend"), _array(m, "xend_off")
    anchored = np.isnan(_array(m, "slack"))
    idx = np.arange(n)
    stop = 2 * n  # sentinel state
    # end states: the awaited node's end when it set this end, else this node's start
    end_bound = (xe >= 0) & (en[np.clip(xe, 0, None)] + xo > st + own + 1e-9)
    nxt = np.empty(2 * n + 1, dtype=np.int64)
    nxt[0:2 * n:2] = np.where(end_bound, 2 * np.clip(xe, 0, None), 2 * idx + 1)
    # start states: the latest release (lane, then cross edge, then launch on ties)
    v_lane = np.where(lane >= 0, en[np.clip(lane, 0, None)], -np.inf)
    v_xs = np.where(xs >= 0, en[np.clip(xs, 0, None)], -np.inf)
    v_la = np.where(la >= 0, st[np.clip(la, 0, None)] + lo, -np.inf)
    best = np.argmax(np.stack([v_lane, v_xs, v_la]), axis=0)  # first of equal maxima
    vmax = np.maximum(np.maximum(v_lane, v_xs), v_la)
    to = np.choose(best, [2 * np.clip(lane, 0, None), 2 * np.clip(xs, 0, None), 2 * np.clip(la, 0, None) + 1])
    nxt[1:2 * n:2] = np.where(anchored | ~np.isfinite(vmax), stop, to)
    nxt[stop] = stop
    time = np.empty(2 * n + 1)
    time[0:2 * n:2], time[1:2 * n:2], time[stop] = en, st, -np.inf
    root = 2 * int(m.last_members[np.argmax(en[m.last_members])])
    # states from the root while their time is after the first step's start (pointer doubling)
    seq = np.array([root], dtype=np.int64)
    jump = nxt  # nxt applied 2^k times; one level kept (a fresh 1.6 MB array a level cost page faults)
    k = 0
    while True:
        new = seq[(len(seq) + 1) // 2:] if k else seq[1:]  # the states the last doubling added
        if (new == stop).any() or (time[new] <= first).any() or len(seq) > 2 * n:
            break
        if k:
            jump = jump[jump]
        seq = np.concatenate([seq, jump[seq]])
        k += 1
    cut = (seq == stop) | (time[seq] <= first)
    cut[0] = False
    if cut.any():
        seq = seq[: int(np.argmax(cut)) + 1]  # keep the first state at or before the start
    if len(seq) > 2 * n:  # clock skew made a cycle: keep the first pass
        _, first_pos = np.unique(seq, return_index=True)
        seq = seq[: int(np.sort(first_pos)[-1]) + 1]
    a, b = seq[:-1], seq[1:]
    node_a = a // 2
    is_end = a % 2 == 0
    nodes, ps, pe, slk = [], [], [], []
    # end -> end (awaited) : the return latency after the awaited node; end -> own start: the node
    m1 = is_end
    nodes.append(node_a[m1])
    ps.append(np.where(b[m1] % 2 == 0, en[b[m1] // 2], st[node_a[m1]]))
    pe.append(en[node_a[m1]])
    slk.append(np.zeros(int(m1.sum()), bool))
    # start -> a release: lag after it (the launch segment's own piece first, for a launch)
    m2 = ~is_end & (b != stop)
    sa, sb = node_a[m2], b[m2]
    via_launch = sb % 2 == 1
    rel = np.where(via_launch, st[sb // 2] + lo[sa], en[sb // 2])
    nodes.append(sa)
    ps.append(rel)
    pe.append(st[sa])
    slk.append(np.ones(len(sa), bool))
    nodes.append((sb // 2)[via_launch])
    ps.append(st[(sb // 2)[via_launch]])
    pe.append(rel[via_launch])
    slk.append(np.zeros(int(via_launch.sum()), bool))
    node = np.concatenate(nodes)
    s_ = np.maximum(np.concatenate(ps), first)
    e_ = np.concatenate(pe)
    keep = e_ > s_
    order = np.argsort(s_[keep], kind="stable")
    return Chain(node[keep][order], s_[keep][order], e_[keep][order], np.concatenate(slk)[keep][order])


def critical_weights(chain: Chain, g: Graph) -> np.ndarray:
    """Per node, the share of its own time that lies on the replay's critical chain (0..1)."""
    w = np.zeros(len(g.start))
    own = ~chain.slack
    np.add.at(w, chain.node[own], (chain.end - chain.start)[own])
    dur = g.end - g.start
    return np.clip(np.where(dur > 0, w / np.where(dur > 0, dur, 1.0), (w > 0).astype(float)), 0.0, 1.0)


def model_of(ctx: RankContext) -> SimModel | None:
    """The rank's replay model and its critical chain, built once (ctx.shared)."""
    if "whatif_model" in ctx.shared:
        return ctx.shared["whatif_model"]
    g: Graph | None = ctx.shared.get("graph")
    m = None
    if g is not None and ctx.windows:
        m = build_model(g, ctx.windows, ctx.shared.get("main_tid", -1))
        if not m.anchors:
            m = None
    if m is not None and (len(ctx.trace.kernels) or len(ctx.trace.memcpy)):
        # host against device: on a CPU-only rank every event is host work, scaling it changes no balance
        ctx.shared["whatif_host_scale"] = deflate_profiler(m, ctx.trace.meta.profiler_host_scale)
    ctx.shared["whatif_model"] = m
    ctx.shared["whatif_chain"] = critical_chain(m) if m is not None else None
    return m


PROFILED_SLACK = 0.95  # a host scale above this is left alone
MIN_HOST_SCALE = 0.2


def deflate_profiler(m: SimModel, host_scale: float | None) -> float:
    """Take the profiler's cost off the host events, in place: a capture with Python stacks adds
    tens of microseconds to every operator and Python call, so a GPU job whose device sets the pace
    can look host-bound in its own profile, and a fix that shortens kernels then seems to gain
    nothing. ``host_scale`` is the host's own time per step unprofiled over profiled, as the
    monitor measured it (``profiler_overhead.profiler_host_scale``); every host node's own work is scaled
    by it (at least MIN_HOST_SCALE) and the model is rebased on the replayed schedule, so every
    what-if starts from the run as it ran unprofiled. Returns the scale applied (1.0: none)."""
    if not host_scale or host_scale >= PROFILED_SLACK or not m.anchors:
        return 1.0
    h = max(float(host_scale), MIN_HOST_SCALE)
    host_own = np.zeros(m.n)
    host_own[: m.n_host] = m.own[: m.n_host]
    S, E = replay(m, host_own * (1.0 - h))
    m.own = m.own - host_own * (1.0 - h)
    m.start0, m.end0 = np.asarray(S, dtype=np.float64), np.asarray(E, dtype=np.float64)
    m.last_end = max((E[i] for i in m.last_members.tolist()), default=m.last_end)
    return h


def _drops(m: SimModel, r: np.ndarray, f: float) -> np.ndarray:
    """The nodes of the calls a fraction f of the fix removes, evenly spaced: a call is a run of
    contiguous set nodes on one thread (a blocking copy is a launch part and a waiting part), so
    a call goes whole or stays."""
    cand = np.flatnonzero(r > 0)
    out = np.zeros(m.n, dtype=bool)
    if not len(cand):
        return out
    prev = _array(m, "lane_prev")[cand]
    joined = np.zeros(len(cand), dtype=bool)
    joined[1:] = (prev[1:] == cand[:-1]) & (m.end0[cand[:-1]] >= m.start0[cand[1:]])
    call = np.cumsum(~joined) - 1
    k = np.arange(int(call[-1]) + 1)
    pick = np.floor((k + 1) * f + 1e-9) > np.floor(k * f + 1e-9)
    out[cand[pick[call]]] = True
    return out


def evaluate(m: SimModel, r: np.ndarray, f: float, drop_waits: bool) -> float:
    """µs the analysed steps lose when the set shrinks by the fraction f."""
    drop = _drops(m, r, f) if drop_waits else None
    shrink = r * f
    if drop is not None:
        shrink = np.where(drop, r, 0.0)  # a removed call goes whole; the others stay
    S, E = replay(m, shrink, drop)
    return baseline_time(m) - analysed_time(m, S, E)


def _replayed_points(m: SimModel, amounts: dict[str, np.ndarray], drops: set[str], crit_of: dict[str, float],
                     base: float) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Removed µs at f = 0.5 and 1 of every set worth replaying (critical time at least
    MIN_CRITICAL_SHARE of the steps, or one that drops waits). The whole set is replayed first; the
    half only where it can differ from a line (a set that came off the critical chain whole, with
    nothing else taking over, has no longer path at a smaller fraction either) and where the whole
    removes at least MIN_CRITICAL_SHARE. Each round's replays are independent, so they are split
    over two processes where a core is free (``in_two``): the same numbers, about half the time."""
    if base <= 0:
        return {}
    names = [n for n in amounts if crit_of[n] >= MIN_CRITICAL_SHARE * base or n in drops]
    # an odd first round would leave the second process idle for one replay: it takes the half of
    # the set with the most critical time (the likeliest to be needed) ahead of the second round
    ahead = sorted(names, key=lambda n: -crit_of[n])[: len(names) % 2] if two_processes() else []
    jobs = [(n, 1.0) for n in names] + [(n, 0.5) for n in ahead]
    got = dict(zip(jobs, in_two(lambda j: evaluate(m, amounts[j[0]], j[1], j[0] in drops), jobs)))
    whole = {n: max(0.0, got[(n, 1.0)]) for n in names}
    # the half where it is not replayed: a line, or (the whole removing too little to matter) the bound
    out = {n: (0.5 * (whole[n] if whole[n] >= MIN_CRITICAL_SHARE * base else crit_of[n]), whole[n]) for n in names}
    halves = [n for n in names if whole[n] >= MIN_CRITICAL_SHARE * base
              and (n in drops or whole[n] < crit_of[n] - 1e-6 * base)]  # fmt: skip
    later = [n for n in halves if (n, 0.5) not in got]
    got.update(zip([(n, 0.5) for n in later], in_two(lambda n: evaluate(m, amounts[n], 0.5, n in drops), later)))
    for n in halves:
        out[n] = (max(0.0, got[(n, 0.5)]), whole[n])
    return out


def per_rank(ctx: RankContext) -> list[Fact]:
    sets: dict[str, WhatIfSet] = ctx.shared.get("whatif_sets", {})
    g: Graph | None = ctx.shared.get("graph")
    m = model_of(ctx)
    if not sets or g is None or m is None:
        return []
    base = baseline_time(m)
    h = ctx.shared.get("whatif_host_scale", 1.0)
    # with the profiler's cost taken off the host (deflate_profiler), the steps are the replayed ones
    step_us = base if h < 1.0 else ctx.windows_us
    nK = len(ctx.trace.kernels)
    cw = critical_weights(ctx.shared["whatif_chain"], g)
    # without launch links (a trace recorded without runtime calls) the device's dependence on the
    # host is guessed, so the replay is not trusted for the gains (the advisor falls back)
    linked = bool(g.edges.get("launch")) or len(g.start) == g.n_host
    n_device = len(g.start) - g.n_host
    linked_ratio = min(1.0, g.edges.get("launch", 0) / n_device) if n_device > 0 else 1.0
    amounts: dict[str, np.ndarray] = {}
    for name in sorted(sets):
        r = node_amounts(g, sets[name], nK)
        if r.sum() > 0:
            amounts[name] = r
    crit_of = {name: float((r * cw).sum()) for name, r in amounts.items()}
    drops = {n for n, st in sets.items() if st.drop_waits}
    # deferred (hermes_kb/advisor/on_demand.py): every fact carries its bound until a finding asks
    removed = {} if ctx.shared.get("whatif_defer") else _replayed_points(m, amounts, drops, crit_of, base)
    facts: list[Fact] = []
    for name, r in amounts.items():
        s = sets[name]
        own = float(r.sum())
        crit = crit_of[name]
        overlaps = {}
        if crit > 0:
            for other, r2 in amounts.items():
                if other != name and crit_of[other] > 0:
                    shared = float((np.minimum(r, r2) * cw).sum())
                    if shared >= 0.01 * crit:
                        overlaps[other] = shared
        nodes = np.flatnonzero(r > 0)
        top = nodes[np.argsort(-r[nodes])][:20]
        fact = WhatIf(
            rank=ctx.rank, target=name, description=s.description, drop_waits=s.drop_waits,
            own_us=own, critical_us=min(crit, own), step_us=step_us, replay_base_us=base, profiler_host_scale=h,
            # the bound, where the set is not replayed
            removed_half_us=0.5 * crit, removed_all_us=crit, removed_all_ratio=min(1.0, crit / step_us) if step_us > 0 else 0.0,
            nodes_count=int(len(nodes)), critical_overlaps_us=overlaps, linked=linked, linked_ratio=linked_ratio,
            replayed=False,
            launch_host_us=float(r[: g.n_host].sum()) if s.launches and not len(s.host_start) else 0.0,
            evidence=Evidence(
                time_ranges_us=[(float(g.start[i]), float(g.end[i])) for i in top[:3]],
                events=list(dict.fromkeys(g.names[int(g.name[i])] for i in top))[:5],
                note="dependency-graph replay with the set's events shortened (docs/analysis/whatif.md)",
            ),
        )  # fmt: skip
        facts.append(with_points(fact, *removed[name]) if name in removed else fact)
    ctx.shared["whatif_amounts"] = amounts
    ctx.shared["whatif_drops"] = drops
    ctx.shared["whatif_critical"] = crit_of
    return facts


def with_points(fact: WhatIf, half: float, whole: float) -> WhatIf:
    """The fact with its replayed points (removed µs at f = 0.5 and 1)."""
    step = fact.step_us
    return fact.model_copy(update={"removed_half_us": min(half, whole), "removed_all_us": whole,
                                   "removed_all_ratio": min(1.0, whole / step) if step > 0 else 0.0, "replayed": True})  # fmt: skip


def replay_targets(m: SimModel, amounts: dict[str, np.ndarray], drops: set[str], crit_of: dict[str, float],
                   facts: dict[str, WhatIf]) -> dict[str, WhatIf]:  # fmt: skip
    """The deferred replays of the sets named in ``facts`` (target -> the rank's unreplayed fact):
    the facts the eager analyzer would have made for them, for those worth replaying."""
    pts = _replayed_points(m, {n: amounts[n] for n in facts if n in amounts}, drops, crit_of, baseline_time(m))
    return {n: with_points(facts[n], *p) for n, p in pts.items()}


def removed_at(half_us: float, all_us: float, f: float) -> float:
    """Removable µs at fraction f from the replayed points (0, 0), (0.5, half), (1, all)."""
    f = min(max(f, 0.0), 1.0)
    if f <= 0.5:
        return half_us * f / 0.5
    return half_us + (all_us - half_us) * (f - 0.5) / 0.5


def removed_together(m: SimModel, parts: list[tuple[np.ndarray, float, bool]]) -> float:
    """µs the analysed steps lose when several sets shrink at once, each by its fraction: fixes
    acting on the same events compound (the second removes its share of what the first left),
    so no event's time is counted twice."""
    shrink, drop = together(m, parts)
    S, E = replay(m, shrink, drop)
    return baseline_time(m) - analysed_time(m, S, E)


def together(m: SimModel, parts: list[tuple[np.ndarray, float, bool]]) -> tuple[np.ndarray, np.ndarray | None]:
    """The µs each node loses, and the waits dropped, with several sets shortened at once
    (``removed_together``)."""
    own = m.own
    remain = np.ones(m.n)
    drop = np.zeros(m.n, dtype=bool)
    for r, f, drops in parts:
        if drops:
            d = _drops(m, r, f)
            drop |= d
            frac = np.where(d, 1.0, 0.0)
        else:
            frac = np.where(own > 0, np.minimum(r * f / np.where(own > 0, own, 1.0), 1.0), 0.0)
        remain *= 1.0 - frac
    return own * (1.0 - remain), (drop if drop.any() else None)
