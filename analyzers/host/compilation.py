"""Compilation (``compilation``, per step that compiles / autotunes, and aggregate when any
compile-related event exists): compile and autotune time, compiled-region runs, guard checks,
recompilation ids, and the per-call cost of running compiled code (regions per step, graph-break
resume frames, host time in the compiled calls outside their generated code); cuDNN / MIOpen
algorithm searches of convolutions; the ``compile``, ``autotune`` and ``compile_wrappers`` what-if
sets."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import Compilation

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, main_tid, name_mask, pick_steps, python_stacks, step_pos, window_arrays
from ..whatif.sets import WhatIfSet, register
from .syncs import enclosing_op

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
# the compiled call itself (forward region, AOTAutograd's autograd function and its backward) and
# the generated code it runs: what lies inside the first and outside the second is per-call cost
CALL_RE = re.compile(r"^Torch-Compiled Region|^CompiledFunction|^Compiled Function")
FXGRAPH_RE = re.compile(r"CompiledFxGraph")
RESUME_RE = re.compile(r"torch_dynamo_resume_in_")


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
    inner = enclosing_op(ops, rt["tid"].to_numpy()[syncs], rt["ts"].to_numpy()[syncs], rt["end"].to_numpy()[syncs])
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


def _candidates(tr) -> dict:
    """Per frame, the rows whose names match any compile-related pattern (None: no candidate)."""
    pre = {}
    for f in ("cpu_ops", "annotations", "python", "runtime"):
        fr = getattr(tr, f)
        m = name_mask(fr["name"], ANY_COMPILE_RE) if len(fr) else np.zeros(0, bool)
        pre[f] = np.flatnonzero(m) if m.any() else None
    return pre


def _register_compile(ctx: RankContext, CA: iv.Intervals, A: iv.Intervals, v_s: np.ndarray, v_e: np.ndarray,
                      v_tid: np.ndarray) -> None:  # fmt: skip
    """The ``compile`` and ``autotune`` what-if sets: on the training thread, and the algorithm
    searches on their own threads."""
    tid = main_tid(ctx.trace)
    if tid is not None and len(CA[0]):
        register(ctx, WhatIfSet.of_intervals("compile", "compilation and autotuning on the host", tid, CA[0], CA[1]))
    if tid is not None and len(A[0]):
        register(ctx, WhatIfSet.of_intervals("autotune", "kernel autotuning and algorithm searches", tid, A[0], A[1]))
    if len(v_s):  # on their own threads (backward convolutions run on the autograd engine's)
        search = _search_set(ctx, v_s, v_e, v_tid)
        register(ctx, search)
        register(ctx, WhatIfSet("autotune", "kernel autotuning and algorithm searches", search.host_tid,
                                search.host_start, search.host_end, kernels=search.kernels, drop_waits=True))


def _blocks(ctx: RankContext, steps: np.ndarray, x: iv.Intervals) -> np.ndarray:
    """Intervals of the set starting in each step."""
    out = np.zeros(len(steps))
    pos, ok = step_pos(steps, ctx.step_of(x[0]))
    np.add.at(out, pos[ok], 1)
    return out


def _region_ids(ctx: RankContext, pre: dict) -> tuple[list[str], int | None]:
    """Compiled-region ids ('frame/compile') run in the steps, in order, and the largest compile id."""
    tr = ctx.trace
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
    return ids, max_id


def compilation(ctx: RankContext, device: iv.Intervals | None = None) -> list[Fact]:
    """``compilation`` facts: the steps that compile or autotune most, and the aggregate."""
    tr = ctx.trace
    pre = _candidates(tr)
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
    _register_compile(ctx, CA, A, v_s, v_e, v_tid)
    cu, au, ru, cau = (iv.overlap_length(ws, we, x) for x in (C, A, R, CA))
    cn, an, rn = _blocks(ctx, steps, C), _blocks(ctx, steps, A), _blocks(ctx, steps, R)
    l_step = ctx.step_of(l_s)
    ln, lu = np.zeros(len(steps)), np.zeros(len(steps))
    pos, ok = step_pos(steps, l_step)
    np.add.at(ln, pos[ok], 1)
    np.add.at(lu, pos[ok], (l_e - l_s)[ok])
    ids, max_id = _region_ids(ctx, pre)
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


def _compiled_spans(ctx: RankContext, pre: dict
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, iv.Intervals]:  # fmt: skip
    """(step, frame id) of each forward region with an id; (thread, start, end) of each compiled
    call; the generated code's union."""
    tr = ctx.trace
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
    return r_step, r_frame, ct, cs, ce, FX


def _wrapper_time(ctx: RankContext, ct: np.ndarray, cs: np.ndarray, ce: np.ndarray, FX: iv.Intervals, ws: np.ndarray,
                  we: np.ndarray) -> np.ndarray | None:  # fmt: skip
    """Wrapper time per step: inside a compiled call, outside the generated code, per thread (None
    without generated-code marks: unknown); registers the ``compile_wrappers`` what-if set."""
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
    return iv.overlap_length(ws, we, W) if len(FX[0]) else None  # no generated-code marks: unknown


def _compiled_calls(ctx: RankContext, pre: dict, device: iv.Intervals | None, ws: np.ndarray, we: np.ndarray,
                    steps: np.ndarray):
    """Per-call cost of running compiled code (fields of ``compilation``), as a function of the
    step indices a fact covers; registers the ``compile_wrappers`` what-if set."""
    tr = ctx.trace
    n = len(steps)
    # forward regions: frame id per call, per step
    r_step, r_frame, ct, cs, ce, FX = _compiled_spans(ctx, pre)
    wrap = _wrapper_time(ctx, ct, cs, ce, FX, ws, we)
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
