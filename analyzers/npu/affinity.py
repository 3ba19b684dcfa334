"""Fused torch_npu APIs an Ascend job could use (``npu_affinity_api``): generic aten operator
sequences with a fused API (``AFFINITY``) and optimizers with a fused torch_npu one
(``FUSED_OPTIMIZERS``), with the host and device time they take."""

from __future__ import annotations

import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import NpuAffinityApi

from ..context import RankContext
from ..host.dispatch import OPTIMIZER_RE
from .tasks import ratio, window_mask, window_us

# generic operator sequences (host op names, in order, consecutive top-level ops) -> fused API
AFFINITY = [
    ("rms_norm", "torch_npu.npu_rms_norm", ("aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul")),
    ("rotary_embedding", "torch_npu.npu_rotary_mul", ("aten::mul", "aten::slice", "aten::slice", "aten::neg", "aten::cat", "aten::mul", "aten::add")),  # fmt: skip
    ("swiglu", "torch_npu.npu_swiglu", ("aten::chunk", "aten::silu", "aten::mul")),
    ("attention_softmax", "torch_npu.npu_fusion_attention", ("aten::matmul", "aten::div", "aten::softmax", "aten::matmul")),  # fmt: skip
    ("attention_softmax", "torch_npu.npu_fusion_attention", ("aten::bmm", "aten::softmax", "aten::bmm")),
]
FUSED_OPTIMIZERS = {"SGD": "torch_npu.optim.NpuFusedSGD", "Adam": "torch_npu.optim.NpuFusedAdam",
                    "AdamW": "torch_npu.optim.NpuFusedAdamW", "Adadelta": "torch_npu.optim.NpuFusedAdadelta",
                    "RMSprop": "torch_npu.optim.NpuFusedRMSprop", "Lamb": "torch_npu.optim.NpuFusedLamb"}  # fmt: skip


def affinity(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    ops = tr.cpu_ops
    out: list[Fact] = []
    win = window_us(ctx)
    if len(ops):
        sel = ops[window_mask(ctx, ops["ts"].to_numpy(float))]
        dev_by_ext = _device_time_by_ext(tr)
        found: dict[tuple[str, str], list] = {}
        for _, g in sel[sel["depth"] <= 1].groupby("tid", sort=False):
            g = g.sort_values("ts")
            names = g["name"].astype(str).tolist()
            for pat, api, seq in AFFINITY:
                n = len(seq)
                i = 0
                while i + n <= len(names):
                    if tuple(names[i:i + n]) == seq:
                        rows = g.iloc[i:i + n]
                        host = float(rows["dur"].sum())
                        dev = float(sum(dev_by_ext.get(int(e), 0.0) for e in _subtree_ext(ops, rows.index)))
                        found.setdefault((pat, api), []).append((host, dev, float(rows["ts"].iloc[0]), float(rows["end"].max())))
                        i += n
                    else:
                        i += 1
        for (pat, api), hits in found.items():
            host, dev = sum(h[0] for h in hits), sum(h[1] for h in hits)
            out.append(NpuAffinityApi(rank=ctx.rank, pattern=pat, fused_api=api, occurrences_count=len(hits),
                                      host_us=host, device_us=dev, window_us=win, share_ratio=ratio(max(host, dev), win),
                                      evidence=Evidence(time_ranges_us=[(h[2], h[3]) for h in hits[:3]])))  # fmt: skip
    ann = tr.annotations
    if len(ann):
        a = ann[ann["kind"].astype(str) == "optimizer"]
        for name, g in a.groupby(a["name"].astype(str), sort=False, observed=True):
            m = OPTIMIZER_RE.match(name)
            if not m or m.group(1) not in FUSED_OPTIMIZERS:
                continue
            host = float(g["dur"].sum())
            dev = _device_time_in(tr, g)
            out.append(NpuAffinityApi(rank=ctx.rank, pattern="optimizer", fused_api=FUSED_OPTIMIZERS[m.group(1)],
                                      occurrences_count=int(len(g)), host_us=host, device_us=dev, window_us=win,
                                      share_ratio=ratio(max(host, dev), win),
                                      evidence=Evidence(events=[name], time_ranges_us=[(float(r.ts), float(r.end)) for r in g.head(3).itertuples()])))  # fmt: skip
    return out


def _device_time_by_ext(tr) -> dict[int, float]:
    k = tr.kernels
    if not len(k):
        return {}
    k = k[k["ext_id"] >= 0]
    return k.groupby("ext_id")["dur"].sum().to_dict()


def _subtree_ext(ops: pd.DataFrame, roots) -> list[int]:
    """External ids of the given ops and every op nested inside them (same thread, within their span)."""
    out = []
    for r in roots:
        row = ops.loc[r]
        inside = ops[(ops["tid"] == row["tid"]) & (ops["ts"] >= row["ts"]) & (ops["end"] <= row["end"])]
        out.extend(inside["ext_id"].tolist())
    return out


def _device_time_in(tr, spans: pd.DataFrame) -> float:
    """Device compute time launched by host ops inside the given annotation spans."""
    ops = tr.cpu_ops
    k = tr.kernels
    if not len(ops) or not len(k):
        return 0.0
    by_ext = _device_time_by_ext(tr)
    total = 0.0
    for r in spans.itertuples():
        inside = ops[(ops["ts"] >= r.ts) & (ops["end"] <= r.end)]
        total += sum(by_ext.get(int(e), 0.0) for e in inside["ext_id"].tolist())
    return total


__all__ = ["AFFINITY", "FUSED_OPTIMIZERS", "affinity"]
