"""Operators' FLOPs and the roofline (the ``compute`` analyzer): the FLOPs and bytes of recognised
ATen operators from their recorded shapes (analyzers/compute/flops.py), kernel time attributed to
the operator that launched it, a roofline class per operator and shape (the paper's rule), and
MFU. On a CPU-only trace the operators' own durations stand for the kernels."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.core.dtypes import FLOAT_RANK
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.roofline import ModelFlopsUtilization, OperatorRoofline, RooflineSummary

from ..context import RankContext
from .activities import Acts, ratio
from .calltree import cat_apply, in_windows, launching_op, outermost_recognised
from .flops import is_recognised, op_cost, shape_signature
from .kernel_classes import CLS_INDEX


# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
U_THR = 0.5  # roofline utilisation threshold (fraction of the vendor peak)
TOP_OPS = 10  # roofline rows per rank


def _text(cats, code: int) -> str:
    return str(cats[code]) if 0 <= code < len(cats) else ""


def _op_costs(ops: pd.DataFrame, rows: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame, np.ndarray]:
    """(groups, group of each row or -1 when not countable, cost per distinct key, key of each row).

    Shapes are parsed once per distinct (name, input_dims, input_types[, concrete_inputs]) value;
    keys that give the same operator + shape + dtype form one group."""
    conc = "concrete_inputs" in ops.columns and isinstance(ops["concrete_inputs"].dtype, pd.CategoricalDtype)
    cols = ["name", "input_dims", "input_types"] + (["concrete_inputs"] if conc else [])
    codes = [ops[c].cat.codes.to_numpy()[rows].astype(np.int64) for c in cols]
    key = np.stack(codes, axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    cats = [ops[c].cat.categories for c in cols]
    recs = []
    for u in uk:
        texts = [_text(cats[j], int(u[j])) for j in range(len(cols))]
        c = op_cost(*texts)
        if c is None:
            recs.append((texts[0], "", "", "", 0.0, 0.0, True, False, 0, 0, 0, 0))
        else:
            sig = shape_signature(texts[1], texts[2])
            m_, k_, n_ = c.mkn or (0, 0, 0)
            recs.append((texts[0], sig, c.dtype, c.category, c.flops, c.bytes, c.exact, True, c.thin, m_, k_, n_))
    u = pd.DataFrame(recs, columns=["op", "shape", "dtype", "category", "flops", "bytes", "exact", "ok", "thin",
                                    "m", "k", "n"])  # fmt: skip
    gid, groups = pd.factorize(pd.MultiIndex.from_frame(u[["op", "shape", "dtype", "category"]]))
    g = groups.to_frame(index=False)
    g.columns = ["op", "shape", "dtype", "category"]
    g["thin"] = u["thin"].groupby(gid).max().to_numpy()  # a group's shape fixes its thinnest dimension
    row_group = np.where(u["ok"].to_numpy()[inv], gid[inv], -1)
    return g, row_group, u, inv


def operator_roofline(ctx: RankContext, k: Acts, total_dev: float, dev: DeviceSpec | None, fp32_tf32: bool,
                      n_devices: int, launcher: np.ndarray | None = None) -> list[Fact]:  # fmt: skip
    """The roofline of the rank's operator groups (the longest TOP_OPS), its summary and MFU. Also
    hands the per-kernel analysis each kernel's call and the calls' costs (``compute_ops``) and,
    on a CPU-only trace, cpu_batch every operator group (``cpu_op_groups``)."""
    ops = ctx.trace.cpu_ops
    found = _counted_calls(ctx, ops)
    if found is None:
        return []
    top, counted = found
    groups, row_group, ucost, uinv = _op_costs(ops, counted)
    ok = row_group >= 0
    counted, row_group, uinv = counted[ok], row_group[ok], uinv[ok]
    if not len(counted):
        return []
    flops_row = ucost["flops"].to_numpy()[uinv]
    bytes_row = ucost["bytes"].to_numpy()[uinv]
    exact_row = ucost["exact"].to_numpy()[uinv]
    gpu = len(k) > 0
    if gpu:
        time_row, kern_row, live, compute_time, attributed_time = _kernel_time(
            ctx, k, top, counted, ucost, uinv, (flops_row, bytes_row, exact_row), launcher)
    else:
        time_row = ops["dur"].to_numpy()[counted]
        kern_row = np.zeros(len(counted), dtype=np.int64)
        live = np.ones(len(counted), dtype=bool)
        compute_time = total_dev
        attributed_time = float(time_row.sum())
    if not live.any():
        return []
    counted, row_group = counted[live], row_group[live]
    flops_row, bytes_row, exact_row = flops_row[live], bytes_row[live], exact_row[live]
    time_row, kern_row = time_row[live], kern_row[live]
    g = _group_totals(groups, counted, row_group, (flops_row, bytes_row, exact_row, time_row, kern_row))
    if not len(g):
        return []
    if not gpu:  # for cpu_batch: every operator group's CPU time, FLOPs and thinnest GEMM dimension
        ctx.shared["cpu_op_groups"] = g[["op", "shape", "dtype", "category", "count", "flops", "time", "thin"]].copy()
    rows, cls_time = _classify(g, gpu, dev, fp32_tf32, n_devices)
    facts = _roofline_facts(ctx, rows[:TOP_OPS], gpu, dev, total_dev)
    facts.append(_summary(ctx, g, len(counted), cls_time, gpu, dev, compute_time, attributed_time))
    facts.append(_mfu(ctx, groups, row_group, flops_row, exact_row, len(counted), dev, fp32_tf32, n_devices, gpu))
    return facts


def _counted_calls(ctx: RankContext, ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(outermost recognised operator of each cpu op or -1, the rows of the outermost recognised
    calls with recorded shapes in the windows), None when there are none."""
    if not len(ops):
        return None
    dcats = ops["input_dims"].cat.categories
    if not any(str(c) for c in dcats):
        return None  # shapes not recorded
    rec_vals, ncodes = cat_apply(ops["name"], is_recognised, dtype=bool)
    if not rec_vals.any():
        return None
    dvals, dcodes = cat_apply(ops["input_dims"], lambda s: bool(s), dtype=bool)
    rec = rec_vals[ncodes] & dvals[dcodes]
    if not rec.any():
        return None
    parent = ops["parent"].to_numpy()
    top = outermost_recognised(parent, int(ops["depth"].max()), rec)
    counted = np.flatnonzero((top == np.arange(len(ops))) & in_windows(ctx, ops["ts"].to_numpy()))
    if not len(counted):
        return None
    return top, counted


