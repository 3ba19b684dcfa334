"""Gradient-bucket fusion search (the Hermes paper's Appendix E, for PyTorch DDP and FSDP).

Per rank, for the gradient collectives of each process group and kind (``all_reduce``: DDP's
buckets; ``reduce_scatter``: FSDP's units), over the analysed steps:

1. **Which collectives**: all_reduce / reduce_scatter kernels whose issuing host operation (the
   ``record_param_comms`` op, else the launch call) lies inside a backward operator
   (``autograd::engine::evaluate_function: ...``, e.g. DDP's hook inside AccumulateGrad).
2. **When each gradient is ready**: each ``AccumulateGrad`` of the step is one gradient, ready on
   the host at the end of its inner ``torch::autograd::AccumulateGrad`` op (h); on the device it
   can be reduced once the work launched before h has run: r = max(h, D(h)), D(h) = the latest
   end of the non-communication device work launched at or before h. Each gradient belongs to the
   first bucket issued after it. Its bytes: its shape (record_shapes) x the element size, scaled
   so that a bucket's gradients add up to the bucket's recorded size; without shapes, the bucket's
   size split evenly over its gradients; without AccumulateGrad events (compiled autograd, FSDP2),
   the collectives themselves are the units (buckets can then only be merged).
3. **Cost of a bucket**: alpha + bytes / beta, both fitted by least squares on the trace's own
   gradient collectives (duration against recorded size).
4. **Simulator**: buckets fill in ready order and close once they hold at least the cap (DDP's
   rule; DDP's first bucket closes at 1 MiB); a bucket is launched when its last gradient is
   ready; the communication stream runs them one after the other. Exposed = how long after the
   backward's device work ends (E = D(end of the last backward operator)) the last bucket ends.
5. **Check and search**: the simulator on the trace's own buckets is compared with the measured
   exposed time (the last gradient collective's end - E, per step); bucket sizes of 1..200 MiB
   are searched and the smallest with the least predicted exposed time is recommended.

Without recorded message sizes nothing is fitted (``searched`` false, with the reason).
Model, assumptions and measured error: docs/analysis/buckets.md.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.buckets import BucketSearch

from .comm import _issue_time
from ..context import RankContext
from ..selection import name_mask

MIB = 1024 * 1024
FIRST_BUCKET_BYTES = 1 * MIB  # DDP's dist._DEFAULT_FIRST_BUCKET_BYTES: the first bucket (in ready order)
DEFAULT_CAP_MB = 25  # DDP's default bucket_cap_mb
CAPS_MB = tuple(range(1, 201))  # searched bucket sizes, MiB
CURVE_MB = (1, 5, 10, 25, 50, 100, 200)
# predicted exposed times closer than this to the minimum count as equal (the smallest cap wins):
# below the model's resolution (it rounds nothing, but its inputs are µs timestamps and a fit)
TIE_RATIO = 0.01
TIE_US_PER_STEP = 10.0
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
_BACKWARD_RE = re.compile("^" + re.escape(BACKWARD_PREFIX))
ACCUMULATE_TOP = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
ACCUMULATE_INNER = "torch::autograd::AccumulateGrad"
GRAD_KINDS = ("all_reduce", "reduce_scatter")
# element size by the names the profiler records (Input type of the op, dtype of record_param_comms)
DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::float": 4, "double": 8, "float64": 8, "c10::half": 2, "half": 2, "float16": 2,
    "c10::bfloat16": 2, "bfloat16": 2, "long int": 8, "int64": 8, "long": 8, "int": 4, "int32": 4,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "unsigned char": 1, "signed char": 1, "bool": 1, "byte": 1,
}  # fmt: skip
GRANULARITY_ORDER = ("parameter", "parameter_scaled", "bucket_even_split", "collective")


# ----------------------------------------------------------------------------- the simulator


def cap_boundaries(sizes: np.ndarray, cap_bytes: float, first_bytes: float | None) -> np.ndarray:
    """Indices of the last unit of each bucket when units (in ready order) fill buckets that close
    once they hold at least the limit: ``first_bytes`` for the first bucket (DDP's 1 MiB; None =
    the cap), ``cap_bytes`` after. The last bucket takes what is left."""
    n = len(sizes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.cumsum(np.asarray(sizes, dtype=float))
    out = []
    base = 0.0
    limit = first_bytes if first_bytes is not None else cap_bytes
    j = -1
    while j < n - 1:
        # first unit at which the bucket (units j+1..k) reaches the limit
        k = int(np.searchsorted(cum, base + limit - 1e-9, side="left"))
        k = min(max(k, j + 1), n - 1)
        out.append(k)
        base = cum[k]
        j = k
        limit = cap_bytes
    return np.asarray(out, dtype=np.int64)


def simulate(ready: np.ndarray, sizes: np.ndarray, bounds: np.ndarray, backward_end: float, alpha: float,
             beta: float) -> tuple[float, np.ndarray, np.ndarray]:  # fmt: skip
    """Serial communication stream: bucket b (units after the previous bound up to ``bounds[b]``)
    starts when its last unit is ready and the previous bucket has ended, and lasts
    ``alpha + bytes / beta`` (beta in bytes per µs). Returns (exposed, starts, ends): exposed =
    how long after ``backward_end`` the last bucket ends (0 when it ends before)."""
    cum = np.cumsum(np.asarray(sizes, dtype=float))
    prev = np.concatenate([[0.0], cum[bounds[:-1]]]) if len(bounds) else np.zeros(0)
    nbytes = cum[bounds] - prev if len(bounds) else np.zeros(0)
    starts = np.empty(len(bounds))
    ends = np.empty(len(bounds))
    free = -math.inf
    for b, (j, nb) in enumerate(zip(bounds, nbytes)):
        s = max(float(ready[j]), free)
        free = s + alpha + float(nb) / beta
        starts[b], ends[b] = s, free
    exposed = max(0.0, free - backward_end) if len(bounds) else 0.0
    return exposed, starts, ends


def fit_cost(sizes: np.ndarray, durs: np.ndarray) -> tuple[float, float, str, int]:
    """duration = alpha + bytes / beta by least squares (alpha >= 0, beta > 0; beta in bytes/µs),
    on the shortest duration of each distinct size: a rank that arrives first waits inside the
    collective for the others, which only ever adds time, so the least of repeated measurements of
    one bucket is the closest to its cost. Fewer than two distinct sizes, or no positive slope:
    alpha = 0, beta = total bytes / total time. Returns (alpha, beta, fit, points used)."""
    df = pd.DataFrame({"x": np.asarray(sizes, dtype=float), "y": np.asarray(durs, dtype=float)})
    low = df.groupby("x", sort=True)["y"].min()
    x, y = low.index.to_numpy(float), low.to_numpy(float)
    n = len(x)
    if len(np.unique(x)) >= 2:
        slope, icpt = np.polyfit(x, y, 1)
        if slope > 0 and icpt >= 0:
            return float(icpt), float(1.0 / slope), "affine", n
        if slope > 0:  # a negative intercept: through the origin instead
            s0 = float((x * y).sum() / (x * x).sum())
            if s0 > 0:
                return 0.0, 1.0 / s0, "affine", n
    return 0.0, float(x.sum() / max(y.sum(), 1e-9)), "bandwidth_only", n


# ----------------------------------------------------------------------------- reading the trace


def _top_ops(ctx: RankContext) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per thread, its top-level CPU ops sorted by start: (start, end, row index)."""
    cached = ctx.shared.get("buckets_top_ops")
    if cached is not None:
        return cached
    ops = ctx.trace.cpu_ops
    top = ops[ops["depth"].to_numpy() == 0]
    out = {}
    for tid, g in top.groupby("tid", sort=False):
        g = g.sort_values("ts")
        out[int(tid)] = (g["ts"].to_numpy(float), g["end"].to_numpy(float), g.index.to_numpy(np.int64))
    ctx.shared["buckets_top_ops"] = out
    return out


