"""A rank's part of the job graph: its replay reduced to what joining it with the other ranks at
their collectives needs (docs/analysis/whatif.md, "The job").

In synchronous training a collective ends on every member when the last one has arrived and the
transfer is done; the rank's own graph cannot know when that is. So the rank's replay is run with
every collective's end left as a variable E_i, and each time in it is a *form*: the latest of
``E_i + offset`` over the collectives it depends on, and of a plain time (what nothing after a
collective holds up). What is kept per rank is the form of every collective's arrival (when the
rank could start it), of the analysed span's start and of its end: a few numbers per collective,
where the graph is megabytes. ``analyzers/whatif/job.py`` joins the ranks on them.

A form is a float (no collective before it) or a dict {i: offset} with key -1 for the plain time.
An entry i is dropped where another entry j bounds it: E_j >= arrival_j >= E_i + A_j[i], so
E_j + o_j >= E_i + o_i whenever A_j[i] + o_j >= o_i, whatever the peers do; this keeps forms to a
handful of entries (the collectives still running on other streams).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..context import RankContext
from ..timeline.graph import Graph
from .replay import SimModel, model_of

FREE = -1  # the form key of a plain time (the rank's own clock)
END_TOLERANCE_US = 5.0  # a node ending this close to a collective's end waited for it


@dataclass
class JobAnchors:
    """Where each of the rank's collectives (rows of comm.collectives.rank_collectives) sits in
    its graph: the node it arrives in (and how far into that node), and the nodes whose end is
    the collective's end (the kernel itself; a host thread that waited for it)."""

    rows: np.ndarray  # row of the collectives frame, per anchored collective
    arrive: np.ndarray  # node
    arrive_off: np.ndarray  # µs into the node's own work
    carrier_node: np.ndarray  # node, one per (collective, carrier)
    carrier_of: np.ndarray  # index into rows
    carrier_off: np.ndarray  # recorded end of the node - recorded end of the collective


@dataclass
class RankForms:
    """A rank's replay with every collective's end left free: per anchored collective its arrival
    form; the analysed span's start and end forms (see the module's docstring)."""

    rows: list[int]
    arrival: list
    start: object
    end: object
    chain: bool = False  # no replay graph: the collectives in series (chain_forms)

    def moved(self, delta_us: float) -> RankForms:
        """The same forms on a clock ``delta_us`` later (only plain times move: a collective's end
        moves with the clock)."""
        if delta_us == 0.0:
            return self

        def mv(v):
            if isinstance(v, dict):
                return {k: (o + delta_us if k == FREE else o) for k, o in v.items()}
            return v + delta_us

        return RankForms(self.rows, [mv(a) for a in self.arrival], mv(self.start), mv(self.end), self.chain)


@dataclass
class JobPart:
    """What the advisor keeps of a rank to replay the job with some of its sets shortened: the
    anchors, the anchored collectives' rows (TABLE_COLUMNS, in the anchors' order) and the number
    of analysed steps."""

    anchors: JobAnchors
    table: object  # pandas.DataFrame
    steps: int


TABLE_COLUMNS = ["pg", "pg_ranks", "kind", "source", "step", "ts", "dur", "seq"]


def job_part(shared) -> JobPart | None:
    """The rank's part, from its analysed context's shared data (None without anchors)."""
    an = shared.get("job_anchors")
    coll = shared.get("comm_collectives")
    if an is None or coll is None:
        return None
    # the instance matching numbers each collective among its group's in the step (``occ``): it
    # needs every row of the frame, so the whole frame is kept and the anchors keep their rows
    return JobPart(an, coll[TABLE_COLUMNS].reset_index(drop=True), int(shared.get("job_steps", 1)))


def anchors_of(g: Graph, coll, m: SimModel) -> JobAnchors | None:
    """The anchors of the collectives frame ``coll`` (rows issued in an analysed step) in graph ``g``."""
    if coll is None or not len(coll) or m is None:
        return None
    nS = g.n_host
    n = len(g.start)
    rows, arrive, aoff, cnode, cof, coff = [], [], [], [], [], []
    host = np.arange(nS)
    hst, hen = g.start[:nS], g.end[:nS]
    src = coll["source"].astype(str).to_numpy()
    kidx = coll["kernel_idx"].to_numpy() if "kernel_idx" in coll else np.full(len(coll), -1)
    ts = coll["ts"].to_numpy(float)
    te = ts + coll["dur"].to_numpy(float)
    for j in range(len(coll)):
        if src[j] == "kernel":
            k = int(kidx[j]) if kidx[j] == kidx[j] else -1
            node = nS + k
            if k < 0 or node >= n:
                continue
            rows.append(j)
            arrive.append(node)
            aoff.append(0.0)
            cnode.append(node)
            cof.append(len(rows) - 1)
            coff.append(0.0)
            continue
        # a host collective: the host node running when it was issued, and every host node that
        # overlapped it and ended with it (the calling thread blocked in it, or a thread that waited)
        inside = np.flatnonzero((hst <= ts[j]) & (hen > ts[j]))
        if not len(inside):
            continue
        a = int(inside[np.argmin(hen[inside] - hst[inside])])
        carriers = host[(np.abs(hen - te[j]) <= END_TOLERANCE_US) & (hst < te[j]) & (hen > ts[j])]
        rows.append(j)
        arrive.append(a)
        aoff.append(float(ts[j] - g.start[a]))
        for c in carriers.tolist():
            cnode.append(c)
            cof.append(len(rows) - 1)
            coff.append(float(hen[c] - te[j]))
    if not rows:
        return None
    return JobAnchors(np.asarray(rows, np.int64), np.asarray(arrive, np.int64), np.asarray(aoff),
                      np.asarray(cnode, np.int64), np.asarray(cof, np.int64), np.asarray(coff))  # fmt: skip