def _kernel_time(ctx: RankContext, k: Acts, top: np.ndarray, counted: np.ndarray, ucost: pd.DataFrame,
                 uinv: np.ndarray, cost_rows: tuple, launcher: np.ndarray | None) -> tuple:  # fmt: skip
    """Device time of each call (its kernels' durations), its kernel count, whether it launched any,
    the non-communication kernel time and the time attributed to the calls."""
    flops_row, bytes_row, exact_row = cost_rows
    if launcher is None:
        launcher = launching_op(ctx.trace, ctx.trace.cpu_ops, k.row)
    owner = np.where(launcher >= 0, top[np.clip(launcher, 0, None)], -1)
    pos = pd.Index(counted).get_indexer(owner)
    att = pos >= 0
    # for the per-kernel analysis (analyzers/compute/kernels.py): each kernel's call and the calls' costs
    ctx.shared["compute_ops"] = {
        "kernel_call": pos, "calls": counted, "flops": flops_row, "bytes": bytes_row, "exact": exact_row,
        "dtype": ucost["dtype"].to_numpy()[uinv],
        "category": ucost["category"].to_numpy()[uinv], "op": ucost["op"].to_numpy()[uinv],
        "mkn": ucost[["m", "k", "n"]].to_numpy(np.int64)[uinv], "shape": ucost["shape"].to_numpy()[uinv],
    }  # fmt: skip
    time_row = np.bincount(pos[att], weights=k.dur[att], minlength=len(counted))
    kern_row = np.bincount(pos[att], minlength=len(counted))
    live = kern_row > 0  # operators on CPU tensors launch nothing: not device work
    compute_time = float(k.dur[k.cls != CLS_INDEX["communication"]].sum())
    attributed_time = float(k.dur[att].sum())
    return time_row, kern_row, live, compute_time, attributed_time