def _enclosing_top(ctx: RankContext, tids: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Row index of the top-level op on thread ``tids[i]`` that encloses ``ts[i]`` (-1 when none)."""
    tops = _top_ops(ctx)
    out = np.full(len(ts), -1, dtype=np.int64)
    for i, (tid, t) in enumerate(zip(tids, ts)):
        arr = tops.get(int(tid))
        if arr is None:
            continue
        s, e, idx = arr
        k = int(np.searchsorted(s, t, side="right")) - 1
        if k >= 0 and e[k] >= t:
            out[i] = idx[k]
    return out


def _launches(ctx: RankContext, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per link of device activities of ``kind`` (kernel / memcpy): (row in that frame, launch
    time, launch thread, External id). Times come from the runtime frame (on the bundle's clock),
    not from the links' own copy of them."""
    links = ctx.trace.links
    rt = ctx.trace.runtime
    if not len(links) or not len(rt):
        z = np.zeros(0, dtype=np.int64)
        return z, np.zeros(0), z, z
    lk = links[links["gpu_kind"].astype(str).to_numpy() == kind]
    ri = lk["runtime_idx"].to_numpy(np.int64)
    ok = (ri >= 0) & (ri < len(rt))
    ri = ri[ok]
    return (lk["gpu_idx"].to_numpy(np.int64)[ok], rt["ts"].to_numpy(float)[ri], rt["tid"].to_numpy(np.int64)[ri],
            lk["ext_id"].to_numpy(np.int64)[ok])  # fmt: skip


def _issue_points(ctx: RankContext, c: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(thread, time) where each collective was issued: its record_param_comms op; else the CPU op
    whose External id its kernel's link names (torch_npu launches from a task-queue thread, the
    op that issued the work keeps the id); else the launch call of its kernel; thread -1 when none
    is known."""
    t = ctx.trace
    ops = t.cpu_ops
    tid = np.full(len(c), -1, dtype=np.int64)
    ts = np.full(len(c), np.nan)
    cidx = c["cpu_idx"].to_numpy(np.int64)
    ok = (cidx >= 0) & (cidx < len(ops))
    tid[ok] = ops["tid"].to_numpy(np.int64)[cidx[ok]]
    ts[ok] = ops["ts"].to_numpy(float)[cidx[ok]]
    gidx, lts, ltid, ext = _launches(ctx, "kernel")
    if len(gidx) and (~ok).any():
        kidx = c["kernel_idx"].to_numpy(np.int64)
        by_idx = {int(g): i for i, g in enumerate(gidx)}
        first_op = ops[ops["ext_id"].to_numpy() >= 0].drop_duplicates("ext_id")
        op_of = dict(zip(first_op["ext_id"].to_numpy(np.int64), first_op.index.to_numpy(np.int64)))
        otid, ots = ops["tid"].to_numpy(np.int64), ops["ts"].to_numpy(float)
        for i in np.flatnonzero(~ok):
            j = by_idx.get(int(kidx[i]))
            if j is None:
                continue
            row = op_of.get(int(ext[j])) if ext[j] >= 0 else None
            if row is not None and otid[row] != ltid[j]:
                tid[i], ts[i] = otid[row], ots[row]
            else:
                tid[i], ts[i] = ltid[j], lts[j]
    return tid, ts


def gradient_collectives(ctx: RankContext) -> pd.DataFrame:
    """The rank's gradient collectives in the analysed steps: all_reduce / reduce_scatter kernels
    issued inside a backward operator. Columns: step, issue (host time), ts, end, dur, bytes (-1
    unknown), pg, kind, name."""
    t = ctx.trace
    c = t.collectives
    cols = ["step", "issue", "ts", "end", "dur", "bytes", "pg", "kind", "name"]
    if not len(c):
        return pd.DataFrame({k: [] for k in cols})
    kind = c["kind"].astype(str).to_numpy()
    keep = (np.isin(kind, GRAD_KINDS) & (c["source"].astype(str).to_numpy() == "kernel")
            & (c["collective"].astype(str).to_numpy() != "wait"))  # fmt: skip
    if not keep.any():
        return pd.DataFrame({k: [] for k in cols})
    anchor = _issue_time(ctx)
    step = ctx.step_of(anchor)
    keep &= step >= 0
    sel = c[keep]
    if not len(sel):
        return pd.DataFrame({k: [] for k in cols})
    tid, its = _issue_points(ctx, sel)
    top = _enclosing_top(ctx, tid, its)
    names = t.cpu_ops["name"].astype(str).to_numpy()
    backward = np.array([i >= 0 and names[i].startswith(BACKWARD_PREFIX) for i in top], dtype=bool)
    sel = sel[backward]
    if not len(sel):
        return pd.DataFrame({k: [] for k in cols})
    pg = sel["pg_name"].astype(str).to_numpy()
    out = pd.DataFrame({
        "step": step[keep][backward],
        "issue": its[backward],
        "ts": sel["ts"].to_numpy(float),
        "end": sel["end"].to_numpy(float),
        "dur": sel["dur"].to_numpy(float),
        "bytes": np.maximum(sel["in_bytes"].to_numpy(np.int64), sel["out_bytes"].to_numpy(np.int64)),
        "pg": np.where(pg != "", pg, "unknown"),
        "kind": sel["kind"].astype(str).to_numpy(),
        "name": sel["name"].astype(str).to_numpy(),
    })  # fmt: skip
    return out.sort_values("issue", kind="stable").reset_index(drop=True)


def _device_drain(ctx: RankContext):
    """D(h): the latest end of the non-communication device work (kernels, memcpy/memset) launched
    at or before host time h (work without a launch link counts from its own start)."""
    t = ctx.trace
    k = t.kernels
    comm = t.collectives["kernel_idx"].to_numpy(np.int64) if len(t.collectives) else np.zeros(0, np.int64)
    mask = np.ones(len(k), dtype=bool)
    comm = comm[(comm >= 0) & (comm < len(k))]
    mask[comm] = False
    parts_l, parts_e = [], []
    for frame, kind, m in ((k, "kernel", mask), (t.memcpy, "memcpy", np.ones(len(t.memcpy), dtype=bool))):
        if not len(frame):
            continue
        launch = frame["ts"].to_numpy(float).copy()
        gi, lts, _, _ = _launches(ctx, kind)
        ok = (gi >= 0) & (gi < len(frame))
        launch[gi[ok]] = np.minimum(lts[ok], launch[gi[ok]])
        parts_l.append(launch[m])
        parts_e.append(frame["end"].to_numpy(float)[m])
    if not parts_l:
        return None
    launch = np.concatenate(parts_l)
    end = np.concatenate(parts_e)
    order = np.argsort(launch, kind="stable")
    launch, cm = launch[order], np.maximum.accumulate(end[order])

    def drain(h: np.ndarray) -> np.ndarray:
        i = np.searchsorted(launch, np.asarray(h, dtype=float), side="right") - 1
        return np.where(i >= 0, cm[np.clip(i, 0, None)], -np.inf)

    return drain


def _first_shape_numel(text: str) -> int:
    if not text:
        return -1
    try:
        v = json.loads(text)
    except ValueError:
        return -1
    if not isinstance(v, list) or not v or not isinstance(v[0], list):
        return -1
    n = 1
    for d in v[0]:
        if not isinstance(d, int) or d < 0:
            return -1
        n *= d
    return n


def _first_type_bytes(text: str) -> int:
    if not text:
        return -1
    try:
        v = json.loads(text)
    except ValueError:
        return -1
    if not isinstance(v, list) or not v or not isinstance(v[0], str):
        return -1
    return DTYPE_BYTES.get(v[0].strip().lower(), -1)


def _gradients(ctx: RankContext) -> pd.DataFrame:
    """One row per AccumulateGrad in the analysed steps: step, h (host time the gradient is in
    place), bytes (-1 unknown)."""
    ops = ctx.trace.cpu_ops
    names = ops["name"].astype(str)
    top = ops[(names == ACCUMULATE_TOP).to_numpy() & (ops["depth"].to_numpy() == 0)]
    if not len(top):
        return pd.DataFrame({"step": [], "h": [], "bytes": []})
    inner = ops[(names == ACCUMULATE_INNER).to_numpy()]
    inner = inner[inner["parent"].isin(top.index)].drop_duplicates("parent").set_index("parent")
    h = top["ts"].to_numpy(float).copy()
    nbytes = np.full(len(top), -1, dtype=np.int64)
    pos = {p: i for i, p in enumerate(top.index)}
    if len(inner):
        rows = np.array([pos[p] for p in inner.index], dtype=np.int64)
        h[rows] = inner["end"].to_numpy(float)
        numel = np.array([_first_shape_numel(s) for s in inner["input_dims"].astype(str)], dtype=np.int64)
        esize = np.array([_first_type_bytes(s) for s in inner["input_types"].astype(str)], dtype=np.int64)
        nbytes[rows] = np.where((numel >= 0) & (esize > 0), numel * esize, np.where(numel >= 0, -2 - numel, -1))
    out = pd.DataFrame({"step": ctx.step_of(top["ts"].to_numpy(float)), "h": h, "bytes": nbytes})
    return out[out["step"] >= 0].sort_values("h", kind="stable").reset_index(drop=True)


def _backward_ends(ctx: RankContext) -> dict[int, float]:
    """Per analysed step, the end of its last backward operator on the host."""
    ops = ctx.trace.cpu_ops
    top = ops[ops["depth"].to_numpy() == 0]
    top = top[name_mask(top["name"], _BACKWARD_RE)]
    if not len(top):
        return {}
    st = ctx.step_of(top["ts"].to_numpy(float))
    df = pd.DataFrame({"step": st, "end": top["end"].to_numpy(float)})
    df = df[df["step"] >= 0]
    return {int(k): float(v) for k, v in df.groupby("step")["end"].max().items()}


# ----------------------------------------------------------------------------- per rank


def per_rank(ctx: RankContext) -> list:
    grads = gradient_collectives(ctx)
    if not len(grads):
        return []
    out = []
    for (pg, kind), g in grads.groupby(["pg", "kind"], sort=False):
        f = _search(ctx, str(pg), str(kind), g.reset_index(drop=True))
        if f is not None:
            out.append(f)
    return out


def _units_of_step(g: pd.DataFrame, units: pd.DataFrame, drain) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """The units of one step in ready order: (granularity, ready, bytes, bounds of the trace's own
    buckets). ``g``: the step's gradient collectives by issue time, sizes known."""
    issue = g["issue"].to_numpy(float)
    sizes = g["bytes"].to_numpy(float)
    if len(units):
        h = units["h"].to_numpy(float)
        b = np.searchsorted(issue, h, side="left")  # the first bucket issued at or after the gradient
        inb = b < len(issue)
        h, b, ub = h[inb], b[inb], units["bytes"].to_numpy(np.int64)[inb]
        counts = np.bincount(b, minlength=len(issue))
        if (counts > 0).all():
            nbytes = np.empty(len(h))
            gran = "parameter"
            for i in range(len(issue)):
                m = b == i
                own = ub[m]
                if (own >= 0).all() and own.sum() > 0:
                    factor = sizes[i] / own.sum()
                    if abs(factor - 1.0) > 0.01:
                        gran = _worse(gran, "parameter_scaled")
                    nbytes[m] = own * factor
                elif (own <= -2).all() and (-2 - own).sum() > 0:
                    # shapes known, element size not: scale the element counts to the bucket's bytes
                    numel = (-2 - own).astype(float)
                    nbytes[m] = numel * (sizes[i] / numel.sum())
                    gran = _worse(gran, "parameter_scaled")
                else:
                    nbytes[m] = sizes[i] / counts[i]
                    gran = _worse(gran, "bucket_even_split")
            bounds = np.cumsum(counts) - 1
            ready = np.maximum(h, drain(h))
            return gran, ready, nbytes, bounds
    ready = np.maximum(issue, drain(issue))
    return "collective", ready, sizes, np.arange(len(issue), dtype=np.int64)


def _worse(a: str, b: str) -> str:
    return a if GRANULARITY_ORDER.index(a) >= GRANULARITY_ORDER.index(b) else b


def _search(ctx: RankContext, pg: str, kind: str, g: pd.DataFrame) -> BucketSearch | None:
    drain = _device_drain(ctx)
    if drain is None:
        return None
    ends = _backward_ends(ctx)
    knob = "bucket_cap_mb" if kind == "all_reduce" else "fsdp_unit_size"
    first = FIRST_BUCKET_BYTES if kind == "all_reduce" else None
    per_step = []  # (step, its collectives, backward device end E, measured exposed)
    for s in sorted(int(x) for x in g["step"].unique()):
        gs = g[g["step"] == s]
        e = float(drain(np.array([ends.get(s, float(gs["issue"].max()))]))[0])
        if np.isfinite(e):
            per_step.append((s, gs, e, max(0.0, float(gs["end"].max()) - e)))
    if not per_step:
        return None
    steps = {p[0] for p in per_step}
    analysed = float(sum(w.duration_us for w in ctx.windows if w.step in steps))
    n_coll = sum(len(p[1]) for p in per_step)
    measured = sum(p[3] for p in per_step)
    comm_time = float(sum(p[1]["dur"].sum() for p in per_step))
    xs = np.concatenate([p[1]["bytes"].to_numpy(float) for p in per_step])
    ys = np.concatenate([p[1]["dur"].to_numpy(float) for p in per_step])
    span = (ctx.windows[0].start_us, ctx.windows[-1].end_us) if ctx.windows else (float(g["ts"].min()),
                                                                                  float(g["end"].max()))  # fmt: skip
    base = dict(
        rank=ctx.rank, process_group=pg, collective=kind, knob=knob, steps_count=len(per_step),
        collectives_count=n_coll, buckets_per_step_count=n_coll / len(per_step), analysed_us=analysed,
        comm_time_us=comm_time, measured_exposed_us=measured,
        measured_exposed_share_ratio=min(1.0, measured / analysed) if analysed > 0 else 0.0,
    )  # fmt: skip
    measured_note = ("measured exposed = per step, the last gradient collective's end - E, E = the latest end of the "
                     "device work launched before the last backward operator ended")  # fmt: skip
    events = [str(g["name"].iat[0])]
    if not (xs >= 0).all():
        return BucketSearch(
            **base, granularity="collective", sizes_known=False, searched=False, grads_per_step_count=0.0,
            reason="the trace records no message size for these collectives (no record_param_comms sizes), so no "
                   "bandwidth can be fitted",
            evidence=Evidence(time_ranges_us=[span], events=events, counts={"collectives": n_coll}, note=measured_note),
        )  # fmt: skip
    alpha, beta, fit, fit_n = fit_cost(xs, ys)
    fit_err = float(np.abs(alpha + xs / beta - ys).mean() / max(ys.mean(), 1e-9))
    fitted = dict(latency_us=alpha, bandwidth_gbps=beta / 1e3, fit=fit, fit_points_count=fit_n,
                  fit_error_ratio=min(fit_err, 1.0), gradient_bytes=float(xs.sum() / len(per_step)),
                  mean_bucket_bytes=float(xs.mean()))  # fmt: skip
    fit_note = (f"cost = {alpha:,.1f} us + bytes / {beta / 1e3:,.2f} GB/s ({fit} fit on the shortest duration of each "
                f"of {fit_n} sizes; mean error {fit_err:.0%} over the {len(xs)} collectives)")  # fmt: skip
    units = _gradients(ctx)
    gran = "parameter"
    prepared = []  # (ready, bytes, E) per step
    pred_current = 0.0
    n_units = 0
    for s, gs, e, _ in per_step:
        gr, ready, nbytes, bounds = _units_of_step(gs, units[units["step"] == s] if len(units) else units, drain)
        gran = _worse(gran, gr)
        n_units += len(ready) if gr != "collective" else 0
        prepared.append((ready, nbytes, e))
        pred_current += simulate(ready, nbytes, bounds, e, alpha, beta)[0]
    err = pred_current - measured
    err_ratio = min(1.0, abs(err) / max(measured, 0.05 * comm_time, 1e-9))
    checked = dict(granularity=gran, grads_per_step_count=n_units / len(per_step), predicted_current_us=pred_current,
                   model_error_us=err, model_error_ratio=err_ratio)  # fmt: skip
    if fit != "affine" or alpha <= 0:
        # without a fixed cost per collective, more buckets never cost anything in the model: a search would
        # always end at the smallest size, an artefact of the fit and not a property of the job
        return BucketSearch(
            **base, **fitted, **checked, sizes_known=True, searched=False,
            reason=("the durations do not grow with the message size (no positive slope over distinct sizes)"
                    if fit != "affine" else "no fixed cost per collective could be fitted (intercept <= 0)")
                   + ": the cost of more or fewer buckets cannot be told from this trace",
            evidence=Evidence(time_ranges_us=[span], events=events, counts={"collectives": n_coll, "steps": len(per_step)},
                              note=f"{fit_note}; {measured_note}"),
        )  # fmt: skip
    # an explicit bucket_cap_mb sizes every bucket (recent PyTorch; older releases: also set
    # dist._DEFAULT_FIRST_BUCKET_BYTES); DDP's default keeps its 1 MiB first bucket
    totals = np.zeros(len(CAPS_MB))
    nbuckets = np.zeros(len(CAPS_MB))
    default = default_buckets = 0.0
    for ready, nbytes, e in prepared:
        bounds = cap_boundaries(nbytes, DEFAULT_CAP_MB * MIB, first)
        default += simulate(ready, nbytes, bounds, e, alpha, beta)[0]
        default_buckets += len(bounds) / len(prepared)
        for ci, c_mb in enumerate(CAPS_MB):
            bounds = cap_boundaries(nbytes, c_mb * MIB, None)
            totals[ci] += simulate(ready, nbytes, bounds, e, alpha, beta)[0]
            nbuckets[ci] += len(bounds)
    best_total = float(totals.min())
    tol = max(TIE_RATIO * best_total, TIE_US_PER_STEP * len(prepared))
    bi = int(np.flatnonzero(totals <= best_total + tol)[0])
    best, cap, first_mb = float(totals[bi]), float(CAPS_MB[bi]), float(CAPS_MB[bi])
    nb = float(nbuckets[bi]) / len(prepared)
    if first is not None and default < best - tol:  # DDP's default (1 MiB first bucket, then 25 MiB) does better
        best, cap, first_mb, nb = default, float(DEFAULT_CAP_MB), first / MIB, default_buckets
    saving = max(0.0, pred_current - best)
    return BucketSearch(
        **base, **fitted, **checked, sizes_known=True, searched=True,
        recommended_cap_mb=cap, recommended_first_bucket_mb=first_mb,
        recommended_buckets_count=nb,
        predicted_best_us=best, predicted_default_us=default, saving_us=saving,
        saving_low_us=max(0.0, saving - abs(err)),
        saving_share_ratio=min(1.0, saving / analysed) if analysed > 0 else 0.0,
        curve_us={str(c): float(totals[CAPS_MB.index(c)]) for c in CURVE_MB},
        evidence=Evidence(
            time_ranges_us=[span], events=events,
            counts={"collectives": n_coll, "steps": len(prepared), "gradients": n_units},
            note=(f"{fit_note}; gradients ready = max(host time, device drain); buckets close at >= the size, one "
                  f"after the other on one stream; {measured_note}; granularity {gran}"),
        ),
    )  # fmt: skip
