"""How operators run on an Ascend NPU: format conversion (TransData / Cast / transpose time,
private formats: ``npu_format_conversion``) and dynamic shapes (OP State, online compilation:
``npu_dynamic_shape``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import NpuDynamicShape, NpuFormatConversion

from ..context import RankContext
from .tasks import col, ratio, window_mask, window_us

CONVERSION_TYPES = {"TransData", "Cast", "TransposeD", "Transpose", "TransDataRNN"}
PRIVATE_FORMATS = ("NC1HWC0", "FRACTAL_Z", "FRACTAL_NZ", "NDC1HWC0", "FRACTAL_Z_3D", "C1HWNCoC0")


def format_conversion(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k):
        return None
    typ = col(k, "op_type")
    name = k["name"].astype(str)
    is_td = (typ == "TransData") | (typ.isin(["", "nan"]) & name.str.contains("TransData"))
    is_cast = (typ == "Cast") | (typ.isin(["", "nan"]) & name.str.contains(r"(?:^|_)Cast", regex=True))
    conv = is_td | is_cast | typ.isin(CONVERSION_TYPES)
    dur = k["dur"].to_numpy(float)
    fmts = col(k, "input_formats") + ";" + col(k, "output_formats")
    private = fmts.str.contains("|".join(PRIVATE_FORMATS))
    return NpuFormatConversion(
        rank=ctx.rank, device_compute_us=float(dur.sum()), transdata_count=int(is_td.sum()),
        transdata_us=float(dur[is_td.to_numpy()].sum()), cast_count=int(is_cast.sum()),
        cast_us=float(dur[is_cast.to_numpy()].sum()), conversion_us=float(dur[conv.to_numpy()].sum()),
        conversion_ratio=ratio(dur[conv.to_numpy()].sum(), dur.sum()), private_format_count=int(private.sum()),
        evidence=Evidence(events=list(dict.fromkeys(name[conv].tolist()))[:5]),
    )  # fmt: skip


def dynamic_shape(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    tr = ctx.trace
    state = col(k, "op_state").str.lower()
    known = state.isin(["dynamic", "static"])
    dyn = int((state == "dynamic").sum())
    rt = tr.runtime
    names = rt["name"].astype(str) if len(rt) else pd.Series([], dtype=str)
    in_win = window_mask(ctx, rt["ts"].to_numpy(float)) if len(rt) else np.zeros(0, bool)
    is_compile = names.str.endswith("@opCompile").to_numpy() & in_win
    is_cae = names.str.endswith("aclopCompileAndExecute").to_numpy() & in_win
    calls = int(is_compile.sum() or is_cae.sum())
    api = tr.extras.get("api_statistic")
    if not len(rt) and api is not None and len(api):  # no timeline: the API statistics still count them
        m = api["api_name"].astype(str).isin(["opCompile", "aclopCompileAndExecute"])
        calls = int(api.loc[m, "count"].max()) if m.any() else 0
    if not int(known.sum()) and not calls:
        return None
    sel = is_compile if is_compile.any() else is_cae
    comp_us = float(rt["dur"].to_numpy(float)[sel].sum()) if len(rt) else 0.0
    win = window_us(ctx)
    return NpuDynamicShape(
        rank=ctx.rank, state_known_count=int(known.sum()), dynamic_count=dyn, dynamic_ratio=ratio(dyn, int(known.sum())),
        compile_calls_count=calls, compile_us=comp_us, window_us=win, compile_ratio=ratio(comp_us, win),
        jit_compile_hint=calls > 0, host_cache_capacity=tr.meta.env.get("HOST_CACHE_CAPACITY") if tr.meta.env else None,
        evidence=Evidence(events=list(dict.fromkeys(k.loc[(state == "dynamic").to_numpy(), "name"].astype(str)))[:5]),
    )  # fmt: skip


__all__ = ["CONVERSION_TYPES", "PRIVATE_FORMATS", "dynamic_shape", "format_conversion"]