# ---- forms: max-plus values over the collectives' ends ------------------------------------------


def _as_dict(v) -> dict:
    return v if isinstance(v, dict) else {FREE: v}


def _prune(d: dict, arrival: dict) -> dict | float:
    """``d`` without the entries another entry bounds (module docstring); a float when only the
    plain time is left."""
    if len(d) > 1:
        keys = list(d)
        for j in keys:
            if j == FREE or j not in d:
                continue
            aj = arrival.get(j)
            if aj is None:
                continue
            aj = _as_dict(aj)
            oj = d[j]
            for i, a in aj.items():
                if i != j and i in d and a + oj >= d[i]:
                    del d[i]
    if len(d) == 1 and FREE in d:
        return d[FREE]
    return d


def vmax(a, b, arrival: dict):
    """The later of two forms (forms are never changed in place, so one may be returned as is)."""
    da, db = isinstance(a, dict), isinstance(b, dict)
    if not da and not db:
        return max(a, b)
    if a is b:
        return a
    if not da:
        a, b, db = b, a, False
    # pruning only keeps forms small (every entry kept is a true lower bound), so it runs only
    # where an entry is new, not where one only moved later
    if not db:  # a plain time against a form: it matters only where it is later than the form's own
        old = a.get(FREE)
        if old is not None and old >= b:
            return a
        d = dict(a)
        d[FREE] = b
        return d if old is not None else _prune(d, arrival)
    d = None
    grew = False
    for k, v in b.items():
        old = a.get(k)
        if old is None or old < v:
            if d is None:
                d = dict(a)
            d[k] = v
            grew = grew or old is None
    if d is None:
        return a
    return _prune(d, arrival) if grew else d


def vadd(a, c: float):
    if c == 0.0:
        return a
    if isinstance(a, dict):
        return {k: v + c for k, v in a.items()}
    return a + c


def evaluate(form, ends, free_shift: float = 0.0) -> float:
    """A form's time with collective i ending at ``ends(i)`` (a callable or a sequence) and plain
    times moved by ``free_shift``."""
    if not isinstance(form, dict):
        return form + free_shift
    get = ends if callable(ends) else ends.__getitem__
    out = float("-inf")
    for k, v in form.items():
        t = v + free_shift if k == FREE else get(k) + v
        out = max(out, t)
    return out


