"""The AI Core and AI CPU of an Ascend NPU: AI CPU tasks and the slow ones (``npu_aicpu_ops``), the
bound pipe of each AI Core / Vector task (``npu_pipe_utilisation``), block dim against the
device's cores (``npu_block_dim``) and the AI Core clock (``npu_aicore_frequency``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import NpuAicoreFrequency, NpuAicpuOps, NpuBlockDim, NpuPipeUtilisation

from ..context import RankContext
from .tasks import col, ratio

AICPU_SLOW_US = 20.0  # msprof-analyze: AI CPU operators over 20 µs are reported
PIPE_BOUND = 0.8  # a pipe busy for 80% of the task's time bounds it
WIDE_DTYPES = ("INT64", "DOUBLE", "COMPLEX", "BOOL", "UINT64")
# (device model, AI Core (cube) cores, AI Vector cores); CANN's info.json gives the exact numbers,
# which torch_npu does not export: these are the published SKU figures, approximate (docs/devices.md)
CORES = [("910b1", 24, 48), ("910b2", 24, 48), ("910b3", 20, 40), ("910b4", 20, 40), ("910a", 32, 0),
         ("910", 32, 0)]  # fmt: skip

_PIPES = {"mac": ("aic_mac_ratio",), "scalar": ("aic_scalar_ratio", "aiv_scalar_ratio"), "mte1": ("aic_mte1_ratio",),
          "mte2": ("aic_mte2_ratio", "aiv_mte2_ratio"), "mte3": ("aiv_mte3_ratio",), "fixpipe": ("aic_fixpipe_ratio",),
          "vec": ("aiv_vec_ratio",)}  # fmt: skip


def aicpu(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k):
        return None
    core = col(k, "core_type").str.upper() + " " + col(k, "task_type").str.upper()
    is_cpu = core.str.contains("AI_CPU").to_numpy()
    dur = k["dur"].to_numpy(float)
    total = float(dur.sum())
    slow = is_cpu & (dur >= AICPU_SLOW_US)
    dtypes = col(k, "input_dtypes").to_numpy()[slow]
    wide = sum(any(w in str(d).upper() for w in WIDE_DTYPES) for d in dtypes)
    order = np.argsort(-dur[slow])
    types = col(k, "op_type").to_numpy()[slow][order]
    names = k["name"].astype(str).to_numpy()[slow][order]
    return NpuAicpuOps(
        rank=ctx.rank, device_compute_us=total, aicpu_count=int(is_cpu.sum()), aicpu_us=float(dur[is_cpu].sum()),
        aicpu_ratio=ratio(dur[is_cpu].sum(), total), threshold_us=AICPU_SLOW_US, slow_count=int(slow.sum()),
        slow_us=float(dur[slow].sum()), slow_ratio=ratio(dur[slow].sum(), total), wide_dtype_count=int(wide),
        op_types=list(dict.fromkeys(t for t in types if t))[:10],
        dtypes=sorted({x for d in dtypes for x in str(d).split(";") if x})[:10],
        evidence=Evidence(events=list(dict.fromkeys(names))[:5], counts={"tasks": int(len(k))},
                          note=f"AI CPU = Accelerator Core / Task Type AI_CPU; slow = {AICPU_SLOW_US:g} µs or more"),
    )  # fmt: skip


def pipes(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    cols = {p: [c for c in cs if c in k.columns] for p, cs in _PIPES.items()}
    if not len(k) or not any(cols.values()):
        return None
    ratios = pd.DataFrame({p: k[cs].max(axis=1, skipna=True) if cs else np.nan for p, cs in cols.items()}, index=k.index)
    has = ratios.notna().any(axis=1) & (ratios.fillna(0).sum(axis=1) > 0)
    if not has.any():
        return None
    r = ratios[has].fillna(0.0)
    dur = k.loc[has, "dur"].to_numpy(float)
    best = r.idxmax(axis=1).to_numpy()
    top = r.max(axis=1).to_numpy()
    bound = top >= PIPE_BOUND
    bound_us = {p: float(dur[bound & (best == p)].sum()) for p in _PIPES if (bound & (best == p)).any()}
    types = col(k.loc[has], "op_type").to_numpy()[~bound]
    order = np.argsort(-dur[~bound])
    return NpuPipeUtilisation(
        rank=ctx.rank, bound_threshold_ratio=PIPE_BOUND, ops_count=int(has.sum()), ops_us=float(dur.sum()),
        unbound_count=int((~bound).sum()), unbound_us=float(dur[~bound].sum()), unbound_ratio=ratio(dur[~bound].sum(), dur.sum()),
        bound_us=bound_us, top_unbound=list(dict.fromkeys(t for t in types[order] if t))[:8],
        evidence=Evidence(events=list(dict.fromkeys(k.loc[has, "name"].astype(str).to_numpy()[~bound][order]))[:5],
                          note="bound pipe = the largest of the *_ratio pipe metrics of the task"),
    )  # fmt: skip


def _cores(device: str | None) -> tuple[int | None, int | None]:
    n = (device or "").lower().replace(" ", "")
    for key, cube, vec in CORES:
        if key in n:
            return cube, vec or None
    return None, None


def block_dim(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k) or "block_dim" not in k.columns:
        return None
    bd = k["block_dim"].to_numpy(np.int64)
    ok = bd > 0
    if not ok.any():
        return None
    device = ctx.trace.meta.device_name
    cube, vec = _cores(device)
    dur = k["dur"].to_numpy(float)
    core = col(k, "core_type").str.upper().to_numpy()
    cores = np.where(np.char.find(core.astype(str), "VECTOR") >= 0, vec or 0, cube or 0)
    known = ok & (cores > 0)
    not_mult = known & (bd % np.maximum(cores, 1) != 0) & (bd > cores)
    under = known & (bd < cores)
    return NpuBlockDim(
        rank=ctx.rank, device=device, ai_cores_count=cube, vector_cores_count=vec, tasks_count=int(ok.sum()),
        tasks_us=float(dur[ok].sum()), not_multiple_count=int(not_mult.sum()), not_multiple_us=float(dur[not_mult].sum()),
        not_multiple_ratio=ratio(dur[not_mult].sum(), dur[ok].sum()), under_filled_count=int(under.sum()),
        under_filled_us=float(dur[under].sum()),
        evidence=Evidence(note="core counts unknown (device model not recorded): nothing compared" if cube is None
                          else "not a multiple: block dim above the core count and not divisible by it"),
    )  # fmt: skip


def frequency(ctx: RankContext) -> Fact | None:
    f = ctx.trace.extras.get("aicore_freq")
    if f is None or len(f) < 1:
        return None
    f = f.sort_values("ts")
    mhz = f["mhz"].to_numpy(float)
    ok = ~np.isnan(mhz)
    if not ok.any():
        return None
    f, mhz = f[ok], mhz[ok]
    nominal = float(mhz.max())
    ts = f["ts"].to_numpy(float)
    end = float(ctx.trace.time_span()[1])
    spans = np.diff(np.append(ts, max(end, ts[-1])))
    below = float(spans[mhz < nominal].sum())
    return NpuAicoreFrequency(
        rank=ctx.rank, samples_count=int(len(mhz)), nominal_mhz=nominal, min_mhz=float(mhz.min()),
        drop_ratio=ratio(nominal - mhz.min(), nominal), below_nominal_ratio=ratio(below, spans.sum()),
    )  # fmt: skip


__all__ = ["AICPU_SLOW_US", "CORES", "PIPE_BOUND", "WIDE_DTYPES", "aicpu", "block_dim", "frequency", "pipes"]
