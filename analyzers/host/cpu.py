"""cpu analyzer: launch and dispatch cost, synchronisations, GC, compilation, host vs device busy.

Facts (hermes_kb/facts/cpu.py; formulas in docs/analysis/cpu.md):

* ``launch_overhead`` (rank-level): launch calls, kernels shorter than their launch call, host
  time per kernel, launch-to-start delay (p50/p95), kernels the device waited for (HTA host_wait).
* ``host_device_busy`` (per step, at most ``MAX_STEP_FACTS``, + aggregate): host threads busy in
  cpu ops vs device busy, and device idle while the host works.
* ``host_sync`` (per step with syncs, capped, + aggregate): sync runtime calls, blocking
  device-to-host copies, cuda_sync events, and (aggregate) the ops behind them (top 10).
* ``gc_pauses`` (rank-level, only when the trace records 'Python GC' events).
* ``compilation`` (per step that compiles/autotunes + aggregate when any compile-related event
  exists): compile and autotune time, compiled-region runs, guard checks, recompilation ids, and
  the per-call cost of running compiled code (regions per step, graph-break resume frames, host
  time in the compiled calls outside their generated code).
* ``device_allocation`` (rank-level, Kineto): CUDA / HIP device and pinned-host allocation calls
  in the steps; ``graph_capture``: stream captures and graph instantiations in the steps;
  ``npu_task_queue`` (Ascend): who launches the operators (the task queue's second thread, or
  the Python thread when the queue is off).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import (
    Compilation,
    DeviceAllocation,
    GcPauses,
    GraphCapture,
    HostDeviceBusy,
    HostSync,
    LaunchOverhead,
    NpuTaskQueue,
    SyncSource,
)

from .. import intervals as iv
from ..context import RankContext
from ..selection import (
    GC_NAME,
    div,
    host_tids,
    host_window_arrays,
    memcpy_runtime,
    main_tid,
    name_is,
    name_mask,
    on_tids,
    pick_steps,
    python_stacks,
    step_pos,
    top_ops_union,
    window_arrays,
)
from ..whatif.sets import WhatIfSet, register

TOP_SOURCES = 10

# ops whose purpose implies a device-to-host synchronisation; the outermost one in a call's op
# chain names the cause (aten::item > aten::_local_scalar_dense > aten::to > aten::copy_)
SYNC_OPS = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::cpu", "aten::numpy", "aten::tolist", "aten::nonzero",
    "aten::nonzero_numpy", "aten::masked_select", "aten::to", "aten::_to_copy", "aten::copy_", "aten::unique",
    "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::is_nonzero",
    "aten::equal", "aten::allclose", "aten::repeat_interleave", "aten::bincount", "aten::histc",
    "aten::masked_scatter", "aten::index", "aten::index_put_", "aten::_assert_async", "aten::multinomial",
    "aten::where", "aten::argwhere",
})  # fmt: skip

# torch.compile: running compiled code (not compilation)
REGION_RE = re.compile(r"Torch-Compiled Region|CompiledFxGraph|CompiledFunction|Compiled Function")
LOOKUP_RE = re.compile(r"TorchDynamo Cache Lookup")
# compilation proper: Dynamo tracing, AOTAutograd, Inductor lowering/codegen, Triton JIT compile
# (python_function paths, and the record_function names of dynamo_timed phases)
COMPILE_RE = re.compile(
    r"torch/_dynamo/(convert_frame|symbolic_convert|output_graph|bytecode_transformation|bytecode_analysis|"
    r"variables/|backends/|guards\.py\(\d+\): (CheckFunctionManager|build_guard_function|compile_check_fn))"
    r"|torch/_functorch/aot_autograd\.py\(\d+\): (_?create_aot_dispatcher_function|aot_module_simplified|"
    r"aot_function|aot_module|aot_export\w*)|torch/_functorch/_aot_autograd/(jit_compile_runtime_wrappers|"
    r"dispatch_and_compile_graph|collect_metadata_analysis)"
    r"|torch/_inductor/(compile_fx|graph|scheduler|lowering|ir|decomposition|select_algorithm|autotune_process|"
    r"async_compile|codecache|fx_passes/|codegen/)"
    r"|triton/compiler/compiler\.py\(\d+\): compile\b|triton/runtime/jit\.py\(\d+\): _do_compile"
    r"|^(_compile\.|entire_frame_compile|compile_fx|fx_codegen_and_compile|backend_compile|OutputGraph\.|"
    r"create_aot_dispatcher_function|inductor_compile|async_compile\.|GraphLowering\.|Scheduler\.|"
    r"PyCodeCache\.|compile_file|aot_collect_metadata|TorchDynamo$|Dynamo compile)"
)
AUTOTUNE_RE = re.compile(
    r"cudnnFind|miopenFind|FindConvolution|cudnnGet\w*Algorithm|[Aa]utotun|TunableOp|tunableop"
    r"|select_algorithm\.py|benchmark_choice|do_bench"
)
# convolution operators whose algorithm cuDNN / MIOpen may search for (benchmark mode, Find)
CONV_OP_RE = re.compile(r"^aten::(cudnn_convolution\w*|miopen_\w*convolution\w*|convolution_backward|_convolution)$")
REGION_ID_RE = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")
# an explicit gc.collect() (the built-in frame the Python tracer records)
GC_COLLECT_RE = re.compile(r"^<built-in (method|function) collect( of module object at 0x[0-9a-f]+)?>$")
# the compiled call itself (forward region, AOTAutograd's autograd function and its backward) and
# the generated code it runs: what lies inside the first and outside the second is per-call cost
CALL_RE = re.compile(r"^Torch-Compiled Region|^CompiledFunction|^Compiled Function")
FXGRAPH_RE = re.compile(r"CompiledFxGraph")
RESUME_RE = re.compile(r"torch_dynamo_resume_in_")


def _pctl(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def _device_union(ctx: RankContext) -> iv.Intervals | None:
    tr = ctx.trace
    parts_s, parts_e = [], []
    for fr in (tr.kernels, tr.memcpy):
        if len(fr):
            parts_s.append(fr["ts"].to_numpy())
            parts_e.append(fr["end"].to_numpy())
    if not parts_s:
        return None
    return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))


def _blocking_dtoh_rows(tr) -> np.ndarray:
    """Runtime rows of DtoH copies that block the host: a synchronous copy call, or a pageable
    destination (the host waits for the copy either way)."""
    mi, ri = memcpy_runtime(tr, "DtoH")
    if not len(mi):
        return np.zeros(0, np.int64)
    blocking = ~name_mask(tr.runtime["name"], r"Async")[ri] | (tr.memcpy["dst"] == "Pageable").to_numpy()[mi]
    return ri[blocking]


def _blocked_union(tr, tids: np.ndarray) -> iv.Intervals:
    """Host time blocked waiting for the device: sync calls and blocking DtoH copy calls."""
    rt = tr.runtime
    if not len(rt):
        return iv.EMPTY
    rows = np.union1d(np.flatnonzero((rt["kind"] == "sync").to_numpy()), _blocking_dtoh_rows(tr))
    rows = rows[np.isin(rt["tid"].to_numpy()[rows], tids)]
    return iv.union(rt["ts"].to_numpy()[rows], rt["end"].to_numpy()[rows])


# ---------------------------------------------------------------- launch overhead


def _launch(ctx: RankContext, host: iv.Intervals, has_ops: bool, device: iv.Intervals | None) -> list[Fact]:
    tr = ctx.trace
    rt, kn, lk = tr.runtime, tr.kernels, tr.links
    if not len(rt) or not len(kn):
        return []
    rstep = ctx.step_of(rt["ts"].to_numpy())
    rkind = rt["kind"].to_numpy()
    launch = (rkind == "launch") & (rstep >= 0)
    graph = (rkind == "graph_launch") & (rstep >= 0)
    if not launch.any() and not graph.any():
        return []
    rdur = rt["dur"].to_numpy()
    # kernels started by a plain launch call in the steps
    kdur = np.zeros(0)
    ldur = np.zeros(0)
    queue = np.zeros(0)
    if len(lk):
        ri = lk["runtime_idx"].to_numpy()
        gi = lk["gpu_idx"].to_numpy()
        m = (lk["gpu_kind"] == "kernel").to_numpy() & (ri >= 0) & (ri < len(rt)) & (gi >= 0) & (gi < len(kn))
        m[m] &= launch[ri[m]]
        ri, gi = ri[m], gi[m]
        kdur = kn["dur"].to_numpy()[gi]
        ldur = rdur[ri]
        queue = kn["ts"].to_numpy()[gi] - rt["end"].to_numpy()[ri]  # HTA launch delay
        # a launch call that returns only after its kernel has finished: with asynchronous
        # launches impossible for a kernel that runs longer than any launch call takes
        k_end, r_end = kn["end"].to_numpy()[gi], rt["end"].to_numpy()[ri]
        long_k = kdur >= LONG_KERNEL_US
        n_long = int(long_k.sum())
        n_waited = int((long_k & (r_end >= k_end)).sum())
    else:
        n_long = n_waited = 0
    nk = len(kdur)
    short = int((kdur < ldur).sum())
    hs, he = host_window_arrays(ctx)
    host_us = float(iv.overlap_length(hs, he, host).sum()) if has_ops else None

    # HTA host_wait, per stream: launched after the previous activity on the stream ended
    hw_count, hw_total = 0, 0
    if len(lk):
        cols: dict[str, list[np.ndarray]] = {"stream": [], "device": [], "ts": [], "end": [], "launch": []}
        for kind, fr in (("kernel", kn), ("memcpy", tr.memcpy)):
            if not len(fr):
                continue
            lm = (lk["gpu_kind"] == kind).to_numpy()
            launch_ts = np.full(len(fr), np.nan)
            gi = lk["gpu_idx"].to_numpy()[lm]
            ok = (gi >= 0) & (gi < len(fr))
            launch_ts[gi[ok]] = lk["launch_ts"].to_numpy()[lm][ok]
            for c in ("stream", "device", "ts", "end"):
                cols[c].append(fr[c].to_numpy())
            cols["launch"].append(launch_ts)
        if cols["ts"]:
            st, dv, ts, en, lts = (
                np.concatenate(cols[c]) for c in ("stream", "device", "ts", "end", "launch")
            )
            o = np.lexsort((ts, st, dv))
            st, dv, ts, en, lts = st[o], dv[o], ts[o], en[o], lts[o]
            prev_end = np.full(len(ts), np.nan)
            same = (st[1:] == st[:-1]) & (dv[1:] == dv[:-1])
            prev_end[1:][same] = en[:-1][same]
            valid = (ctx.step_of(ts) >= 0) & ~np.isnan(lts) & ~np.isnan(prev_end)
            hw_total = int(valid.sum())
            hw_count = int((valid & (lts > prev_end)).sum())

    lsel = rdur[launch]
    stall = _stalled_launches(tr, launch, rdur, lsel, device)
    names = rt["name"][launch].value_counts().head(5)
    names = names[names > 0]
    return [LaunchOverhead(
        rank=tr.rank, launches_count=int(launch.sum()), graph_launches_count=int(graph.sum()), kernels_count=nk,
        launch_call_mean_us=float(lsel.mean()) if len(lsel) else None, launch_call_p50_us=_pctl(lsel, 50),
        kernel_mean_us=float(kdur.mean()) if nk else None, kernel_p50_us=_pctl(kdur, 50),
        short_kernels_count=short, short_kernels_ratio=div(short, nk),
        long_kernels_count=n_long, launch_waited_long_kernels_ratio=div(n_waited, n_long),
        host_us_per_kernel=(host_us / nk) if (host_us is not None and nk) else None,
        queue_p50_us=_pctl(queue, 50), queue_p95_us=_pctl(queue, 95),
        host_wait_kernels_count=hw_count, host_wait_kernels_ratio=div(hw_count, hw_total),
        stalled_launches_count=stall["count"], stalled_launch_us=stall["us"],
        stalled_launch_ratio=div(stall["us"], float(np.sum(he - hs))) if len(hs) else 0.0,
        stalled_device_idle_ratio=stall["idle_ratio"], stalled_first_use_count=stall["first_use"],
        stalled_first_use_ratio=div(stall["first_use"], stall["count"]) if stall["count"] else None,
        stalled_kernels=stall["kernels"],
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=[str(n) for n in names.index],
            counts={str(k): int(v) for k, v in names.items()} | {"kernels_linked": nk, "device_activities_checked": hw_total},
            note="short kernel: kernel duration < its launch call's duration; queue: kernel start - launch call end; "
                 "host_wait: launch call start > end of the previous activity on the same stream (HTA idle breakdown)",
        ),
    )]  # fmt: skip


LONG_KERNEL_US = 50.0  # longer than an asynchronous launch call takes (3-30 us)
STALL_MIN_US = 1000.0  # a launch call this long is not launching any more ...
STALL_FACTOR = 50.0  # ... when it also takes this many times the median launch call


def _stalled_launches(tr, launch: np.ndarray, rdur: np.ndarray, lsel: np.ndarray, device: iv.Intervals | None) -> dict:
    """Launch calls in the steps that take milliseconds (>= STALL_MIN_US and >= STALL_FACTOR x the
    median launch call): their time, the share of it the device sat idle, and how many started
    the first kernel of its name in the trace (a first use: the driver loading the kernel's
    module or code object, CUDA's lazy loading)."""
    out = {"count": 0, "us": 0.0, "idle_ratio": None, "first_use": 0, "kernels": []}
    if not len(lsel):
        return out
    bound = max(STALL_MIN_US, STALL_FACTOR * float(np.median(lsel)))
    rows = np.flatnonzero(launch & (rdur >= bound))
    if not len(rows):
        return out
    rt, kn, lk = tr.runtime, tr.kernels, tr.links
    ts, end = rt["ts"].to_numpy()[rows], rt["end"].to_numpy()[rows]
    busy = float(iv.overlap_length(ts, end, device).sum()) if device is not None else 0.0
    total = float((end - ts).sum())
    first_use, kernels = 0, []
    if len(lk) and len(kn):
        km = (lk["gpu_kind"] == "kernel").to_numpy()
        by_runtime = dict(zip(lk["runtime_idx"].to_numpy()[km].tolist(), lk["gpu_idx"].to_numpy()[km].tolist()))
        names = kn["name"].astype(str).to_numpy()
        first = pd.Series(kn["ts"].to_numpy()).groupby(names).transform("min").to_numpy()
        for r in rows.tolist():
            g = by_runtime.get(r)
            if g is None or not 0 <= g < len(kn):
                continue
            base = names[g].split("(")[0]  # the kernel's name without its parameter list ...
            kernels.append((base[: base.index("<")] + "<...>" if "<" in base else base)[:100])  # ... and template
            first_use += int(kn["ts"].to_numpy()[g] <= first[g])
    return {"count": len(rows), "us": total, "idle_ratio": 1.0 - busy / total if total > 0 else None,
            "first_use": first_use, "kernels": kernels[:3]}  # fmt: skip


# ---------------------------------------------------------------- host vs device busy


def _busy(ctx: RankContext, host: iv.Intervals, device: iv.Intervals | None, tids: np.ndarray) -> list[Fact]:
    tr = ctx.trace
    if not len(tr.cpu_ops) and device is None:
        return []
    ws, we = window_arrays(ctx)
    steps = np.array([w.step for w in ctx.windows])
    win = we - ws
    hb = iv.overlap_length(ws, we, host)
    ann, py = tr.annotations, tr.python
    am = on_tids(ann, tids) & (ann["kind"] != "step").to_numpy() if len(ann) else np.zeros(0, bool)
    pm = on_tids(py, tids)
    act = iv.union(np.concatenate([host[0], ann["ts"].to_numpy()[am], py["ts"].to_numpy()[pm]]),
                   np.concatenate([host[1], ann["end"].to_numpy()[am], py["end"].to_numpy()[pm]]))  # fmt: skip
    ha = iv.overlap_length(ws, we, act)
    if device is not None:
        db = iv.overlap_length(ws, we, device)
        idle_host = hb - iv.overlap_length(ws, we, iv.intersect(host, device))
    launches = np.zeros(len(steps))
    if len(tr.runtime):
        rm = tr.runtime["kind"].isin(["launch", "graph_launch"]).to_numpy()
        pos, ok = step_pos(steps, ctx.step_of(tr.runtime["ts"].to_numpy()[rm]))
        np.add.at(launches, pos[ok], 1)

    def make(idx, step):
        w, h, a = float(win[idx].sum()), float(hb[idx].sum()), float(ha[idx].sum())
        d = float(db[idx].sum()) if device is not None else None
        ih = float(idle_host[idx].sum()) if device is not None else None
        return HostDeviceBusy(
            rank=tr.rank, step=step, window_us=w, host_busy_us=h, host_busy_ratio=div(h, w),
            host_active_us=a, host_active_ratio=div(a, w),
            device_busy_us=d, device_busy_ratio=div(d, w) if d is not None else None,
            device_idle_us=max(w - d, 0.0) if d is not None else None,
            device_idle_host_busy_us=ih, device_idle_host_busy_ratio=div(ih, w) if ih is not None else None,
            launches_count=int(launches[idx].sum()),
            evidence=Evidence(time_ranges_us=[(float(ws[i]), float(we[i])) for i in np.atleast_1d(idx)[:5]],
                              counts={"host_threads": len(tids)},
                              note=f"host = top-level cpu ops on threads {tids.tolist()[:6]}; device = kernels, memcpy, memset"),
        )  # fmt: skip

    keep = pick_steps(
        {int(s): float(win[i] - (db[i] if device is not None else 0.0)) for i, s in enumerate(steps)}
    )
    facts: list[Fact] = [make(np.array([i]), int(s)) for i, s in enumerate(steps) if int(s) in keep]
    facts.append(make(np.arange(len(steps)), None))
    return facts


# ---------------------------------------------------------------- synchronisation


def _enclosing_op(ops: pd.DataFrame, tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Row of the innermost cpu op on thread ``tid`` spanning [ts, end] (-1 when none)."""
    out = np.full(len(ts), -1, dtype=np.int64)
    otid, ots, oend, parent = (ops[c].to_numpy() for c in ("tid", "ts", "end", "parent"))
    for t in np.unique(tid):  # a handful of threads
        rows = np.flatnonzero(otid == t)
        if not len(rows):
            continue
        rows = rows[np.argsort(ots[rows], kind="stable")]
        sel = np.flatnonzero(tid == t)
        i = np.searchsorted(ots[rows], ts[sel], side="right") - 1
        cur = np.where(i >= 0, rows[np.clip(i, 0, None)], -1)
        # the last op starting before the call may have ended already: climb to an enclosing one
        for _ in range(int(ops["depth"].max()) + 2):
            bad = (cur >= 0) & (oend[np.clip(cur, 0, None)] < end[sel])
            if not bad.any():
                break
            cur[bad] = parent[cur[bad]]
        out[sel] = cur
    return out


def _sync_causes(ctx: RankContext, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per runtime row: the op behind it (walk from the call's External id to its cpu op, then up
    the op tree; the outermost op of SYNC_OPS names the cause) and the outermost op around it."""
    tr = ctx.trace
    rt, ops = tr.runtime, tr.cpu_ops
    n = len(calls)
    dur = rt["dur"].to_numpy()[calls]
    cause = np.full(n, "(no op)", dtype=object)
    outer = np.full(n, "(no op)", dtype=object)
    found = np.zeros(n, dtype=bool)
    if len(ops):
        eid = ops["ext_id"].to_numpy()
        has = np.flatnonzero(eid >= 0)
        # the innermost op with that id (a deeper op starts later)
        emap = pd.Series(has, index=eid[has])
        emap = emap[~emap.index.duplicated(keep="last")]
        row = (
            pd.Series(rt["ext_id"].to_numpy()[calls]).map(emap).fillna(-1).to_numpy(dtype=np.int64, copy=True)
        )
        # traces whose runtime External id is not the op's (older Kineto): the innermost op of the
        # same thread that encloses the call in time
        c_tid, c_ts, c_end = (rt[c].to_numpy()[calls] for c in ("tid", "ts", "end"))
        r = np.clip(row, 0, None)
        encloses = (ops["tid"].to_numpy()[r] == c_tid) & (ops["ts"].to_numpy()[r] <= c_ts + 1e-3)
        encloses &= ops["end"].to_numpy()[r] >= c_end - 1e-3
        row[~encloses] = -1
        lost = np.flatnonzero(row < 0)
        if len(lost):
            row[lost] = _enclosing_op(ops, c_tid[lost], c_ts[lost], c_end[lost])
        found = row >= 0
        if found.any():
            parent = ops["parent"].to_numpy()
            nm = (
                ops["name"]
                if isinstance(ops["name"].dtype, pd.CategoricalDtype)
                else ops["name"].astype("category")
            )
            codes = nm.cat.codes.to_numpy()
            known_cat = np.isin(nm.cat.categories.astype(str), list(SYNC_OPS))
            cur = row.copy()
            best = np.where(found, row, -1)  # innermost op by default
            top = cur.copy()
            for _ in range(int(ops["depth"].max()) + 2):
                live = cur >= 0
                if not live.any():
                    break
                k = np.zeros(n, dtype=bool)
                c = codes[cur[live]]
                k[live] = (c >= 0) & known_cat[np.clip(c, 0, None)]
                best = np.where(k, cur, best)
                top = np.where(live, cur, top)
                nxt = np.full(n, -1, dtype=np.int64)
                nxt[live] = parent[cur[live]]
                cur = nxt
            cause[found] = nm.iloc[best[found]].astype(str).to_numpy()
            outer[found] = nm.iloc[top[found]].astype(str).to_numpy()
    # calls outside every op: the innermost Python function around the longest of them
    py = tr.python
    lost = np.flatnonzero(~found)
    if len(lost) and len(py):
        lost = lost[np.argsort(-dur[lost])][:20]
        pts, pend, ptid = py["ts"].to_numpy(), py["end"].to_numpy(), py["tid"].to_numpy()
        not_gc = ~name_is(py["name"], GC_NAME)
        cts, cend, ctid = (rt[c].to_numpy()[calls[lost]] for c in ("ts", "end", "tid"))
        for j, a, b, t in zip(lost, cts, cend, ctid):  # at most 20 calls
            m = np.flatnonzero((ptid == t) & (pts <= a) & (pend >= b) & not_gc)
            if len(m):
                outer[j] = f"(python) {py['name'].iat[m[np.argmax(pts[m])]]}"
    return cause, outer


def _sync_sources(ctx: RankContext, calls: np.ndarray, cause: np.ndarray, outer: np.ndarray) -> list[SyncSource]:
    """The ops behind the given runtime rows, by host time."""
    if not len(calls):
        return []
    dur = ctx.trace.runtime["dur"].to_numpy()[calls]
    df = pd.DataFrame({"op": cause, "outer": outer, "dur": dur})
    g = (
        df.groupby(["op", "outer"], sort=False)["dur"]
        .agg(["size", "sum"])
        .sort_values("sum", ascending=False)
    )
    return [SyncSource(op=str(o), outer_op=str(u), count=int(r["size"]), host_us=float(r["sum"]))
            for (o, u), r in g.head(TOP_SOURCES).iterrows()]  # fmt: skip


def _sync(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    rt = tr.runtime
    steps = np.array([w.step for w in ctx.windows])
    hs, he = host_window_arrays(ctx)
    n = len(steps)
    rows_sync = np.zeros(0, np.int64)
    if len(rt):
        sm = (rt["kind"] == "sync").to_numpy()
        rows_sync = np.flatnonzero(sm)
    s_step = ctx.host_step_of(rt["ts"].to_numpy()[rows_sync]) if len(rows_sync) else np.zeros(0, np.int64)
    rows_sync, s_step = rows_sync[s_step >= 0], s_step[s_step >= 0]
    # device-to-host copies, and the blocking ones: a synchronous copy call, or pageable destination
    mc = tr.memcpy
    d_idx = np.flatnonzero((mc["kind"] == "DtoH").to_numpy()) if len(mc) else np.zeros(0, np.int64)
    d_step = ctx.step_of(mc["ts"].to_numpy()[d_idx]) if len(d_idx) else np.zeros(0, np.int64)
    blk_rows = _blocking_dtoh_rows(tr)
    blk_step = ctx.host_step_of(rt["ts"].to_numpy()[blk_rows])
    blk_rows, blk_step = blk_rows[blk_step >= 0], blk_step[blk_step >= 0]
    blk_dur = rt["dur"].to_numpy()[blk_rows]
    sy = tr.syncs
    e_step = ctx.step_of(sy["ts"].to_numpy()) if len(sy) else np.zeros(0, np.int64)
    if not len(rows_sync) and not len(blk_rows) and not (d_step >= 0).any() and not (e_step >= 0).any():
        return []

    def per_step(st, vals=None):
        out = np.zeros(n)
        pos, ok = step_pos(steps, st)
        np.add.at(out, pos[ok], 1 if vals is None else vals[ok])
        return out

    sdur = rt["dur"].to_numpy()[rows_sync] if len(rows_sync) else np.zeros(0)
    sc, su = per_step(s_step), per_step(s_step, sdur)
    longest = np.zeros(n)
    pos, ok = step_pos(steps, s_step)
    np.maximum.at(longest, pos[ok], sdur[ok])
    dbytes = mc["bytes"].to_numpy()[d_idx].clip(0) if len(d_idx) else np.zeros(0)
    dc, db = per_step(d_step), per_step(d_step, dbytes.astype(np.float64))
    bc, bu = per_step(blk_step), per_step(blk_step, blk_dur)
    ec = per_step(e_step)
    eu = per_step(e_step, sy["dur"].to_numpy()) if len(sy) else np.zeros(n)
    api = rt["name"].to_numpy()[rows_sync].astype(str) if len(rows_sync) else np.zeros(0, dtype=object)

    def make(idx, step, sources):
        sel = np.isin(s_step, steps[idx])
        cnt = pd.Series(api[sel]).value_counts().head(6)
        top3 = rows_sync[sel][np.argsort(-sdur[sel])[:3]]
        w = float((he - hs)[idx].sum())
        blocking_us = float(su[idx].sum() + bu[idx].sum())
        return HostSync(
            rank=tr.rank, step=step, window_us=w,
            sync_calls_count=int(sc[idx].sum()), sync_calls_us=float(su[idx].sum()), longest_sync_us=float(longest[idx].max()),
            dtoh_count=int(dc[idx].sum()), dtoh_bytes=int(db[idx].sum()),
            dtoh_blocking_count=int(bc[idx].sum()), dtoh_blocking_us=float(bu[idx].sum()),
            blocking_us=blocking_us, blocking_ratio=div(blocking_us, w),
            sync_events_count=int(ec[idx].sum()), sync_events_us=float(eu[idx].sum()), top_sources=sources,
            evidence=Evidence(
                time_ranges_us=[(float(rt["ts"].iat[r]), float(rt["end"].iat[r])) for r in top3],
                events=[str(k) for k in cnt.index], counts={str(k): int(v) for k, v in cnt.items()},
                note="sync calls: runtime kind 'sync'; blocking DtoH: copy call without 'Async' or to pageable memory; "
                     "time ranges: the longest sync calls",
            ),
        )  # fmt: skip

    active = {int(s): float(su[i] + bu[i]) for i, s in enumerate(steps) if sc[i] + bc[i] + dc[i] + ec[i] > 0}
    keep = pick_steps(active)
    facts: list[Fact] = [make(np.array([i]), int(s), []) for i, s in enumerate(steps) if int(s) in keep]
    calls = np.concatenate([rows_sync, blk_rows])
    cause, outer = _sync_causes(ctx, calls)
    _register_syncs(ctx, calls, cause)
    facts.append(make(np.arange(n), None, _sync_sources(ctx, calls, cause, outer)))
    return facts


def _register_syncs(ctx: RankContext, calls: np.ndarray, cause: np.ndarray) -> None:
    """What-if sets of the synchronising calls: removing one removes its wait. Implicit: behind an
    op that reads device data back (.item(), .cpu(), nonzero...); explicit: the others."""
    if not len(calls):
        return
    rt = ctx.trace.runtime
    tid, ts, end = (rt[c].to_numpy()[calls] for c in ("tid", "ts", "end"))
    implicit = np.isin(cause.astype(str), list(SYNC_OPS))
    for name, m, what in (("implicit_syncs", implicit, "device-to-host reads that wait for the device"),
                          ("explicit_syncs", ~implicit, "synchronize calls that wait for the device"),
                          ("syncs", np.ones(len(calls), dtype=bool), "every call that waits for the device")):
        if m.any():
            register(ctx, WhatIfSet.of_intervals(name, what, tid[m], ts[m], end[m], drop_waits=True))


# ---------------------------------------------------------------- garbage collection


def _gc(ctx: RankContext) -> list[Fact]:
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


# ---------------------------------------------------------------- compilation


ANY_COMPILE_RE = re.compile(
    "|".join(f"(?:{p.pattern})" for p in (COMPILE_RE, AUTOTUNE_RE, REGION_RE, LOOKUP_RE))
)


def _matches(
    ctx: RankContext, pattern: re.Pattern, frames=("cpu_ops", "annotations", "python", "runtime"), pre=None
):
    """(ts, end, names) of the events of the given frames whose names match; ``pre`` holds, per
    frame, the rows a cheaper combined pattern already selected (None: no candidate at all)."""
    tr = ctx.trace
    s, e, names = [], [], []
    for f in frames:
        fr = getattr(tr, f)
        rows = pre.get(f) if pre is not None else None
        if not len(fr) or (pre is not None and rows is None):
            continue
        if rows is None:
            rows = np.arange(len(fr))
        nm = fr["name"].iloc[rows]
        m = name_mask(nm, pattern)
        if m.any():
            s.append(fr["ts"].to_numpy()[rows[m]])
            e.append(fr["end"].to_numpy()[rows[m]])
            vc = nm[m].value_counts()
            names.extend(str(n) for n in vc[vc > 0].head(5).index)
    if not s:
        return np.zeros(0), np.zeros(0), []
    return np.concatenate(s), np.concatenate(e), names


def _conv_searches(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(ts, end, tid, names) of convolution operators that synchronise the device inside themselves:
    cuDNN's benchmark mode (and MIOpen's Find) times candidate algorithms for a shape it has not
    seen, with event or device synchronisations between the trials; a convolution that only
    launches its kernel never waits. The cuDNN API itself is not traced, so this is its mark."""
    tr = ctx.trace
    ops, rt = tr.cpu_ops, tr.runtime
    none = np.zeros(0), np.zeros(0), np.zeros(0, np.int64), []
    if not len(ops) or not len(rt) or "kind" not in rt.columns:
        return none
    conv = np.flatnonzero(name_mask(ops["name"], CONV_OP_RE))
    syncs = np.flatnonzero((rt["kind"] == "sync").to_numpy())
    if not len(conv) or not len(syncs):
        return none
    inner = _enclosing_op(ops, rt["tid"].to_numpy()[syncs], rt["ts"].to_numpy()[syncs], rt["end"].to_numpy()[syncs])
    parent = ops["parent"].to_numpy()
    is_conv = np.zeros(len(ops), bool)
    is_conv[conv] = True
    hit = np.zeros(len(ops), bool)
    cur = inner.copy()
    for _ in range(int(ops["depth"].max()) + 2):  # the sync may sit under a callee of the conv op
        ok = cur >= 0
        if not ok.any():
            break
        hit[cur[ok & is_conv[np.clip(cur, 0, None)]]] = True
        cur = np.where(ok, parent[np.clip(cur, 0, None)], -1)
    rows = np.flatnonzero(hit)
    # the outermost such conv op only (a cudnn_convolution under _convolution counts once)
    rows = rows[~np.isin(parent[rows], rows)]
    if not len(rows):
        return none
    names = [str(n) for n in ops["name"].iloc[rows].value_counts().head(3).index]
    return ops["ts"].to_numpy()[rows], ops["end"].to_numpy()[rows], ops["tid"].to_numpy()[rows].astype(np.int64), names


def _search_set(ctx: RankContext, s: np.ndarray, e: np.ndarray, tid: np.ndarray) -> WhatIfSet:
    """What an algorithm search costs, for the replay: the host time of the searching operators,
    the trial kernels they launch and the waits on them (a cached algorithm launches one kernel
    and waits for nothing; the fraction of the case leaves room for that kernel)."""
    tr = ctx.trace
    rt, kn = tr.runtime, tr.kernels
    kernels = np.zeros(0, np.int64)
    if len(rt) and len(kn) and "correlation" in rt.columns and "correlation" in kn.columns:
        rts, rtid = rt["ts"].to_numpy(), rt["tid"].to_numpy()
        inside = np.zeros(len(rt), bool)
        for t in np.unique(tid):
            m = tid == t
            u = iv.union(s[m], e[m])
            sel = np.flatnonzero(rtid == t)
            j = np.searchsorted(u[0], rts[sel], side="right") - 1
            ok = j >= 0
            inside[sel[ok]] = rts[sel[ok]] < u[1][j[ok]]
        corr = rt["correlation"].to_numpy(np.int64)[inside]
        kernels = np.flatnonzero(np.isin(kn["correlation"].to_numpy(np.int64), corr[corr > 0]))
    return WhatIfSet("compile", "", tid.astype(np.int64), s.astype(float), e.astype(float), kernels=kernels,
                     drop_waits=True)


def _compilation(ctx: RankContext, device: iv.Intervals | None = None) -> list[Fact]:
    tr = ctx.trace
    pre = {}
    for f in ("cpu_ops", "annotations", "python", "runtime"):
        fr = getattr(tr, f)
        m = name_mask(fr["name"], ANY_COMPILE_RE) if len(fr) else np.zeros(0, bool)
        pre[f] = np.flatnonzero(m) if m.any() else None
    v_s, v_e, v_tid, v_names = _conv_searches(ctx)
    if all(v is None for v in pre.values()) and not len(v_s):
        return []
    c_s, c_e, c_names = _matches(ctx, COMPILE_RE, pre=pre)
    a_s, a_e, a_names = _matches(ctx, AUTOTUNE_RE, pre=pre)
    if len(v_s):
        a_s, a_e = np.concatenate([a_s, v_s]), np.concatenate([a_e, v_e])
        a_names = a_names + [f"{n} (synchronises inside: algorithm search)" for n in v_names]
    r_s, r_e, r_names = _matches(ctx, REGION_RE, ("cpu_ops", "annotations"), pre=pre)
    l_s, l_e, l_names = _matches(ctx, LOOKUP_RE, ("cpu_ops", "annotations"), pre=pre)
    if not (len(c_s) or len(a_s) or len(r_s) or len(l_s)):
        return []
    ws, we = window_arrays(ctx)
    steps = np.array([w.step for w in ctx.windows])
    C, A, R = iv.union(c_s, c_e), iv.union(a_s, a_e), iv.union(r_s, r_e)
    CA = iv.union(np.concatenate([C[0], A[0]]), np.concatenate([C[1], A[1]]))
    tid = main_tid(tr)
    if tid is not None and len(CA[0]):
        register(ctx, WhatIfSet.of_intervals("compile", "compilation and autotuning on the host", tid, CA[0], CA[1]))
    if tid is not None and len(A[0]):
        register(ctx, WhatIfSet.of_intervals("autotune", "kernel autotuning and algorithm searches", tid, A[0], A[1]))
    if len(v_s):  # on their own threads (backward convolutions run on the autograd engine's)
        search = _search_set(ctx, v_s, v_e, v_tid)
        register(ctx, search)
        register(ctx, WhatIfSet("autotune", "kernel autotuning and algorithm searches", search.host_tid,
                                search.host_start, search.host_end, kernels=search.kernels, drop_waits=True))
    cu, au, ru, cau = (iv.overlap_length(ws, we, x) for x in (C, A, R, CA))

    def blocks(x: iv.Intervals) -> np.ndarray:
        out = np.zeros(len(steps))
        pos, ok = step_pos(steps, ctx.step_of(x[0]))
        np.add.at(out, pos[ok], 1)
        return out

    cn, an, rn = blocks(C), blocks(A), blocks(R)
    l_step = ctx.step_of(l_s)
    ln, lu = np.zeros(len(steps)), np.zeros(len(steps))
    pos, ok = step_pos(steps, l_step)
    np.add.at(ln, pos[ok], 1)
    np.add.at(lu, pos[ok], (l_e - l_s)[ok])
    # compiled-region ids run in the steps
    rt_names = []
    for f in ("cpu_ops", "annotations"):
        fr = getattr(tr, f)
        if len(fr):
            rows = pre.get(f)
            if rows is None:
                continue
            nm = fr["name"].iloc[rows]
            m = name_mask(nm, REGION_ID_RE) & (ctx.step_of(fr["ts"].to_numpy()[rows]) >= 0)
            rt_names.extend(str(n) for n in pd.unique(nm.to_numpy()[m]))
    ids = sorted({f"{a}/{b}" for n in rt_names for a, b in REGION_ID_RE.findall(n)},
                 key=lambda x: tuple(int(p) for p in x.split("/")))  # fmt: skip
    max_id = max((int(x.split("/")[1]) for x in ids), default=None)
    calls = _compiled_calls(ctx, pre, device, ws, we, steps)

    def make(idx, step):
        w = float((we - ws)[idx].sum())
        mine = np.flatnonzero(np.isin(ctx.step_of(CA[0]), steps[idx]))
        mine = mine[np.argsort(-(CA[1] - CA[0])[mine])[:3]]
        rng = [(float(CA[0][j]), float(CA[1][j])) for j in mine]
        return Compilation(
            rank=tr.rank, step=step, window_us=w, compile_us=float(cu[idx].sum()), compile_count=int(cn[idx].sum()),
            autotune_us=float(au[idx].sum()), autotune_count=int(an[idx].sum()), compile_ratio=div(float(cau[idx].sum()), w),
            compiled_region_count=int(rn[idx].sum()), compiled_region_us=float(ru[idx].sum()),
            cache_lookup_count=int(ln[idx].sum()), cache_lookup_us=float(lu[idx].sum()),
            compiled_frames=ids[:10], max_compile_id=max_id, recompiled=bool(max_id), **calls(idx),
            evidence=Evidence(
                time_ranges_us=rng, events=list(dict.fromkeys(c_names + a_names + r_names + l_names))[:10],
                counts={"compile_events": len(c_s), "autotune_events": len(a_s), "region_events": len(r_s),
                        "cache_lookups": len(l_s)},
                note="compile: Dynamo convert_frame/symbolic_convert/output_graph, AOTAutograd dispatcher creation, "
                     "Inductor compile_fx/graph/scheduler/codegen/codecache, Triton compile; region: Torch-Compiled "
                     "Region / CompiledFxGraph / CompiledFunction (running compiled code, not compiling)",
            ),
        )  # fmt: skip

    facts: list[Fact] = []
    active = {int(s): float(cau[i]) for i, s in enumerate(steps) if cau[i] > 0}
    keep = pick_steps(active)
    facts.extend(make(np.array([i]), int(s)) for i, s in enumerate(steps) if int(s) in keep)
    if cu.sum() + au.sum() + ru.sum() + ln.sum() > 0:
        facts.append(make(np.arange(len(steps)), None))
    return facts


def _compiled_calls(ctx: RankContext, pre: dict, device: iv.Intervals | None, ws: np.ndarray, we: np.ndarray,
                    steps: np.ndarray):
    """Per-call cost of running compiled code (fields of ``compilation``), as a function of the
    step indices a fact covers; registers the ``compile_wrappers`` what-if set."""
    tr = ctx.trace
    n = len(steps)
    # forward regions: frame id per call, per step
    reg_step, reg_frame = [], []
    call_t, call_s, call_e, fx_s, fx_e = [], [], [], [], []
    for f in ("cpu_ops", "annotations"):
        fr = getattr(tr, f)
        rows = pre.get(f)
        if not len(fr) or rows is None:
            continue
        nm = fr["name"].iloc[rows]
        ts, en, tid = fr["ts"].to_numpy()[rows], fr["end"].to_numpy()[rows], fr["tid"].to_numpy()[rows]
        rid = name_mask(nm, REGION_ID_RE)
        if rid.any():
            reg_step.append(ctx.step_of(ts[rid]))
            reg_frame.append(np.array([int(REGION_ID_RE.search(str(x)).group(1)) for x in nm.to_numpy()[rid]]))
        c = name_mask(nm, CALL_RE) | name_mask(nm, LOOKUP_RE)
        call_t.append(tid[c].astype(np.int64))
        call_s.append(ts[c])
        call_e.append(en[c])
        x = name_mask(nm, FXGRAPH_RE)
        fx_s.append(ts[x])
        fx_e.append(en[x])
    r_step = np.concatenate(reg_step) if reg_step else np.zeros(0, np.int64)
    r_frame = np.concatenate(reg_frame) if reg_frame else np.zeros(0, np.int64)
    ct = np.concatenate(call_t) if call_t else np.zeros(0, np.int64)
    cs = np.concatenate(call_s) if call_s else np.zeros(0)
    ce = np.concatenate(call_e) if call_e else np.zeros(0)
    FX = iv.union(np.concatenate(fx_s), np.concatenate(fx_e)) if fx_s else iv.EMPTY
    # wrapper time: inside a compiled call, outside the generated code, per thread
    wrap_parts = []
    for t in np.unique(ct):
        m = ct == t
        w = iv.subtract(iv.union(cs[m], ce[m]), FX)
        if len(w[0]):
            wrap_parts.append((np.full(len(w[0]), t, dtype=np.int64), w[0], w[1]))
    if wrap_parts and len(FX[0]):
        register(ctx, WhatIfSet.of_intervals(
            "compile_wrappers", "compiled calls outside their generated code (Dynamo guards, runtime wrappers)",
            np.concatenate([p[0] for p in wrap_parts]), np.concatenate([p[1] for p in wrap_parts]),
            np.concatenate([p[2] for p in wrap_parts])))  # fmt: skip
    W = iv.union(np.concatenate([p[1] for p in wrap_parts]), np.concatenate([p[2] for p in wrap_parts])) if wrap_parts else iv.EMPTY
    wrap = iv.overlap_length(ws, we, W) if len(FX[0]) else None  # no generated-code marks: unknown
    idle = None
    if device is not None:
        calls_u = iv.union(cs, ce)
        idle = iv.overlap_length(ws, we, iv.subtract(calls_u, device))
    resume = None
    py = tr.python
    if python_stacks(tr):
        rm = name_mask(py["name"], RESUME_RE)
        resume = np.zeros(n)
        if rm.any():
            pos, ok = step_pos(steps, ctx.step_of(py["ts"].to_numpy()[rm]))
            np.add.at(resume, pos[ok], 1)
    pos, okr = step_pos(steps, r_step)
    regions = np.zeros(n)
    np.add.at(regions, pos[okr], 1)
    per_step_frames: dict[int, dict[int, int]] = {}
    for p_, f_ in zip(pos[okr], r_frame[okr]):
        d = per_step_frames.setdefault(int(p_), {})
        d[int(f_)] = d.get(int(f_), 0) + 1

    def fields(idx) -> dict:
        idx = np.atleast_1d(idx)
        w = float((we - ws)[idx].sum())
        nreg = float(regions[idx].sum())
        rps = nreg / max(len(idx), 1)
        frames = [per_step_frames.get(int(i), {}) for i in idx]
        out = dict(
            forward_regions_count=int(nreg), regions_per_step=rps,
            distinct_frames_max=max((len(d) for d in frames), default=0),
            frame_calls_max=max((max(d.values()) for d in frames if d), default=0),
            resume_frames_count=None if resume is None else int(resume[idx].sum()),
        )
        if wrap is not None:
            wr = float(wrap[idx].sum())
            ex = wr * (1.0 - 1.0 / rps) if rps > 1 else 0.0
            out |= dict(wrapper_us=wr, wrapper_ratio=div(wr, w), wrapper_excess_us=ex, wrapper_excess_ratio=div(ex, w))
        if idle is not None:
            iu = float(idle[idx].sum())
            out |= dict(region_device_idle_us=iu, region_device_idle_ratio=div(iu, w))
        return out

    return fields


def _register_host_work(ctx: RankContext, host: iv.Intervals, tids: np.ndarray) -> None:
    """The host work that issues device work: operators and runtime calls on the threads that
    launch, outside synchronising waits and the DataLoader (sets ``host_work`` and ``launch_calls``)."""
    tr = ctx.trace
    rt = tr.runtime
    if not len(rt) or not (len(tr.kernels) or len(tr.memcpy)):
        return
    launch = rt["kind"].isin(["launch", "graph_launch"]).to_numpy()
    if not launch.any():
        return
    rtid = rt["tid"].to_numpy(np.int64)
    register(ctx, WhatIfSet.of_intervals("launch_calls", "kernel and graph launch calls", rtid[launch],
                                         rt["ts"].to_numpy()[launch], rt["end"].to_numpy()[launch]))  # fmt: skip
    ltids = np.intersect1d(np.unique(rtid[launch]), tids)
    ops = tr.cpu_ops
    ann = tr.annotations
    dl = ann[(ann["kind"] == "dataloader").to_numpy()] if len(ann) else ann
    DL = iv.union(dl["ts"].to_numpy(), dl["end"].to_numpy()) if len(dl) else iv.EMPTY
    blocked = _blocked_union(tr, tids)
    steps_s, steps_e = [], []
    mt = main_tid(tr)
    if mt is not None:
        # the driving thread's whole step (forward, backward, optimizer, the Python between them),
        # without its waits and its data loading: what a captured graph of the step replays at once
        hs, he = host_window_arrays(ctx)
        w = iv.subtract(iv.subtract(iv.union(hs, he), blocked), DL)
        if len(w[0]):
            steps_s.append((int(mt), w[0], w[1]))
    for t in ltids:
        om = (ops["tid"].to_numpy() == t) & (ops["depth"].to_numpy() == 0) if len(ops) else np.zeros(0, bool)
        rm = (rtid == t) & (rt["kind"] != "sync").to_numpy()
        w = iv.union(np.concatenate([ops["ts"].to_numpy()[om], rt["ts"].to_numpy()[rm]]),
                     np.concatenate([ops["end"].to_numpy()[om], rt["end"].to_numpy()[rm]]))  # fmt: skip
        w = iv.subtract(iv.subtract(w, blocked), DL)
        if len(w[0]):
            register(ctx, WhatIfSet.of_intervals("host_work", "operators and runtime calls on the launching threads "
                                                 "(no syncs, no DataLoader)", int(t), w[0], w[1]))  # fmt: skip
            if t != mt:
                steps_s.append((int(t), w[0], w[1]))
    if steps_s:
        register(ctx, WhatIfSet(
            "host_step", "the driving thread's steps and the other launching threads' work, without waits or "
            "data loading (what a captured graph replays in one launch)",
            host_tid=np.concatenate([np.full(len(a), t, np.int64) for t, a, _ in steps_s]),
            host_start=np.concatenate([a for _, a, _ in steps_s]), host_end=np.concatenate([b for _, _, b in steps_s])))


# ---------------------------------------------------------------- allocation, graph capture, task queue

# pinned host memory: allocation, registration and release (the rest of kind malloc / free is device memory)
HOST_ALLOC_RE = re.compile(r"HostAlloc|MallocHost|FreeHost|HostRegister|HostUnregister|hipHostMalloc|hipHostFree", re.I)
EMPTY_CACHE_RE = re.compile(r"^<built-in function _cuda_emptyCache>$|^<built-in method _cuda_emptyCache\b|"
                            r"^torch/cuda/memory\.py\(\d+\): empty_cache$")  # fmt: skip
CAPTURE_BEGIN_RE = re.compile(r"^(cuda|hip)StreamBeginCapture|^cuStreamBeginCapture")
CAPTURE_END_RE = re.compile(r"^(cuda|hip)StreamEndCapture|^cuStreamEndCapture")
INSTANTIATE_RE = re.compile(r"^(cuda|hip)GraphInstantiate|^cuGraphInstantiate")


def _allocation(ctx: RankContext) -> list[Fact]:
    """CUDA / HIP memory allocation calls in the steps (Ascend: analyzers/npu/npu.py's npu_allocation)."""
    tr = ctx.trace
    rt = tr.runtime
    if tr.meta.format == "ascend" or not len(rt):
        return []
    kind = rt["kind"].to_numpy()
    st = ctx.step_of(rt["ts"].to_numpy())
    am = ((kind == "malloc") | (kind == "free")) & (st >= 0)
    if not am.any():
        return []
    host = am & name_mask(rt["name"], HOST_ALLOC_RE)
    dev = am & ~host
    dur = rt["dur"].to_numpy()
    if dev.any():
        tid = rt["tid"].to_numpy(np.int64)
        register(ctx, WhatIfSet.of_intervals("device_alloc", "device memory allocation and free calls", tid[dev],
                                             rt["ts"].to_numpy()[dev], rt["end"].to_numpy()[dev]))  # fmt: skip
    window = ctx.windows_us
    steps = np.array([w.step for w in ctx.windows])
    with_alloc = len(np.intersect1d(np.unique(st[dev]), steps))
    empty = None
    if python_stacks(tr):
        py = tr.python
        empty = int((name_mask(py["name"], EMPTY_CACHE_RE) & (ctx.step_of(py["ts"].to_numpy()) >= 0)).sum())
    a_us, h_us = float(dur[dev].sum()), float(dur[host].sum())
    names = rt["name"][am].value_counts()
    names = names[names > 0].head(6)
    top = np.flatnonzero(am)[np.argsort(-dur[am])[:3]]
    return [DeviceAllocation(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window,
        malloc_count=int((dev & (kind == "malloc")).sum()), free_count=int((dev & (kind == "free")).sum()),
        alloc_us=a_us, alloc_ratio=div(a_us, window), steps_with_alloc_ratio=div(with_alloc, len(steps)),
        host_alloc_count=int(host.sum()), host_alloc_us=h_us, host_alloc_ratio=div(h_us, window),
        empty_cache_calls_count=empty,
        evidence=Evidence(time_ranges_us=[(float(rt["ts"].iat[i]), float(rt["end"].iat[i])) for i in top],
                          events=[str(k) for k in names.index], counts={str(k): int(v) for k, v in names.items()}),
    )]  # fmt: skip


def _graph_capture(ctx: RankContext) -> list[Fact]:
    """CUDA / HIP graph capture and instantiation inside the steps."""
    tr = ctx.trace
    rt = tr.runtime
    if not len(rt):
        return []
    st = ctx.step_of(rt["ts"].to_numpy())
    begin = name_mask(rt["name"], CAPTURE_BEGIN_RE)
    inst = name_mask(rt["name"], INSTANTIATE_RE) & (st >= 0)
    if not (begin & (st >= 0)).any() and not inst.any():
        return []
    end_m = name_mask(rt["name"], CAPTURE_END_RE)
    ts, en, tid = rt["ts"].to_numpy(), rt["end"].to_numpy(), rt["tid"].to_numpy(np.int64)
    spans = []
    for i in np.flatnonzero(begin & (st >= 0)):
        later = np.flatnonzero(end_m & (tid == tid[i]) & (ts >= ts[i]))
        spans.append((tid[i], ts[i], en[later[0]] if len(later) else en[i]))
    parts = spans + [(tid[i], ts[i], en[i]) for i in np.flatnonzero(inst)]
    t, s, e = (np.array(x) for x in zip(*parts))
    register(ctx, WhatIfSet.of_intervals("graph_capture", "graph capture and instantiation in the steps",
                                         t.astype(np.int64), s.astype(float), e.astype(float)))  # fmt: skip
    cap = float(sum(b - a for _, a, b in spans))
    ins = float((en - ts)[inst].sum())
    window = ctx.windows_us
    launches = int(((rt["kind"] == "graph_launch").to_numpy() & (st >= 0)).sum())
    return [GraphCapture(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, captures_count=len(spans), capture_us=cap,
        instantiations_count=int(inst.sum()), instantiate_us=ins, graph_launches_count=launches,
        capture_total_us=cap + ins, capture_ratio=div(cap + ins, window),
        evidence=Evidence(time_ranges_us=[(float(a), float(b)) for _, a, b in parts[:3]],
                          events=sorted({str(n) for n in rt["name"].to_numpy()[(begin | inst) & (st >= 0)]})[:5],
                          counts={"captures": len(spans), "instantiations": int(inst.sum())}),
    )]  # fmt: skip


def _task_queue(ctx: RankContext) -> list[Fact]:
    """torch_npu's task queue: who launches the operators (Ascend traces with a CANN API layer)."""
    tr = ctx.trace
    rt = tr.runtime
    if tr.meta.format != "ascend" or not len(rt):
        return []
    st = ctx.step_of(rt["ts"].to_numpy())
    launch = (rt["kind"] == "launch").to_numpy() & (st >= 0)
    if not launch.any():
        return []
    tid = main_tid(tr)
    tq = tr.extras.get("task_queue")
    enq = deq = 0
    if tq is not None and len(tq):
        tq_in = ctx.step_of(tq["ts"].to_numpy()) >= 0
        k = tq["kind"].astype(str).to_numpy()
        enq, deq = int(((k == "enqueue") & tq_in).sum()), int(((k == "dequeue") & tq_in).sum())
    on_main = rt["tid"].to_numpy() == tid
    n_main = int((launch & on_main).sum())
    cann_main = (st >= 0) & on_main & ~(rt["kind"] == "sync").to_numpy()
    cu = iv.length(iv.union(rt["ts"].to_numpy()[cann_main], rt["end"].to_numpy()[cann_main]))
    window = ctx.windows_us
    return [NpuTaskQueue(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, enqueue_count=enq, dequeue_count=deq,
        queue_enabled=(enq + deq) > 0, launches_count=int(launch.sum()), main_thread_launches_count=n_main,
        main_thread_launch_ratio=div(n_main, int(launch.sum())), main_thread_cann_us=cu,
        main_thread_cann_ratio=div(cu, window),
        evidence=Evidence(counts={"Enqueue": enq, "Dequeue": deq, "launches": int(launch.sum()),
                                  "launches_on_training_thread": n_main},
                          note=f"training thread {tid}; CANN calls other than synchronisation on it"),
    )]  # fmt: skip


# ---------------------------------------------------------------- entry point


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    tr = ctx.trace
    tids = host_tids(tr)
    has_ops = bool(len(tr.cpu_ops))
    host = iv.subtract(top_ops_union(tr, tids), _blocked_union(tr, tids))
    device = _device_union(ctx)
    _register_host_work(ctx, host, tids)
    facts: list[Fact] = []
    facts.extend(_launch(ctx, host, has_ops, device))
    if has_ops:
        facts.extend(_busy(ctx, host, device, tids))
    facts.extend(_sync(ctx))
    facts.extend(_gc(ctx))
    facts.extend(_compilation(ctx, device))
    facts.extend(_allocation(ctx))
    facts.extend(_graph_capture(ctx))
    facts.extend(_task_queue(ctx))
    return facts
