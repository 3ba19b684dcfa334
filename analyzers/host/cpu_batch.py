"""Thin matrix multiplies on a CPU-only trace, and the per-sample time at a larger batch.

A batch of a few samples makes every GEMM a few rows tall: the kernel streams the whole weight
matrix for a handful of rows, far below the FMA units' rate, and the per-step costs that do not
grow with the batch (the optimizer's pass over the parameters, operator dispatch, Python) are
paid for those few samples. The prediction needs the CPU's peak, which only the monitor's
environment record gives (model, vector flags, clock); see hermes_kb.core.cpus. Where the trace has
linear layers, a GEMM counts as thin only when its thinnest dimension is the rows those layers
see (the batch): a narrow output layer at a large batch is not a small batch."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.core.cpus import fp32_fma_peak_per_core
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.roofline import CpuThinMatmuls

from ..context import RankContext
from .dispatch import ops_in_optimizer, optimizer_calls

THIN_MAX_ROWS = 16
# from about 64 rows on, CPU GEMM micro-kernels (register blocks of tens of rows) keep the FMA
# units busy and one more row costs its FLOPs at close to the peak rate
TARGET_ROWS = 64
# share of the FMA peak a 64-row FP32 GEMM reaches at the slow end (oneDNN/MKL reach 70-95% on
# large FP32 GEMMs; a 64-row one is at the low end of that)
ATTAINABLE = 0.7


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    c = np.cumsum(w)
    return float(v[np.searchsorted(c, 0.5 * c[-1])])


def _optimizer_and_operators(ctx: RankContext) -> tuple[float, float]:
    """(time in optimizer.step() calls, time of the top-level operators outside them) in the
    analysed steps."""
    calls = optimizer_calls(ctx)
    opt = float((calls["end"] - calls["ts"]).sum()) if len(calls) else 0.0
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return opt, 0.0
    top = (ops["depth"].to_numpy() == 0) & (ctx.step_of(ops["ts"].to_numpy()) >= 0) & ~ops_in_optimizer(ctx)
    return opt, float(ops["dur"].to_numpy()[top].sum())


def _linear_rows(g: pd.DataFrame) -> int | None:
    """The rows the model's linear layers see (the batch, times the sequence for sequence inputs):
    the leading dimensions of aten::linear's input, the most frequent value over the calls."""
    lin = g[g["op"] == "aten::linear"]
    rows: dict[int, int] = {}
    for shape, n in zip(lin["shape"], lin["count"]):
        m = re.match(r"\[([\d,]+)\]", str(shape))
        dims = [int(x) for x in m.group(1).split(",")] if m else []
        if len(dims) >= 2:
            r = int(np.prod(dims[:-1]))
            rows[r] = rows.get(r, 0) + int(n)
    return max(rows, key=rows.get) if rows else None


def per_rank(ctx: RankContext) -> list[Fact]:
    g: pd.DataFrame | None = ctx.shared.get("cpu_op_groups")
    if g is None or not len(ctx.windows):
        return []
    gemm = g[g["category"] == "gemm"]
    thin = gemm[(gemm["thin"] > 0) & (gemm["thin"] <= THIN_MAX_ROWS)]
    rows_seen = _linear_rows(g)
    if rows_seen is not None:
        # a GEMM is thin because of the batch only when its thinnest dimension is the batch's
        # rows: a 10-class output layer at batch 64 is 10 wide, not a small batch
        thin = thin[thin["thin"] == rows_seen]
    if not len(thin) or float(thin["time"].sum()) <= 0:
        return []
    window = ctx.windows_us
    steps = len(ctx.windows)
    step = window / steps
    gemm_us, thin_us = float(gemm["time"].sum()), float(thin["time"].sum())
    other_us = gemm_us - thin_us
    rows = int(round(_weighted_median(thin["thin"].to_numpy(float), thin["time"].to_numpy(float))))
    k = TARGET_ROWS / max(rows, 1)
    flops = float(thin["flops"].sum())
    achieved = flops / (thin_us * 1e-6)
    meta = ctx.trace.meta
    cpu = meta.host_cpu or {}
    per_core = fp32_fma_peak_per_core(cpu)
    threads = meta.torch_threads
    if threads is not None and isinstance(cpu.get("usable_cores"), int):
        threads = max(1, min(threads, cpu["usable_cores"]))
    fields: dict = {}
    if per_core is not None and threads:
        p_lo, p_hi = per_core[0] * threads, per_core[1] * threads
        opt_us, ops_us = _optimizer_and_operators(ctx)
        # per step: the optimizer's pass over the parameters does not grow with the batch; the
        # other operators grow between not at all (tiny tensors cost their dispatch) and k times
        # (large ones cost their bytes); host time between operators is per call, not per sample
        opt = opt_us / steps
        rest_ops = max(0.0, ops_us - gemm_us) / steps
        gaps = max(0.0, step - opt - rest_ops - gemm_us / steps)

        def at_target(peak: float, rest_growth: float) -> float:
            thin_k = max(thin_us / steps, k * (flops / steps) / peak * 1e6)
            return opt + gaps + rest_growth * rest_ops + thin_k + k * other_us / steps

        fast, slow = at_target(p_hi, 1.0), at_target(ATTAINABLE * p_lo, k)
        fields = dict(thin_utilisation_max_ratio=min(1.0, achieved / p_lo), peak_low_flops_per_s=p_lo, peak_high_flops_per_s=p_hi, target_step_fast_us=fast,
                      target_step_slow_us=slow, per_sample_saving_high_us=max(0.0, step - fast / k),
                      per_sample_saving_low_us=max(0.0, step - slow / k))  # fmt: skip
    top = thin.sort_values("time", ascending=False).head(5)
    return [CpuThinMatmuls(
        rank=ctx.rank, steps_count=steps, window_us=window, step_us=step, gemm_us=gemm_us, thin_gemm_us=thin_us,
        thin_gemm_ratio=thin_us / gemm_us if gemm_us > 0 else 0.0, thin_share_of_step_ratio=thin_us / window if window > 0 else 0.0,
        thin_max_rows=THIN_MAX_ROWS, thin_rows=rows, target_rows=TARGET_ROWS, batch_factor=k, thin_gemm_flops=flops,
        thin_achieved_flops_per_s=achieved, other_gemm_us=other_us, cpu_model=cpu.get("model") or None,
        threads_count=threads, attainable_ratio=ATTAINABLE, **fields,
        evidence=Evidence(events=[f"{r.op} {r.shape}" for r in top.itertuples()],
                          counts={"thin_groups": int(len(thin)), "thin_calls": int(thin["count"].sum())},
                          note=None if fields else "no CPU peak: the run's monitor log did not record the CPU "
                                                   "(model, vector flags, clock) or the torch threads"),
    )]  # fmt: skip