def _group_totals(groups: pd.DataFrame, counted: np.ndarray, row_group: np.ndarray, rows: tuple) -> pd.DataFrame:
    """The operator groups with their calls' totals and first call, the longest first; groups
    without time left out."""
    flops_row, bytes_row, exact_row, time_row, kern_row = rows
    ng = len(groups)
    g = groups.copy()
    g["count"] = np.bincount(row_group, minlength=ng)
    g["flops"] = np.bincount(row_group, weights=flops_row, minlength=ng)
    g["bytes"] = np.bincount(row_group, weights=bytes_row, minlength=ng)
    g["time"] = np.bincount(row_group, weights=time_row, minlength=ng)
    g["kernels"] = np.bincount(row_group, weights=kern_row, minlength=ng).astype(np.int64)
    g["inexact"] = np.bincount(row_group, weights=(~exact_row).astype(float), minlength=ng)
    first = np.full(ng, -1, dtype=np.int64)
    first[row_group[::-1]] = counted[::-1]
    g["first_row"] = first
    return g[g["time"] > 0].sort_values("time", ascending=False, kind="stable").reset_index(drop=True)


def _peaks(dev: DeviceSpec | None, fp32_tf32: bool, n_devices: int, category: str,
           dtype: str) -> tuple[str | None, float | None, float | None]:  # fmt: skip
    """(peak's dtype, peak FLOP/s, bandwidth in bytes/s) of the devices for an operator group."""
    if dev is None:
        return None, None, None
    p = dev.matmul_peak(dtype, fp32_tf32) if category in ("gemm", "conv", "attention") else dev.vector_peak()
    bw = dev.hbm_bytes_per_s * n_devices
    return (p[0], p[1] * n_devices, bw) if p else (None, None, bw)


def _classify(g: pd.DataFrame, gpu: bool, dev: DeviceSpec | None, fp32_tf32: bool,
              n_devices: int) -> tuple[list[tuple], dict[str, float]]:  # fmt: skip
    """Each group's rates and roofline class (the paper's rule), and the time of each class."""
    cls_time = {"memory_bound": 0.0, "compute_bound": 0.0, "underutilised": 0.0, "unclassified": 0.0}
    rows = []
    for r in g.itertuples(index=False):
        pk, pp, bp = _peaks(dev, fp32_tf32, n_devices, r.category, r.dtype)
        sec = r.time * 1e-6
        p_ach = r.flops / sec
        b_ach = r.bytes / sec
        ai = r.flops / r.bytes if r.bytes > 0 else None
        label = None
        if gpu and pp and bp and ai is not None:
            ridge = pp / bp
            if ai <= ridge and b_ach >= U_THR * bp:
                label = "memory_bound"
            elif ai > ridge and p_ach >= U_THR * pp:
                label = "compute_bound"
            else:
                label = "underutilised"
        cls_time[label or "unclassified"] += float(r.time)
        rows.append((r, label, pk, pp, bp, p_ach, b_ach, ai))
    return rows, cls_time


def _roofline_facts(ctx: RankContext, rows: list[tuple], gpu: bool, dev: DeviceSpec | None,
                    total_dev: float) -> list[Fact]:  # fmt: skip
    ops = ctx.trace.cpu_ops
    facts: list[Fact] = []
    ots, oend = ops["ts"].to_numpy(), ops["end"].to_numpy()
    for r, label, pk, pp, bp, p_ach, b_ach, ai in rows:
        if label is None:
            note = "no roofline class: " + ("CPU-only trace (no device peak)" if not gpu else
                                            "device not in the peak table" if dev is None else
                                            "no peak for this dtype" if not pp else "no bytes")  # fmt: skip
        else:
            note = "FLOPs/bytes rest on an assumption (flops_exact=false)" if r.inexact else None
        fr = int(r.first_row)
        facts.append(OperatorRoofline(
            rank=ctx.rank, operator=str(r.op), category=str(r.category), shape=str(r.shape), dtype=str(r.dtype),
            time_source="device" if gpu else "cpu", calls_count=int(r.count), kernels_count=int(r.kernels),
            time_us=float(r.time), share_of_time_ratio=ratio(r.time / total_dev) if total_dev else 0.0,
            flops=float(r.flops), bytes=float(r.bytes), flops_exact=not r.inexact,
            achieved_flops_per_s=float(p_ach), achieved_gbps=float(b_ach) / 1e9,
            arithmetic_intensity_flop_per_byte=ai,
            peak_dtype=pk, peak_flops_per_s=pp, peak_gbps=bp / 1e9 if bp else None,
            ridge_point_flop_per_byte=(pp / bp) if (pp and bp) else None,
            compute_utilisation_ratio=ratio(p_ach / pp) if pp else None,
            bandwidth_utilisation_ratio=ratio(b_ach / bp) if bp else None,
            roofline_class=label, utilisation_threshold_ratio=U_THR,
            evidence=Evidence(
                time_ranges_us=[(float(ots[fr]), float(oend[fr]))] if fr >= 0 else [],
                events=[str(r.op)], counts={"calls": int(r.count), "kernels": int(r.kernels)}, note=note,
            ),
        ))  # fmt: skip
    return facts


