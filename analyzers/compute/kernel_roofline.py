"""The roofline per kernel (the ``kernels`` analyzer): every kernel inherits the FLOPs and bytes of
the operator call that launched it (the outermost recognised operator, as for operator_roofline),
split over the call's kernels by duration; matrix kernels take a matmul's FLOPs and helpers
(split-K reductions, epilogues, layout transforms) none."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.roofline import KernelRoofline, KernelRooflineSummary

from ..context import RankContext
from .activities import Acts, ratio
from .kernel_classes import CLASSES, CLS_INDEX
from .kernel_names import short_kernel_name, tensor_core_kind
from .roofline import U_THR


# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
MIN_KERNEL_US = 10.0  # below this a kernel's time is launch latency, not work: no roofline or grid verdict
TOP_KERNELS = 10  # kernel_roofline facts per rank

_MATMUL = (CLS_INDEX["gemm"], CLS_INDEX["conv"], CLS_INDEX["attention"])
_COMM = CLS_INDEX["communication"]
_MEM = CLS_INDEX["memory"]


# --- per-kernel roofline -----------------------------------------------------------------------
def attribution(ctx: RankContext, k: Acts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel of k: (call index or -1, FLOPs, bytes, exact, dtype) inherited from its call."""
    n = len(k)
    info = ctx.shared.get("compute_ops")
    call = np.full(n, -1, dtype=np.int64)
    flops, nbytes = np.zeros(n), np.zeros(n)
    exact = np.ones(n, dtype=bool)
    dtype = np.full(n, "", dtype=object)
    if not info or len(info["kernel_call"]) != n:
        return call, flops, nbytes, exact, dtype
    call = np.asarray(info["kernel_call"], dtype=np.int64)
    att = call >= 0
    if not att.any():
        return call, flops, nbytes, exact, dtype
    cat = np.asarray(info["category"], dtype=object)
    c = np.where(att, call, 0)
    ccat = cat[c]
    matmul_call = np.isin(ccat, ["gemm", "conv", "attention"])
    uid, inv = np.unique(k.name_id, return_inverse=True)
    aux = np.array([tensor_core_kind(str(k.names[i])) == "aux" for i in uid], dtype=bool)[inv.reshape(-1)]
    kmat = np.isin(k.cls, _MATMUL) & ~aux
    kmem = k.cls == _MEM
    kvec = np.isin(k.cls, [CLS_INDEX["elementwise"], CLS_INDEX["reduction"], CLS_INDEX["norm"]])
    primary = np.where(matmul_call, kmat, np.where(ccat == "memory", kmem, kvec)) & att
    ncalls = len(info["calls"])
    has_primary = np.bincount(c[primary], minlength=ncalls) > 0
    primary |= att & ~has_primary[c]  # a call whose kernels match nothing: all its kernels share it
    denom = np.bincount(c[primary], weights=k.dur[primary], minlength=ncalls)
    share = np.where(primary & (denom[c] > 0), k.dur / np.where(denom[c] > 0, denom[c], 1.0), 0.0)
    flops = np.asarray(info["flops"], float)[c] * share
    nbytes = np.asarray(info["bytes"], float)[c] * share
    exact = np.where(att, np.asarray(info["exact"], bool)[c], True)
    dtype = np.where(att, np.asarray(info["dtype"], dtype=object)[c], "")
    return np.where(att, call, -1), flops, nbytes, exact, dtype


def kernel_roofline(ctx: RankContext, act: Acts, k: Acts, dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int,
                    att: tuple, blocks: np.ndarray, sms: int | None) -> list[Fact]:  # fmt: skip
    """The roofline of the longest kernel names (TOP_KERNELS) and its summary."""
    call, flops, nbytes, exact, dtype = att
    live = (call >= 0) & (k.cls != _COMM) & ((flops > 0) | (nbytes > 0))  # helpers of a call inherit nothing
    kernels_time = float(k.dur[k.cls != _COMM].sum())
    if not live.any() or kernels_time <= 0:
        return []
    g, fill, med_blocks = _kernel_groups(ctx, k, att, live, blocks, sms)
    rows, cls_time, starved = _classify(g, dev, fp32_tf32, n_dev)
    facts = _kernel_facts(ctx, k, rows[:TOP_KERNELS], fill, med_blocks, float(act.dur.sum()))
    facts.append(_summary(ctx, k, g, live, kernels_time, cls_time, starved, dev))
    return facts


