"""How well kernels fill the device (NVIDIA traces, which record the grid and the SM count): kernels
that launch fewer thread blocks than the GPU has SMs while nothing on another stream runs beside
them, and the partly empty last wave of multi-wave grids (wave quantisation, the tail effect)."""

from __future__ import annotations

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.occupancy import KernelGridFill, KernelWaves

from .. import intervals as iv
from ..context import RankContext
from .activities import Acts, ratio, register_selected
from .kernel_classes import CLS_INDEX
from .kernel_names import short_kernel_name
from .kernel_roofline import MIN_KERNEL_US


_MATMUL = (CLS_INDEX["gemm"], CLS_INDEX["conv"], CLS_INDEX["attention"])
_COMM = CLS_INDEX["communication"]


def sm_count(ctx: RankContext) -> int | None:
    """SMs of the device, on NVIDIA traces only (ROCm writes the grid in work-items for some launch
    APIs and in blocks for others, so blocks per CU are not known there)."""
    props = list(getattr(ctx.trace.meta, "device_properties", None) or [])
    if not props:
        return None
    p = props[0]
    name = str(p.get("name") or "")
    if int(p.get("warpSize") or 0) != 32 or "AMD" in name or "Radeon" in name or "Instinct" in name:
        return None
    n = int(p.get("numSms") or 0)
    return n if n > 0 else None


def launch_blocks(ctx: RankContext, k: Acts) -> np.ndarray:
    """Thread blocks per launch (-1 when the trace records no grid)."""
    kf = ctx.trace.kernels
    if not all(c in kf.columns for c in ("grid_x", "grid_y", "grid_z")):
        return np.full(len(k), -1, dtype=np.int64)
    g = [kf[c].to_numpy()[k.row].astype(np.int64) for c in ("grid_x", "grid_y", "grid_z")]
    ok = (g[0] > 0) & (g[1] > 0) & (g[2] > 0)
    return np.where(ok, g[0] * g[1] * g[2], -1)


