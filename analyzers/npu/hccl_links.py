"""HCCL links of an Ascend job (``npu_hccl_links``): transit time and bytes per link (HCCS, RDMA,
PCIe, SIO) of the HCCL ops in the steps, the HCCL_INTRA_ROCE_ENABLE / HCCL_INTRA_PCIE_ENABLE
flags, and what moving the RDMA + PCIe (slow-link) transit to HCCS would save, measured against
the HCCS bandwidth of the same trace or, below ``HCCS_MIN_BYTES``, the nominal ``NOMINAL_GBPS``
(docs/analysis/npu.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import HcclLinkStep, NpuHcclLinks

from ..context import RankContext
from .tasks import ratio, window_us

# HCCS bandwidth measured in the same trace is the yardstick for the slow links once this many
# bytes went over HCCS (below it, small latency-bound messages dominate the measured bandwidth)
HCCS_MIN_BYTES = 1e6
# Nominal per-direction GB/s of the Ascend 910 generation (Hot Chips 31: three 240 Gb/s HCCS ports,
# RoCE v2 100 Gb/s ports, PCIe 4.0 x16; PCI-SIG: Gen4 x16 ~32 GB/s per direction). The low end of
# the nominal saving compares a link with one HCCS link (two NPUs), the high end with the three
# links of a 4-NPU HCCS mesh (docs/analysis/npu.md).
NOMINAL_GBPS = {"hccs_link": 30.0, "hccs_mesh": 90.0, "rdma": 12.5, "pcie": 32.0}
LINKS = ("hccs", "rdma", "pcie", "sio")


def _gbps(nbytes: float, time_us: float) -> float | None:
    return nbytes / time_us / 1e3 if time_us > 0 else None  # bytes/µs -> GB/s


def _nominal_fractions(rdma_us: float, pcie_us: float, pcie_forced: bool) -> tuple[float, float]:
    """(low, high) share of the slow-link transit HCCS would save at nominal bandwidths, weighted
    by the transit time of each slow link (by the flag when there was none)."""
    per = {link: (max(0.0, 1.0 - NOMINAL_GBPS[link] / NOMINAL_GBPS["hccs_link"]),
                  max(0.0, 1.0 - NOMINAL_GBPS[link] / NOMINAL_GBPS["hccs_mesh"])) for link in ("rdma", "pcie")}  # fmt: skip
    total = rdma_us + pcie_us
    w_pcie = pcie_us / total if total > 0 else (1.0 if pcie_forced else 0.0)
    lo = (1.0 - w_pcie) * per["rdma"][0] + w_pcie * per["pcie"][0]
    hi = (1.0 - w_pcie) * per["rdma"][1] + w_pcie * per["pcie"][1]
    return lo, hi


def _link_sums(ops: pd.DataFrame) -> dict[str, float]:
    out = {}
    for link in LINKS:
        for unit in ("us", "bytes"):
            c = f"{link}_{unit}"
            out[c] = float(np.nansum(ops[c].to_numpy(float))) if c in ops.columns else 0.0
    return out


def _ops_in_windows(ctx: RankContext, ops: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The HCCL ops that start in the analysed windows, and the step of each."""
    if not ctx.windows:
        return ops, np.zeros(len(ops), np.int64)
    steps = ctx.step_of(ops["ts"].to_numpy(float))
    keep = steps >= 0
    return ops[keep], steps[keep]


def _step_links(ctx: RankContext, ops: pd.DataFrame, steps: np.ndarray) -> list[HcclLinkStep]:
    out = []
    for w in ctx.windows:
        s = _link_sums(ops[steps == w.step])
        slow = s["rdma_us"] + s["pcie_us"]
        out.append(HcclLinkStep(step=w.step, window_us=w.duration_us, **s, slow_us=slow,
                                slow_share_ratio=ratio(slow, w.duration_us)))  # fmt: skip
    return out


def _on_slow_links(ops: pd.DataFrame) -> np.ndarray:
    out = np.zeros(len(ops), bool)
    for c in ("rdma_us", "pcie_us"):
        if c in ops.columns:
            out |= np.nan_to_num(ops[c].to_numpy(float)) > 0
    return out


