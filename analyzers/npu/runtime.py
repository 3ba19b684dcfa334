"""The host side of an Ascend job (CANN calls and the recorded environment): stream
synchronisation right after launches (``npu_launch_blocking``), device-memory allocation in the
steps (``npu_allocation``), and the environment variables and memory fragmentation
(``npu_environment``)."""

from __future__ import annotations

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import NpuAllocation, NpuEnvironment, NpuLaunchBlocking

from ..context import RankContext
from .tasks import ratio, window_mask, window_us


def launch_blocking(ctx: RankContext) -> Fact | None:
    rt = ctx.trace.runtime
    if not len(rt):
        return None
    rt = rt[window_mask(ctx, rt["ts"].to_numpy(float))].sort_values("ts")
    kind = rt["kind"].astype(str).to_numpy()
    launches = kind == "launch"
    syncs = kind == "sync"
    if not launches.any():
        return None
    # a launch is synced when the next launch-or-sync call on its thread is a sync
    synced = 0
    for _, g in rt[launches | syncs].groupby("tid", sort=False):
        kk = g["kind"].astype(str).to_numpy()
        synced += int(((kk[:-1] == "launch") & (kk[1:] == "sync")).sum())
    sync_us = float(rt["dur"].to_numpy(float)[syncs].sum())
    win = window_us(ctx)
    env = ctx.trace.meta.env or {}
    return NpuLaunchBlocking(
        rank=ctx.rank, launches_count=int(launches.sum()), sync_calls_count=int(syncs.sum()), sync_us=sync_us,
        synced_launch_ratio=ratio(synced, launches.sum()), window_us=win, sync_ratio=ratio(sync_us, win),
        env_launch_blocking=str(env.get("ASCEND_LAUNCH_BLOCKING", "")).strip() == "1",
        evidence=Evidence(events=sorted(set(rt["name"].astype(str).to_numpy()[syncs]))[:5]),
    )  # fmt: skip


def allocation(ctx: RankContext) -> Fact | None:
    rt = ctx.trace.runtime
    if not len(rt):
        return None  # no CANN API layer (Level0): nothing measured, no fact
    rt = rt[window_mask(ctx, rt["ts"].to_numpy(float))]
    kind = rt["kind"].astype(str).to_numpy()
    dur = rt["dur"].to_numpy(float)
    mal, fre = kind == "malloc", kind == "free"
    malloc_us, free_us = float(dur[mal].sum()), float(dur[fre].sum())
    win = window_us(ctx)
    steps = max(1, len(ctx.windows))
    env = ctx.trace.meta.env or {}
    conf = (env.get("PYTORCH_NPU_ALLOC_CONF") or "").strip()
    names = rt["name"].astype(str).to_numpy()[mal | fre]
    return NpuAllocation(
        rank=ctx.rank, steps_count=steps, window_us=win, malloc_count=int(mal.sum()), malloc_us=malloc_us,
        free_count=int(fre.sum()), free_us=free_us, alloc_us=malloc_us + free_us,
        per_step_us=(malloc_us + free_us) / steps, alloc_ratio=ratio(malloc_us + free_us, win),
        alloc_conf=conf or None, expandable_segments="expandable_segments:true" in conf.lower().replace(" ", ""),
        evidence=Evidence(events=sorted(set(names))[:5], counts={"cann_calls": len(rt)},
                          note="CANN calls of kind malloc / free (aclrtMalloc*, aclMallocMemInner, aclrtFree*, "
                               "aclrtReserveMemAddress / aclrtMapMem / aclrtUnmapMem / aclrtReleaseMemAddress) "
                               "that start in the step windows"),
    )  # fmt: skip


def _int_or_none(v: str | None) -> int | None:
    v = (v or "").strip()
    return int(v) if v.lstrip("-").isdigit() else None


def environment(ctx: RankContext) -> Fact | None:
    env = ctx.trace.meta.env or {}
    mem = ctx.trace.memory
    if not env and not len(mem):
        return None
    level = _int_or_none(env.get("ASCEND_GLOBAL_LOG_LEVEL"))
    alloc = (env.get("PYTORCH_NPU_ALLOC_CONF") or "").strip()
    res = alloc_ = frag = None
    if len(mem):
        r, a = mem["total_reserved"].to_numpy(float), mem["total_allocated"].to_numpy(float)
        if (r > 0).any() and (a > 0).any():
            res, alloc_ = float(r.max()), float(a.max())
            frag = max(0.0, 1.0 - alloc_ / res) if res > 0 else None
    return NpuEnvironment(
        rank=ctx.rank, recorded=dict(env), launch_blocking=(env.get("ASCEND_LAUNCH_BLOCKING") or "").strip() == "1",
        log_level=level, debug_logging=level is not None and level <= 1, alloc_conf_set=bool(alloc),
        expandable_segments="expandable_segments:true" in alloc.lower().replace(" ", ""),
        aclnn_cache_limit=_int_or_none(env.get("ACLNN_CACHE_LIMIT")),
        host_cache_capacity=_int_or_none(env.get("HOST_CACHE_CAPACITY")),
        hccl_vars_set_count=sum(1 for k_, v in env.items() if k_.startswith("HCCL_") and str(v).strip()),
        reserved_peak_bytes=res, allocated_peak_bytes=alloc_, fragmentation_ratio=frag,
    )  # fmt: skip


__all__ = ["allocation", "environment", "launch_blocking"]