def _covered(starts: np.ndarray, ends: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Length of [x, y] covered by the union of [starts, ends] (vectorised over x, y)."""
    if not len(starts) or not len(x):
        return np.zeros(len(x))
    u = iv.union(starts, ends)
    a, b = np.asarray(u[0], float), np.asarray(u[1], float)
    cum = np.concatenate([[0.0], np.cumsum(b - a)])

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(a, t, side="right")  # intervals starting at or before t
        full = cum[np.clip(i - 1, 0, None)]
        last = np.where(i > 0, np.clip(t - a[np.clip(i - 1, 0, None)], 0.0, (b - a)[np.clip(i - 1, 0, None)]), 0.0)
        return np.where(i > 0, full + last, 0.0)

    return np.clip(upto(y) - upto(x), 0.0, None)


# --- grid fill -------------------------------------------------------------------------------------
def grid_fill(ctx: RankContext, k: Acts, blocks: np.ndarray, sms: int | None) -> list[Fact]:
    if not sms:
        return []
    comp = k.cls != _COMM
    kernels_time = float(k.dur[comp].sum())
    long = comp & (k.dur >= MIN_KERNEL_US) & (blocks > 0)
    if not long.any() or kernels_time <= 0:
        return []
    under = long & (blocks < sms)
    alone = np.zeros(len(k))
    if under.any():
        # the part of each underfilled kernel that no compute kernel on another stream overlaps
        for s in np.unique(k.stream[under]):
            q = np.flatnonzero(under & (k.stream == s))
            o = comp & (k.stream != s)
            alone[q] = k.dur[q] - _covered(k.ts[o], k.end[o], k.ts[q], k.end[q])
        alone = np.clip(alone, 0.0, None)
    fillk = np.where(under, blocks / sms, 1.0)
    idle = alone * (1.0 - fillk)
    ua = float(alone[under].sum())
    mm = np.isin(k.cls, _MATMUL)
    med = 0
    if ua > 0:
        b, w = blocks[under], alone[under]
        o = np.argsort(b, kind="stable")
        cw = np.cumsum(w[o])
        med = int(b[o][np.searchsorted(cw, cw[-1] / 2)])
    register_selected(ctx, "small_grid", "kernels with fewer thread blocks than SMs (running alone)", k, under & (alone > 0))
    top = np.bincount(k.name_id[under], weights=idle[under], minlength=len(k.names)) if under.any() else np.zeros(0)
    events = [short_kernel_name(str(k.names[i])) for i in np.argsort(-top)[:3] if top[i] > 0] if len(top) else []
    return [KernelGridFill(
        rank=ctx.rank, sm_count=int(sms), min_kernel_us=MIN_KERNEL_US, kernels_time_us=kernels_time,
        long_kernels_count=int(long.sum()), underfilled_count=int(under.sum()),
        underfilled_time_us=float(k.dur[under].sum()), underfilled_alone_time_us=ua,
        underfilled_ratio=ratio(ua / kernels_time), fill_ratio=ratio(float((fillk[under] * alone[under]).sum()) / ua)
        if ua > 0 else 1.0, idle_sm_time_us=float(idle.sum()), idle_sm_ratio=ratio(float(idle.sum()) / kernels_time),
        matmul_idle_sm_time_us=float(idle[mm].sum()), other_idle_sm_time_us=float(idle[~mm].sum()), median_blocks=med,
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=events,
            counts={"underfilled_kernels": int(under.sum()), "sms": int(sms)},
            note=f"blocks = grid x*y*z; kernels of at least {MIN_KERNEL_US:g} µs; alone = not overlapped by a "
                 "compute kernel on another stream; events = kernels with the most idle SM time",
        ),
    )]  # fmt: skip


# --- wave quantisation (tail effect) ----------------------------------------------------------------
# resident thread blocks per SM by compute capability (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability": maximum number of resident blocks per SM)
MAX_BLOCKS_PER_SM = {(5, 0): 32, (5, 2): 32, (5, 3): 32, (6, 0): 32, (6, 1): 32, (6, 2): 32, (7, 0): 32, (7, 2): 32,
                     (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32, (10, 0): 32}  # fmt: skip
REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256
SMEM_RESERVED_SM80 = 1024  # bytes of shared memory the driver reserves per block from compute capability 8.0


def resident_blocks(threads: int, regs: int, smem: int, props: dict) -> int:
    """Thread blocks one SM holds at once (the CUDA occupancy calculator's limits: threads, registers,
    shared memory, blocks); 0 when a limit is unknown."""
    try:
        max_thr = int(props["maxThreadsPerMultiprocessor"])
        regs_sm = int(props["regsPerMultiprocessor"])
        smem_sm = int(props["sharedMemPerMultiprocessor"])
        cc = (int(props["computeMajor"]), int(props.get("computeMinor") or 0))
    except (KeyError, TypeError, ValueError):
        return 0
    if threads <= 0 or regs < 0 or smem < 0 or max_thr <= 0 or regs_sm <= 0:
        return 0
    warps = -(-threads // 32)
    lim = [max_thr // (warps * 32), MAX_BLOCKS_PER_SM.get(cc, 16)]
    if regs > 0:
        per_warp = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
        lim.append((regs_sm // per_warp) // warps)
    if smem > 0:
        lim.append(smem_sm // (smem + (SMEM_RESERVED_SM80 if cc >= (8, 0) else 0)))
    return max(0, min(lim))


def waves(ctx: RankContext, k: Acts, blocks: np.ndarray, sms: int | None) -> list[Fact]:
    kf = ctx.trace.kernels
    props = list(getattr(ctx.trace.meta, "device_properties", None) or [])
    if not sms or not props or not all(c in kf.columns for c in ("block_x", "block_y", "block_z", "registers",
                                                                    "shared_mem")):  # fmt: skip
        return []
    comp = k.cls != _COMM
    kernels_time = float(k.dur[comp].sum())
    thr = np.ones(len(k), dtype=np.int64)
    for c in ("block_x", "block_y", "block_z"):
        v = kf[c].to_numpy()[k.row].astype(np.int64)
        thr = thr * np.where(v > 0, v, 0)
    regs = kf["registers"].to_numpy()[k.row].astype(np.int64)
    smem = kf["shared_mem"].to_numpy()[k.row].astype(np.int64)
    judged = comp & (k.dur >= MIN_KERNEL_US) & (blocks > 0) & (thr > 0) & (regs >= 0) & (smem >= 0)
    if not judged.any() or kernels_time <= 0:
        return []
    res = np.zeros(len(k), dtype=np.int64)
    cache: dict[tuple[int, int, int], int] = {}
    for i in np.flatnonzero(judged):
        key = (int(thr[i]), int(regs[i]), int(smem[i]))
        if key not in cache:
            cache[key] = resident_blocks(*key, props[0])
        res[i] = cache[key]
    judged &= res > 0
    w = np.where(judged, blocks / np.maximum(res * sms, 1), 0.0)
    multi = judged & (w > 1.0 + 1e-9)
    full = np.ceil(w)
    tail = np.where(multi, k.dur * (full - w) / np.where(full > 0, full, 1.0), 0.0)
    if not multi.any():
        return []
    register_selected(ctx, "wave_tail", "kernels whose last wave of thread blocks is partly empty", k, multi & (tail > 0))
    mm = np.isin(k.cls, _MATMUL)
    bw, dw = w[multi], k.dur[multi]
    o = np.argsort(bw, kind="stable")
    cw = np.cumsum(dw[o])
    med = float(bw[o][np.searchsorted(cw, cw[-1] / 2)])
    top = np.bincount(k.name_id[multi], weights=tail[multi], minlength=len(k.names))
    ti = int(np.argmax(top))
    tk = short_kernel_name(str(k.names[ti])) if top[ti] > 0 else ""
    tw = None
    if tk:
        sel = np.flatnonzero(multi & (k.name_id == ti))
        tw = float(w[sel[np.argmax(k.dur[sel])]])
    t = float(tail.sum())
    return [KernelWaves(
        rank=ctx.rank, sm_count=int(sms), min_kernel_us=MIN_KERNEL_US, kernels_time_us=kernels_time,
        judged_count=int(judged.sum()), multi_wave_count=int(multi.sum()), multi_wave_time_us=float(k.dur[multi].sum()),
        tail_idle_time_us=t, tail_idle_ratio=ratio(t / kernels_time), matmul_tail_idle_time_us=float(tail[mm].sum()),
        median_waves=med, top_kernel=tk, top_kernel_waves=tw,
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=[tk] if tk else [],
            counts={"multi_wave_kernels": int(multi.sum()), "sms": int(sms)},
            note="w = blocks / (SMs x resident blocks per SM); resident blocks from threads, registers (256 per "
                 "warp granule) and shared memory (+1 KB per block from sm80) against the device's per-SM limits; "
                 "tail idle = duration x (ceil(w) - w) / ceil(w), each wave taken to last as long as the others",
        ),
    )]  # fmt: skip