def rank_forms(m: SimModel, an: JobAnchors, shrink: np.ndarray | None = None,
               drop: np.ndarray | None = None) -> RankForms:  # fmt: skip
    """The rank's replay (replay.replay's loop, ``shrink`` and ``drop`` as there) with every
    collective's end left free: the carrier nodes end at E_i + their recorded offset, or at their
    start (their own work was waiting and transfer; the join puts the transfer back)."""
    w = m.own if shrink is None else np.maximum(m.own - shrink, 0.0)
    W = w.tolist()
    S: list = m.start0.tolist()
    E: list = m.end0.tolist()
    started = bytearray(m.n)
    lane, xs, la, lo, xe, xo, sl = m.lane_prev, m.xstart, m.launch, m.launch_off, m.xend, m.xend_off, m.slack
    xe_live = xe if drop is None else [-1 if d else x for x, d in zip(xe, drop.tolist())]
    carrier: dict[int, list[tuple[int, float]]] = {}
    for node, i, off in zip(an.carrier_node.tolist(), an.carrier_of.tolist(), an.carrier_off.tolist()):
        carrier.setdefault(node, []).append((i, off))
    arrive_at: dict[int, list[tuple[int, float]]] = {}
    for i, (node, off) in enumerate(zip(an.arrive.tolist(), an.arrive_off.tolist())):
        arrive_at.setdefault(node, []).append((i, off))
    arrival: dict[int, object] = {}
    ninf = float("-inf")

    def start_of(i: int):
        s = sl[i]
        if s != s:  # anchored at its recorded start
            return S[i]
        r = ninf
        p = lane[i]
        if p >= 0:
            r = E[p]
        p = xs[i]
        if p >= 0:
            v = E[p]
            if r is ninf:
                r = v
            elif type(r) is float and type(v) is float:
                r = r if r >= v else v
            else:
                r = vmax(r, v, arrival)
        return r

    # the loop of replay.replay on forms; plain floats take the plain path (most nodes before the
    # first collective, every node of a rank that has none)
    for i in m.order:
        if not started[i]:
            started[i] = 1
            r = start_of(i)
            s = sl[i]
            if s == s:
                p = la[i]
                if p >= 0:
                    if not started[p]:
                        started[p] = 1
                        sp = sl[p]
                        if sp == sp:
                            S[p] = vadd(start_of(p), sp)
                    v = S[p]
                    c = lo[i]
                    if type(v) is float:
                        v = v + c
                        if r is ninf or (type(r) is float and v >= r):
                            r = v
                        elif type(r) is not float:
                            r = vmax(r, v, arrival)
                    else:
                        v = vadd(v, c)
                        r = v if r is ninf else vmax(r, v, arrival)
                S[i] = r + s if type(r) is float else vadd(r, s)
        si = S[i]
        if i in arrive_at:
            for k, off in arrive_at[i]:
                arrival[k] = vadd(si, min(off, W[i]) if W[i] > 0 else off)
        if i in carrier:
            e = si
            for k, off in carrier[i]:
                e = vmax(e, {k: off}, arrival)
            E[i] = e
            continue
        e = si + W[i] if type(si) is float else vadd(si, W[i])
        p = xe_live[i]
        if p >= 0:
            v = E[p]
            if type(v) is float and type(e) is float:
                v = v + xo[i]
                if v > e:
                    e = v
            else:
                e = vmax(e, vadd(v, xo[i]), arrival)
        E[i] = e
    a, off = m.anchors[0]
    first = vadd(S[a], min(off, max(float(m.end0[a] - m.start0[a]), 0.0))) if m.anchors else 0.0
    last = ninf
    for i in m.last_members.tolist():
        last = E[i] if last == ninf else vmax(last, E[i], arrival)
    if last == ninf:
        last = m.last_end
    return RankForms(rows=an.rows.tolist(), arrival=[arrival.get(k, ninf) for k in range(len(an.rows))],
                     start=first, end=last)  # fmt: skip


def chain_forms(coll, start_us: float, end_us: float) -> RankForms | None:
    """A rank without a replay graph (an Ascend export without its trace view, a trace without
    launch links): its collectives in series, each arriving the recorded gap after the latest one
    that ended before it began, and its steps ending the recorded time after the last one."""
    if coll is None or not len(coll):
        return None
    ts = coll["ts"].to_numpy(float)
    te = ts + coll["dur"].to_numpy(float)
    arrival: list = []
    for k in range(len(ts)):
        before = np.flatnonzero(te <= ts[k])
        j = int(before[np.argmax(te[before])]) if len(before) else -1
        arrival.append({j: float(ts[k] - te[j])} if j >= 0 else float(ts[k]))
    done = np.flatnonzero(te <= end_us)
    last = int(done[np.argmax(te[done])]) if len(done) else -1
    end = {last: float(end_us - te[last])} if last >= 0 else float(end_us)
    return RankForms(rows=list(range(len(ts))), arrival=arrival, start=float(start_us), end=end, chain=True)


def per_rank(ctx: RankContext) -> list:
    """Anchors the rank's collectives in its graph and keeps its unchanged forms (ctx.shared
    ``job_anchors``, ``job_forms``) for the digest; no facts of its own. A rank without a replay
    graph gets its collectives in series (``chain_forms``)."""
    from ..comm.collectives import rank_collectives

    if ctx.shared.get("job_alone"):
        return []
    g: Graph | None = ctx.shared.get("graph")
    m = model_of(ctx)
    if g is None or m is None or not m.anchors:
        if ctx.windows:
            ctx.shared["job_forms"] = chain_forms(rank_collectives(ctx), ctx.windows[0].start_us, ctx.windows[-1].end_us)
            ctx.shared["job_steps"] = len(ctx.windows)
        return []
    coll = rank_collectives(ctx)
    an = anchors_of(g, coll, m)
    if an is None:
        return []
    ctx.shared["job_anchors"] = an
    ctx.shared["job_forms"] = rank_forms(m, an)
    ctx.shared["job_steps"] = len(ctx.windows)
    return []


__all__ = ["FREE", "TABLE_COLUMNS", "JobAnchors", "JobPart", "RankForms", "anchors_of", "evaluate", "job_part", "rank_forms", "vadd", "vmax"]