def hccl_links(ctx: RankContext) -> Fact | None:
    ops = ctx.trace.extras.get("comm_ops")
    if ops is None or not len(ops) or "ts" not in ops.columns:
        return None
    ops, steps_of = _ops_in_windows(ctx, ops)
    per_step = _step_links(ctx, ops, steps_of)
    win = window_us(ctx)
    steps = max(1, len(ctx.windows))
    t = _link_sums(ops)
    slow_us, slow_bytes = t["rdma_us"] + t["pcie_us"], t["rdma_bytes"] + t["pcie_bytes"]
    env = {str(k): str(v) for k, v in (ctx.trace.meta.env or {}).items()}
    roce = env.get("HCCL_INTRA_ROCE_ENABLE", "").strip() == "1"
    pcie = env.get("HCCL_INTRA_PCIE_ENABLE", "").strip() == "1"
    recorded = "HCCL_INTRA_ROCE_ENABLE" in env or "HCCL_INTRA_PCIE_ENABLE" in env
    hccs_gbps, slow_gbps = _gbps(t["hccs_bytes"], t["hccs_us"]), _gbps(slow_bytes, slow_us)
    measured = t["hccs_bytes"] >= HCCS_MIN_BYTES and hccs_gbps is not None
    # share of the slow-link transit HCCS would save: time B/bw_slow becomes B/bw_hccs
    frac = min(max(1.0 - slow_gbps / hccs_gbps, 0.0), 1.0) if measured and slow_gbps is not None else None
    lo, hi = _nominal_fractions(t["rdma_us"], t["pcie_us"], pcie and not roce)
    recoverable = slow_us * (frac if frac is not None else (lo + hi) / 2.0)
    note = (f"communication.json transit per link of the {len(ops)} HCCL ops starting in the step windows; "
            + (f"HCCS reached {hccs_gbps:.2f} GB/s in this trace" if measured
               else f"HCCS moved under {HCCS_MIN_BYTES / 1e6:g} MB: nominal bandwidths used")
            + ("" if recorded else "; HCCL_INTRA_ROCE_ENABLE / HCCL_INTRA_PCIE_ENABLE not recorded"))  # fmt: skip
    return NpuHcclLinks(
        rank=ctx.rank, steps_count=steps, window_us=win, ops_count=int(len(ops)), **t,
        hccs_gbps=hccs_gbps, rdma_gbps=_gbps(t["rdma_bytes"], t["rdma_us"]), pcie_gbps=_gbps(t["pcie_bytes"], t["pcie_us"]),
        sio_gbps=_gbps(t["sio_bytes"], t["sio_us"]), slow_us=slow_us, slow_bytes=slow_bytes, slow_gbps=slow_gbps,
        slow_per_step_us=slow_us / steps, slow_share_ratio=ratio(slow_us, win),
        max_step_slow_share_ratio=max((p.slow_share_ratio for p in per_step), default=ratio(slow_us, win)),
        hccs_measured=measured, hccs_speedup_fraction=frac, nominal_speedup_low_fraction=lo,
        nominal_speedup_high_fraction=hi, speedup_source="measured" if measured else "nominal",
        recoverable_us=recoverable, recoverable_ratio=ratio(recoverable, win), intra_roce_forced=roce,
        intra_pcie_forced=pcie, intra_flags_recorded=recorded,
        hccl_env={k: v for k, v in sorted(env.items()) if k.startswith("HCCL_")},
        hccl_algo=env.get("HCCL_ALGO", "").strip() or None, world_size=ctx.trace.meta.world_size, steps=per_step,
        evidence=Evidence(events=list(dict.fromkeys(ops.loc[_on_slow_links(ops), "name"].astype(str)))[:5],
                          counts={"hccl_ops": int(len(ops))}, note=note),
    )  # fmt: skip


__all__ = ["HCCS_MIN_BYTES", "LINKS", "NOMINAL_GBPS", "hccl_links"]