def _summary(ctx: RankContext, g: pd.DataFrame, calls: int, cls_time: dict[str, float], gpu: bool,
             dev: DeviceSpec | None, compute_time: float, attributed_time: float) -> RooflineSummary:  # fmt: skip
    classified = sum(v for kk, v in cls_time.items() if kk != "unclassified")
    return RooflineSummary(
        rank=ctx.rank, time_source="device" if gpu else "cpu", device=dev.name if dev else None,
        operators_count=len(g), attributed_time_us=attributed_time,
        attributed_time_ratio=ratio(attributed_time / compute_time) if compute_time else 0.0,
        memory_bound_time_us=cls_time["memory_bound"], compute_bound_time_us=cls_time["compute_bound"],
        underutilised_time_us=cls_time["underutilised"], unclassified_time_us=cls_time["unclassified"],
        memory_bound_ratio=ratio(cls_time["memory_bound"] / classified) if classified else None,
        compute_bound_ratio=ratio(cls_time["compute_bound"] / classified) if classified else None,
        underutilised_ratio=ratio(cls_time["underutilised"] / classified) if classified else None,
        utilisation_threshold_ratio=U_THR,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            counts={"operator_shapes": len(g), "operator_calls": calls},
            note="class ratios are of the time of classified operator groups; attributed_time_ratio = kernel "
                 "time attributed to recognised operators / non-communication kernel time"
                 if gpu else "CPU-only trace: no device peak, no roofline classes",
        ),
    )  # fmt: skip


def _dominant_dtype(groups: pd.DataFrame, row_group: np.ndarray, flops_row: np.ndarray) -> str:
    """The float dtype with the most FLOPs, of matmul-class calls when they have any."""
    grp_cat = groups["category"].to_numpy()[row_group]
    grp_dt = groups["dtype"].to_numpy()[row_group]
    floaty = np.isin(grp_dt, list(FLOAT_RANK))
    mmask = np.isin(grp_cat, ["gemm", "conv", "attention"]) & floaty
    pool = mmask if flops_row[mmask].sum() > 0 else floaty
    if flops_row[pool].sum() > 0:
        s = pd.Series(flops_row[pool]).groupby(grp_dt[pool]).sum()
        return str(s.idxmax())
    return "unknown"


def _mfu(ctx: RankContext, groups: pd.DataFrame, row_group: np.ndarray, flops_row: np.ndarray,
         exact_row: np.ndarray, calls: int, dev: DeviceSpec | None, fp32_tf32: bool, n_devices: int,
         gpu: bool) -> ModelFlopsUtilization:  # fmt: skip
    tot_flops = float(flops_row.sum())
    wtot = ctx.windows_us
    dom = _dominant_dtype(groups, row_group, flops_row)
    peak_key, peak = None, None
    if dev is not None:
        p = dev.matmul_peak(dom, fp32_tf32)
        if p is not None:
            peak_key, peak = p[0], p[1] * n_devices
    inexact = float(flops_row[~exact_row].sum())
    return ModelFlopsUtilization(
        rank=ctx.rank, flops=tot_flops, flops_per_step=tot_flops / max(1, len(ctx.windows)),
        window_time_us=wtot, achieved_flops_per_s=tot_flops / (wtot * 1e-6) if wtot > 0 else 0.0,
        dominant_dtype=dom, peak_dtype=peak_key, peak_flops_per_s=peak,
        mfu_ratio=ratio(tot_flops / (wtot * 1e-6) / peak) if (peak and wtot > 0) else None,
        inexact_flops_ratio=ratio(inexact / tot_flops) if tot_flops else 0.0,
        device=dev.name if dev else None, devices_count=n_devices,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            counts={"operator_calls": calls, "steps": len(ctx.windows)},
            note="MFU = FLOPs of recognised operators (outermost recognised operator of each call tree"
                 + (", that launched kernels" if gpu else ", run on the CPU")
                 + ") / (step window time × peak of the dominant matmul dtype × devices)"
                 + ("" if dev else "; device unknown: no peak, no MFU"),
        ),
    )  # fmt: skip