def _kernel_groups(ctx: RankContext, k: Acts, att: tuple, live: np.ndarray, blocks: np.ndarray,
                   sms: int | None) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.Series]:  # fmt: skip
    """The attributed launches by kernel name, the longest first (time, launches, FLOPs, bytes, class,
    and the dtype and operator with the most time), their SM fill and median grid."""
    call, flops, nbytes, exact, dtype = att
    info = ctx.shared["compute_ops"]
    opname = np.asarray(info["op"], dtype=object)
    idx = np.flatnonzero(live)
    df = pd.DataFrame({"name": k.name_id[idx], "dur": k.dur[idx], "flops": flops[idx], "bytes": nbytes[idx],
                       "inexact": (~exact[idx]).astype(int), "cls": k.cls[idx], "dtype": dtype[idx],
                       "op": opname[call[idx]], "blocks": blocks[idx]})  # fmt: skip
    g = df.groupby("name", sort=False).agg(time=("dur", "sum"), n=("dur", "size"), flops=("flops", "sum"),
                                            bytes=("bytes", "sum"), inexact=("inexact", "sum"),
                                            cls=("cls", "first"))  # fmt: skip
    for col in ("dtype", "op"):  # the value with the most time
        top = df.groupby(["name", col])["dur"].sum().reset_index().sort_values("dur", kind="stable")
        g[col] = top.groupby("name")[col].last()
    g = g.sort_values("time", ascending=False, kind="stable")
    fill = None
    if sms:
        b = df["blocks"].to_numpy()
        fk = np.where(b > 0, np.minimum(1.0, b / sms), np.nan)
        w = np.where(np.isfinite(fk), df["dur"].to_numpy(), 0.0)
        fill = pd.DataFrame({"name": df["name"], "fw": np.nan_to_num(fk) * w, "w": w}).groupby("name").sum()
    med_blocks = df[df["blocks"] > 0].groupby("name")["blocks"].median()
    return g, fill, med_blocks


def _peaks(dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int, cls: int,
           dt: str) -> tuple[str | None, float | None, float | None]:  # fmt: skip
    if dev is None:
        return None, None, None
    p = dev.matmul_peak(dt, fp32_tf32) if cls in _MATMUL else dev.vector_peak()
    bw = dev.hbm_bytes_per_s * n_dev
    return (p[0], p[1] * n_dev, bw) if p else (None, None, bw)


def _classify(g: pd.DataFrame, dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int) -> tuple[list, dict, tuple]:
    """Each kernel name's rates and roofline class, the time of each class, and the long kernels
    starved of bandwidth or compute: (time, bytes, bandwidth peak, compute-starved time, names)."""
    cls_time = {"memory_bound": 0.0, "compute_bound": 0.0, "underutilised": 0.0, "unclassified": 0.0}
    bw_starved = bw_starved_bytes = cmp_starved = 0.0
    bw_peak_any = None
    rows = []
    starved_names: list[tuple[float, int]] = []
    for name_id, r in g.iterrows():
        pk, pp, bp = _peaks(dev, fp32_tf32, n_dev, int(r["cls"]), str(r["dtype"]))
        sec = r["time"] * 1e-6
        p_ach, b_ach = r["flops"] / sec, r["bytes"] / sec
        ai = r["flops"] / r["bytes"] if r["bytes"] > 0 else None
        label = None
        if pp and bp and ai is not None:
            ridge = pp / bp
            if ai <= ridge and b_ach >= U_THR * bp:
                label = "memory_bound"
            elif ai > ridge and p_ach >= U_THR * pp:
                label = "compute_bound"
            else:
                label = "underutilised"
            long = r["time"] / r["n"] >= MIN_KERNEL_US
            if long and ai <= ridge and b_ach < U_THR * bp:
                bw_starved += float(r["time"])
                bw_starved_bytes += float(r["bytes"])
                bw_peak_any = bp
                starved_names.append((float(r["time"]), int(name_id)))
            elif long and ai > ridge and p_ach < U_THR * pp and int(r["cls"]) in _MATMUL:
                cmp_starved += float(r["time"])
        cls_time[label or "unclassified"] += float(r["time"])
        rows.append((name_id, r, label, pk, pp, bp, p_ach, b_ach, ai))
    return rows, cls_time, (bw_starved, bw_starved_bytes, bw_peak_any, cmp_starved, starved_names)


def _kernel_facts(ctx: RankContext, k: Acts, rows: list, fill: pd.DataFrame | None, med_blocks: pd.Series,
                  total_dev: float) -> list[Fact]:  # fmt: skip
    facts: list[Fact] = []
    for name_id, r, label, pk, pp, bp, p_ach, b_ach, ai in rows:
        full = str(k.names[name_id])
        sf = None
        if fill is not None and name_id in fill.index and fill.loc[name_id, "w"] > 0:
            sf = float(fill.loc[name_id, "fw"] / fill.loc[name_id, "w"])
        mb = int(med_blocks[name_id]) if name_id in med_blocks.index else None
        facts.append(KernelRoofline(
            rank=ctx.rank, kernel=short_kernel_name(full), kernel_name=full[:200], kernel_class=CLASSES[int(r["cls"])],
            operator=str(r["op"]), dtype=str(r["dtype"]) or "unknown", launches_count=int(r["n"]),
            time_us=float(r["time"]), share_of_time_ratio=ratio(r["time"] / total_dev) if total_dev else 0.0,
            mean_duration_us=float(r["time"] / r["n"]),
            flops=float(r["flops"]), bytes=float(r["bytes"]), flops_exact=not bool(r["inexact"]),
            achieved_flops_per_s=float(p_ach), achieved_gbps=float(b_ach) / 1e9, arithmetic_intensity_flop_per_byte=ai,
            peak_dtype=pk, peak_flops_per_s=pp, peak_gbps=bp / 1e9 if bp else None,
            ridge_point_flop_per_byte=(pp / bp) if (pp and bp) else None,
            compute_utilisation_ratio=ratio(p_ach / pp) if pp else None,
            bandwidth_utilisation_ratio=ratio(b_ach / bp) if bp else None, roofline_class=label,
            grid_blocks=mb, sm_fill_ratio=ratio(sf) if sf is not None else None, utilisation_threshold_ratio=U_THR,
            evidence=Evidence(
                time_ranges_us=[ctx.span], events=[full[:200]], counts={"launches": int(r["n"])},
                note="FLOPs/bytes of each launching call split over its kernels by duration (matrix kernels take "
                     "a matmul's FLOPs, helpers none)" + ("; rests on an assumption (flops_exact=false)"
                                                         if r["inexact"] else ""),
            ),
        ))  # fmt: skip
    return facts


def _summary(ctx: RankContext, k: Acts, g: pd.DataFrame, live: np.ndarray, kernels_time: float,
             cls_time: dict[str, float], starved: tuple, dev: DeviceSpec | None) -> KernelRooflineSummary:  # fmt: skip
    bw_starved, bw_starved_bytes, bw_peak_any, cmp_starved, starved_names = starved
    classified = sum(v for kk, v in cls_time.items() if kk != "unclassified")
    attributed = float(k.dur[live].sum())
    return KernelRooflineSummary(
        rank=ctx.rank, device=dev.name if dev else None, kernels_time_us=kernels_time, attributed_time_us=attributed,
        attributed_time_ratio=ratio(attributed / kernels_time), kernel_names_count=len(g),
        memory_bound_time_us=cls_time["memory_bound"], compute_bound_time_us=cls_time["compute_bound"],
        underutilised_time_us=cls_time["underutilised"], unclassified_time_us=cls_time["unclassified"],
        memory_bound_ratio=ratio(cls_time["memory_bound"] / classified) if classified else None,
        compute_bound_ratio=ratio(cls_time["compute_bound"] / classified) if classified else None,
        underutilised_ratio=ratio(cls_time["underutilised"] / classified) if classified else None,
        min_kernel_us=MIN_KERNEL_US, bandwidth_starved_time_us=bw_starved,
        bandwidth_starved_ratio=ratio(bw_starved / kernels_time),
        bandwidth_starved_utilisation_ratio=(ratio(bw_starved_bytes / (bw_starved * 1e-6) / bw_peak_any)
                                             if bw_starved > 0 and bw_peak_any else None),
        compute_starved_time_us=cmp_starved, compute_starved_ratio=ratio(cmp_starved / kernels_time),
        utilisation_threshold_ratio=U_THR,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[short_kernel_name(str(k.names[i])) for _, i in sorted(starved_names, reverse=True)[:3]],
            counts={"kernels": len(g), "launches": int(live.sum())},
            note="classes judged per kernel name on its own FLOPs, bytes and time; events = the longest "
                 "bandwidth-starved kernels",
        ),
    )  # fmt: skip
