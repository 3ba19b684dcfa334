"""Ascend-only analyses (traces read from torch_npu profiler output; nothing on Kineto traces).

Per rank, over the analysed step windows where the data has times, else over the whole trace:
- ``npu_aicpu_ops``: AI CPU tasks, those of ``AICPU_SLOW_US`` or more, their op types and dtypes;
- ``npu_pipe_utilisation``: bound pipe of each AI Core / Vector task from the pipe ratios
  (``*_ratio`` columns, threshold ``PIPE_BOUND``), time of tasks with none bound;
- ``npu_block_dim``: block dim vs the device's cores (only when the device model is known);
- ``npu_aicore_frequency``: the AI Core clock counter, drop from the highest sample;
- ``npu_format_conversion``: TransData / Cast / transpose time, private formats;
- ``npu_dynamic_shape``: OP State dynamic share, online compilation (opCompile) calls and time;
- ``npu_launch_blocking``: stream synchronisation calls right after launches;
- ``npu_allocation``: time in CANN device-memory allocation / free calls inside the steps;
- ``npu_affinity_api``: aten sequences with a fused torch_npu API (table ``AFFINITY``);
- ``npu_small_packets``: SDMA / RDMA volume in packets under ``SMALL_PACKET_BYTES``;
- ``npu_sdma_contention``: SDMA bandwidth with vs without a Cube task running;
- ``npu_rdma_retransmission``: RDMA tasks >= 10x the median and >= 1 ms;
- ``npu_hccl_links``: transit time and bytes per link (HCCS, RDMA, PCIe, SIO) of the HCCL ops in
  the steps, the HCCL_INTRA_ROCE_ENABLE / HCCL_INTRA_PCIE_ENABLE flags, and what moving the
  RDMA + PCIe (slow-link) transit to HCCS would save (``HCCS_MIN_BYTES``, ``NOMINAL_GBPS``);
- ``npu_environment``: the recorded environment variables and memory fragmentation.
Thresholds follow msprof-analyze's advisor where it has one (docs/analysis/npu.md).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import (
    HcclLinkStep, NpuAffinityApi, NpuAicoreFrequency, NpuAicpuOps, NpuAllocation, NpuBlockDim, NpuDynamicShape,
    NpuEnvironment, NpuFormatConversion, NpuHcclLinks, NpuLaunchBlocking, NpuPipeUtilisation, NpuRdmaRetransmission,
    NpuByteAlignment, NpuSdmaContention, NpuSmallPackets,
)  # fmt: skip

from .. import intervals as iv
from ..context import RankContext
from ..host.dispatch import OPTIMIZER_RE

AICPU_SLOW_US = 20.0  # msprof-analyze: AI CPU operators over 20 µs are reported
PIPE_BOUND = 0.8  # a pipe busy for 80% of the task's time bounds it
SMALL_PACKET_BYTES = 16e6  # msprof-analyze packet analysis: SDMA packets under 16 MB
WIDE_DTYPES = ("INT64", "DOUBLE", "COMPLEX", "BOOL", "UINT64")
CUBE_RE = re.compile(r"matmul|batchmatmul|conv|gemm|flashattention|grouped_matmul", re.I)
CONVERSION_TYPES = {"TransData", "Cast", "TransposeD", "Transpose", "TransDataRNN"}
PRIVATE_FORMATS = ("NC1HWC0", "FRACTAL_Z", "FRACTAL_NZ", "NDC1HWC0", "FRACTAL_Z_3D", "C1HWNCoC0")
# (device model, AI Core (cube) cores, AI Vector cores); CANN's info.json gives the exact numbers,
# which torch_npu does not export: these are the published SKU figures, approximate (docs/devices.md)
CORES = [("910b1", 24, 48), ("910b2", 24, 48), ("910b3", 20, 40), ("910b4", 20, 40), ("910a", 32, 0),
         ("910", 32, 0)]  # fmt: skip
# generic operator sequences (host op names, in order, consecutive top-level ops) -> fused API
AFFINITY = [
    ("rms_norm", "torch_npu.npu_rms_norm", ("aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul")),
    ("rotary_embedding", "torch_npu.npu_rotary_mul", ("aten::mul", "aten::slice", "aten::slice", "aten::neg", "aten::cat", "aten::mul", "aten::add")),  # fmt: skip
    ("swiglu", "torch_npu.npu_swiglu", ("aten::chunk", "aten::silu", "aten::mul")),
    ("attention_softmax", "torch_npu.npu_fusion_attention", ("aten::matmul", "aten::div", "aten::softmax", "aten::matmul")),  # fmt: skip
    ("attention_softmax", "torch_npu.npu_fusion_attention", ("aten::bmm", "aten::softmax", "aten::bmm")),
]
# HCCS bandwidth measured in the same trace is the yardstick for the slow links once this many
# bytes went over HCCS (below it, small latency-bound messages dominate the measured bandwidth)
HCCS_MIN_BYTES = 1e6
# Nominal per-direction GB/s of the Ascend 910 generation (Hot Chips 31: three 240 Gb/s HCCS ports,
# RoCE v2 100 Gb/s ports, PCIe 4.0 x16; PCI-SIG: Gen4 x16 ~32 GB/s per direction). The low end of
# the nominal saving compares a link with one HCCS link (two NPUs), the high end with the three
# links of a 4-NPU HCCS mesh (docs/analysis/npu.md).
NOMINAL_GBPS = {"hccs_link": 30.0, "hccs_mesh": 90.0, "rdma": 12.5, "pcie": 32.0}
LINKS = ("hccs", "rdma", "pcie", "sio")
FUSED_OPTIMIZERS = {"SGD": "torch_npu.optim.NpuFusedSGD", "Adam": "torch_npu.optim.NpuFusedAdam",
                    "AdamW": "torch_npu.optim.NpuFusedAdamW", "Adadelta": "torch_npu.optim.NpuFusedAdadelta",
                    "RMSprop": "torch_npu.optim.NpuFusedRMSprop", "Lamb": "torch_npu.optim.NpuFusedLamb"}  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    if tr.meta.format != "ascend":
        return []
    k = _compute_tasks(ctx)
    facts: list[Fact] = []
    for fn in (_aicpu, _pipes, _block_dim, _format_conversion, _dynamic_shape):
        f = fn(ctx, k)
        if f is not None:
            facts.append(f)
    for fn in (_frequency, _launch_blocking, _allocation, _small_packets, _sdma_contention, _byte_alignment, _rdma,
               _hccl_links, _environment):
        f = fn(ctx)
        if f is not None:
            facts.append(f)
    facts.extend(_affinity(ctx))
    return facts


def _window_mask(ctx: RankContext, ts: np.ndarray) -> np.ndarray:
    if not ctx.windows:
        return np.ones(len(ts), dtype=bool)
    return ctx.step_of(ts) >= 0


def _window_us(ctx: RankContext) -> float:
    if ctx.windows:
        return ctx.windows_us
    lo, hi = ctx.trace.time_span()
    return hi - lo


def _compute_tasks(ctx: RankContext) -> pd.DataFrame:
    """Device compute tasks (not HCCL) in the analysed windows."""
    k = ctx.trace.kernels
    if not len(k) or "task_type" not in k.columns:
        return k.iloc[0:0]
    k = k[k["task_type"].astype(str) != "HCCL"]
    return k[_window_mask(ctx, k["ts"].to_numpy(float))]


def _col(k: pd.DataFrame, name: str) -> pd.Series:
    return k[name].astype(str) if name in k.columns else pd.Series([""] * len(k), index=k.index)


def _aicpu(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k):
        return None
    core = _col(k, "core_type").str.upper() + " " + _col(k, "task_type").str.upper()
    is_cpu = core.str.contains("AI_CPU").to_numpy()
    dur = k["dur"].to_numpy(float)
    total = float(dur.sum())
    slow = is_cpu & (dur >= AICPU_SLOW_US)
    dtypes = _col(k, "input_dtypes").to_numpy()[slow]
    wide = sum(any(w in str(d).upper() for w in WIDE_DTYPES) for d in dtypes)
    order = np.argsort(-dur[slow])
    types = _col(k, "op_type").to_numpy()[slow][order]
    names = k["name"].astype(str).to_numpy()[slow][order]
    return NpuAicpuOps(
        rank=ctx.rank, device_compute_us=total, aicpu_count=int(is_cpu.sum()), aicpu_us=float(dur[is_cpu].sum()),
        aicpu_ratio=_r(dur[is_cpu].sum(), total), threshold_us=AICPU_SLOW_US, slow_count=int(slow.sum()),
        slow_us=float(dur[slow].sum()), slow_ratio=_r(dur[slow].sum(), total), wide_dtype_count=int(wide),
        op_types=list(dict.fromkeys(t for t in types if t))[:10],
        dtypes=sorted({x for d in dtypes for x in str(d).split(";") if x})[:10],
        evidence=Evidence(events=list(dict.fromkeys(names))[:5], counts={"tasks": int(len(k))},
                          note=f"AI CPU = Accelerator Core / Task Type AI_CPU; slow = {AICPU_SLOW_US:g} µs or more"),
    )  # fmt: skip


_PIPES = {"mac": ("aic_mac_ratio",), "scalar": ("aic_scalar_ratio", "aiv_scalar_ratio"), "mte1": ("aic_mte1_ratio",),
          "mte2": ("aic_mte2_ratio", "aiv_mte2_ratio"), "mte3": ("aiv_mte3_ratio",), "fixpipe": ("aic_fixpipe_ratio",),
          "vec": ("aiv_vec_ratio",)}  # fmt: skip


def _pipes(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
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
    types = _col(k.loc[has], "op_type").to_numpy()[~bound]
    order = np.argsort(-dur[~bound])
    return NpuPipeUtilisation(
        rank=ctx.rank, bound_threshold_ratio=PIPE_BOUND, ops_count=int(has.sum()), ops_us=float(dur.sum()),
        unbound_count=int((~bound).sum()), unbound_us=float(dur[~bound].sum()), unbound_ratio=_r(dur[~bound].sum(), dur.sum()),
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


def _block_dim(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k) or "block_dim" not in k.columns:
        return None
    bd = k["block_dim"].to_numpy(np.int64)
    ok = bd > 0
    if not ok.any():
        return None
    device = ctx.trace.meta.device_name
    cube, vec = _cores(device)
    dur = k["dur"].to_numpy(float)
    core = _col(k, "core_type").str.upper().to_numpy()
    cores = np.where(np.char.find(core.astype(str), "VECTOR") >= 0, vec or 0, cube or 0)
    known = ok & (cores > 0)
    not_mult = known & (bd % np.maximum(cores, 1) != 0) & (bd > cores)
    under = known & (bd < cores)
    return NpuBlockDim(
        rank=ctx.rank, device=device, ai_cores_count=cube, vector_cores_count=vec, tasks_count=int(ok.sum()),
        tasks_us=float(dur[ok].sum()), not_multiple_count=int(not_mult.sum()), not_multiple_us=float(dur[not_mult].sum()),
        not_multiple_ratio=_r(dur[not_mult].sum(), dur[ok].sum()), under_filled_count=int(under.sum()),
        under_filled_us=float(dur[under].sum()),
        evidence=Evidence(note="core counts unknown (device model not recorded): nothing compared" if cube is None
                          else "not a multiple: block dim above the core count and not divisible by it"),
    )  # fmt: skip


def _format_conversion(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    if not len(k):
        return None
    typ = _col(k, "op_type")
    name = k["name"].astype(str)
    is_td = (typ == "TransData") | (typ.isin(["", "nan"]) & name.str.contains("TransData"))
    is_cast = (typ == "Cast") | (typ.isin(["", "nan"]) & name.str.contains(r"(?:^|_)Cast", regex=True))
    conv = is_td | is_cast | typ.isin(CONVERSION_TYPES)
    dur = k["dur"].to_numpy(float)
    fmts = _col(k, "input_formats") + ";" + _col(k, "output_formats")
    private = fmts.str.contains("|".join(PRIVATE_FORMATS))
    return NpuFormatConversion(
        rank=ctx.rank, device_compute_us=float(dur.sum()), transdata_count=int(is_td.sum()),
        transdata_us=float(dur[is_td.to_numpy()].sum()), cast_count=int(is_cast.sum()),
        cast_us=float(dur[is_cast.to_numpy()].sum()), conversion_us=float(dur[conv.to_numpy()].sum()),
        conversion_ratio=_r(dur[conv.to_numpy()].sum(), dur.sum()), private_format_count=int(private.sum()),
        evidence=Evidence(events=list(dict.fromkeys(name[conv].tolist()))[:5]),
    )  # fmt: skip


def _dynamic_shape(ctx: RankContext, k: pd.DataFrame) -> Fact | None:
    tr = ctx.trace
    state = _col(k, "op_state").str.lower()
    known = state.isin(["dynamic", "static"])
    dyn = int((state == "dynamic").sum())
    rt = tr.runtime
    names = rt["name"].astype(str) if len(rt) else pd.Series([], dtype=str)
    in_win = _window_mask(ctx, rt["ts"].to_numpy(float)) if len(rt) else np.zeros(0, bool)
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
    win = _window_us(ctx)
    return NpuDynamicShape(
        rank=ctx.rank, state_known_count=int(known.sum()), dynamic_count=dyn, dynamic_ratio=_r(dyn, int(known.sum())),
        compile_calls_count=calls, compile_us=comp_us, window_us=win, compile_ratio=_r(comp_us, win),
        jit_compile_hint=calls > 0, host_cache_capacity=tr.meta.env.get("HOST_CACHE_CAPACITY") if tr.meta.env else None,
        evidence=Evidence(events=list(dict.fromkeys(k.loc[(state == "dynamic").to_numpy(), "name"].astype(str)))[:5]),
    )  # fmt: skip


def _frequency(ctx: RankContext) -> Fact | None:
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
        drop_ratio=_r(nominal - mhz.min(), nominal), below_nominal_ratio=_r(below, spans.sum()),
    )  # fmt: skip


def _launch_blocking(ctx: RankContext) -> Fact | None:
    rt = ctx.trace.runtime
    if not len(rt):
        return None
    rt = rt[_window_mask(ctx, rt["ts"].to_numpy(float))].sort_values("ts")
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
    win = _window_us(ctx)
    env = ctx.trace.meta.env or {}
    return NpuLaunchBlocking(
        rank=ctx.rank, launches_count=int(launches.sum()), sync_calls_count=int(syncs.sum()), sync_us=sync_us,
        synced_launch_ratio=_r(synced, launches.sum()), window_us=win, sync_ratio=_r(sync_us, win),
        env_launch_blocking=str(env.get("ASCEND_LAUNCH_BLOCKING", "")).strip() == "1",
        evidence=Evidence(events=sorted(set(rt["name"].astype(str).to_numpy()[syncs]))[:5]),
    )  # fmt: skip


def _allocation(ctx: RankContext) -> Fact | None:
    rt = ctx.trace.runtime
    if not len(rt):
        return None  # no CANN API layer (Level0): nothing measured, no fact
    rt = rt[_window_mask(ctx, rt["ts"].to_numpy(float))]
    kind = rt["kind"].astype(str).to_numpy()
    dur = rt["dur"].to_numpy(float)
    mal, fre = kind == "malloc", kind == "free"
    malloc_us, free_us = float(dur[mal].sum()), float(dur[fre].sum())
    win = _window_us(ctx)
    steps = max(1, len(ctx.windows))
    env = ctx.trace.meta.env or {}
    conf = (env.get("PYTORCH_NPU_ALLOC_CONF") or "").strip()
    names = rt["name"].astype(str).to_numpy()[mal | fre]
    return NpuAllocation(
        rank=ctx.rank, steps_count=steps, window_us=win, malloc_count=int(mal.sum()), malloc_us=malloc_us,
        free_count=int(fre.sum()), free_us=free_us, alloc_us=malloc_us + free_us,
        per_step_us=(malloc_us + free_us) / steps, alloc_ratio=_r(malloc_us + free_us, win),
        alloc_conf=conf or None, expandable_segments="expandable_segments:true" in conf.lower().replace(" ", ""),
        evidence=Evidence(events=sorted(set(names))[:5], counts={"cann_calls": len(rt)},
                          note="CANN calls of kind malloc / free (aclrtMalloc*, aclMallocMemInner, aclrtFree*, "
                               "aclrtReserveMemAddress / aclrtMapMem / aclrtUnmapMem / aclrtReleaseMemAddress) "
                               "that start in the step windows"),
    )  # fmt: skip


def _small_packets(ctx: RankContext) -> Fact | None:
    pk = ctx.trace.extras.get("comm_packets")
    ops = ctx.trace.extras.get("comm_ops")
    if pk is None or not len(pk) or ops is None:
        return None
    pk = pk[pk["transport"].isin(["HCCS", "RDMA", "PCIE", "SIO"])]  # per link; SDMA is their total
    if not len(pk):
        return None
    vol = pk["packet_bytes"] * pk["count"]
    small = pk["packet_bytes"] < SMALL_PACKET_BYTES
    transport = "RDMA" if (pk["transport"] == "RDMA").any() and vol[pk["transport"] == "RDMA"].sum() > vol[pk["transport"] != "RDMA"].sum() else "SDMA"  # fmt: skip
    return NpuSmallPackets(
        rank=ctx.rank, transport=transport, threshold_bytes=SMALL_PACKET_BYTES, volume_bytes=float(vol.sum()),
        small_volume_bytes=float(vol[small].sum()), small_volume_ratio=_r(vol[small].sum(), vol.sum()),
        small_count=int(pk.loc[small, "count"].sum()),
        small_count_ratio=_r(pk.loc[small, "count"].sum(), pk["count"].sum()), small_us=float(pk.loc[small, "time_us"].sum()),
        transit_us=float(pk["time_us"].sum()),
        evidence=Evidence(events=list(dict.fromkeys(pk.loc[small, "name"].astype(str)))[:5],
                          note="communication.json Size Distribution (HCCS / PCIE / SIO / RDMA packets)"),
    )  # fmt: skip


def _sdma_contention(ctx: RankContext) -> Fact | None:
    t = ctx.trace.extras.get("hccl_tasks")
    k = ctx.trace.kernels
    if t is None or not len(t) or not len(k) or "op_type" not in k.columns:
        return None
    t = t[(t["transport"].astype(str) == "SDMA") & (t["size_bytes"].fillna(0) > 0) & (t["dur"] > 0)]
    t = t[t["link_type"].astype(str).isin(["HCCS", "PCIE", "SIO"])]
    if len(t) < 2:
        return None
    label = k["op_type"].astype(str) + " " + k["name"].astype(str)
    cube = k[label.str.contains(CUBE_RE).to_numpy() & (k["task_type"].astype(str) != "HCCL").to_numpy()]
    cu = iv.union(cube["ts"].to_numpy(float), cube["end"].to_numpy(float))
    ov = iv.overlap_length(t["ts"].to_numpy(float), t["end"].to_numpy(float), cu) > 0
    size, dur = t["size_bytes"].to_numpy(float), t["dur"].to_numpy(float)
    if not ov.any() or ov.all():
        return None
    bw_ov = size[ov].sum() / dur[ov].sum() / 1e3  # bytes/µs -> GB/s
    bw_al = size[~ov].sum() / dur[~ov].sum() / 1e3
    loss = max(0.0, 1.0 - bw_ov / bw_al) if bw_al > 0 else 0.0
    return NpuSdmaContention(
        rank=ctx.rank, overlapped_count=int(ov.sum()), overlapped_bytes=float(size[ov].sum()), overlapped_gbps=float(bw_ov),
        alone_count=int((~ov).sum()), alone_gbps=float(bw_al), bandwidth_loss_ratio=float(min(loss, 1.0)),
        overlapped_us=float(dur[ov].sum()), lost_us=float(dur[ov].sum() * min(loss, 1.0)),
    )  # fmt: skip


ALIGN_BYTES = 512  # the paper's HCCS rule; msprof-analyze's ByteAlignmentChecker (_BASE_SIZE, _MIN_SIZE)
TRANSFER_TASKS = ("Memcpy", "Reduce_Inline")


def _byte_alignment(ctx: RankContext) -> Fact | None:
    """Per transfer task, as msprof-analyze's byte-alignment check: SDMA Memcpy / Reduce_Inline tasks
    off the chip and over 512 bytes, unaligned when size % 512 != 0. What it costs is measured, not
    assumed: each unaligned task against the bandwidth of the aligned tasks of its type in the same
    HCCL operation (they run side by side on the other links), else of its type and link on the rank."""
    t = ctx.trace.extras.get("hccl_tasks")
    need = {"ts", "end", "dur", "size_bytes", "transport", "link_type"}
    if t is None or not len(t) or not need <= set(t.columns):
        return None
    if "task_type" not in t.columns:  # the task's name is its type in trace_view.json and the db
        t = t.assign(task_type=t["name"] if "name" in t.columns else "")
    size = t["size_bytes"].fillna(0).to_numpy(float)
    keep = ((t["transport"].astype(str).to_numpy() == "SDMA") & (t["link_type"].astype(str).to_numpy() != "ON_CHIP")
            & np.isin(t["task_type"].astype(str).to_numpy(), TRANSFER_TASKS) & (size > ALIGN_BYTES)
            & (t["dur"].to_numpy(float) > 0) & _window_mask(ctx, t["ts"].to_numpy(float)))  # fmt: skip
    t = t[keep]
    if not len(t):
        return None
    ts, end = t["ts"].to_numpy(float), t["end"].to_numpy(float)
    size, dur = t["size_bytes"].to_numpy(float), t["dur"].to_numpy(float)
    un = np.mod(size, ALIGN_BYTES) != 0
    # the HCCL operation each task belongs to: the rank's collective whose span holds its start
    c = ctx.trace.collectives
    c = c[c["source"].astype(str).to_numpy() == "kernel"] if len(c) else c
    op = np.full(len(t), -1, dtype=np.int64)
    if len(c):
        order = np.argsort(c["ts"].to_numpy(float), kind="stable")
        cs, ce = c["ts"].to_numpy(float)[order], c["end"].to_numpy(float)[order]
        i = np.searchsorted(cs, ts, side="right") - 1
        ok = (i >= 0) & (ts < ce[np.clip(i, 0, None)])
        op = np.where(ok, order[np.clip(i, 0, None)], -1)
    df = pd.DataFrame({"op": op, "type": t["task_type"].astype(str).to_numpy(), "link": t["link_type"].astype(str).to_numpy(),
                       "size": size, "dur": dur, "un": un})  # fmt: skip
    al = df[~df["un"]]
    by_op = al[al["op"] >= 0].groupby(["op", "type"])[["size", "dur"]].sum()
    by_link = al.groupby(["type", "link"])[["size", "dur"]].sum()
    excess, known = 0.0, False
    for r in df[df["un"]].itertuples(index=False):
        ref = by_op.loc[(r.op, r.type)] if (r.op, r.type) in by_op.index else (
            by_link.loc[(r.type, r.link)] if (r.type, r.link) in by_link.index else None)  # fmt: skip
        if ref is None or not ref["dur"] > 0:
            continue
        known = True
        excess += max(0.0, r.dur - r.size / (ref["size"] / ref["dur"]))
    cu = _compute_union(ctx)
    uu = iv.union(ts[un], end[un]) if un.any() else iv.EMPTY
    exposed = iv.length(iv.subtract(uu, cu)) if un.any() else 0.0
    ops_all = df.loc[df["op"] >= 0, "op"]
    names = c["name"].astype(str).to_numpy() if len(c) else np.zeros(0, dtype=object)
    bad_ops = sorted(set(df.loc[df["un"] & (df["op"] >= 0), "op"].tolist()))
    window = _window_us(ctx) if ctx.windows else float(end.max() - ts.min())
    return NpuByteAlignment(
        rank=ctx.rank, tasks_count=int(len(df)), task_time_us=float(dur.sum()), task_size_bytes=float(size.sum()),
        ops_count=int(ops_all.nunique()), unaligned_count=int(un.sum()), unaligned_ops_count=len(bad_ops),
        unaligned_size_bytes=float(size[un].sum()), unaligned_time_us=float(dur[un].sum()),
        unaligned_time_ratio=_r(dur[un].sum(), dur.sum()), excess_us=float(excess) if known else None,
        unaligned_exposed_us=float(exposed), window_us=float(window),
        evidence=Evidence(
            time_ranges_us=[(float(ts[un].min()), float(end[un].max()))] if un.any() else [],
            events=[str(names[i]) for i in bad_ops[:5]],
            counts={"tasks": int(len(df)), "unaligned": int(un.sum())},
            note="HCCL SDMA Memcpy / Reduce_Inline tasks off the chip over 512 B (msprof-analyze's byte-alignment "
                 "check); excess = unaligned task time beyond size / bandwidth of the aligned tasks of the same type "
                 "in the same operation (else same type and link on the rank)",
        ),
    )  # fmt: skip


def _compute_union(ctx: RankContext) -> iv.Intervals:
    k = _compute_tasks(ctx)
    if not len(k):
        return iv.EMPTY
    return iv.union(k["ts"].to_numpy(float), k["end"].to_numpy(float))


def _rdma(ctx: RankContext) -> Fact | None:
    t = ctx.trace.extras.get("hccl_tasks")
    if t is None or not len(t):
        return None
    t = t[(t["transport"].astype(str) == "RDMA") & (t["size_bytes"].fillna(0) > 0)]
    if len(t) < 3:
        return None
    dur = t["dur"].to_numpy(float)
    med = float(np.median(dur))
    slow = (dur >= 10 * med) & (dur >= 1000.0)
    return NpuRdmaRetransmission(rank=ctx.rank, rdma_count=int(len(dur)), median_us=med, slow_count=int(slow.sum()),
                                 slow_us=float(dur[slow].sum()), max_us=float(dur.max()))  # fmt: skip


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
                                slow_share_ratio=_r(slow, w.duration_us)))  # fmt: skip
    return out


def _on_slow_links(ops: pd.DataFrame) -> np.ndarray:
    out = np.zeros(len(ops), bool)
    for c in ("rdma_us", "pcie_us"):
        if c in ops.columns:
            out |= np.nan_to_num(ops[c].to_numpy(float)) > 0
    return out


def _hccl_links(ctx: RankContext) -> Fact | None:
    ops = ctx.trace.extras.get("comm_ops")
    if ops is None or not len(ops) or "ts" not in ops.columns:
        return None
    ops, steps_of = _ops_in_windows(ctx, ops)
    per_step = _step_links(ctx, ops, steps_of)
    win = _window_us(ctx)
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
        slow_per_step_us=slow_us / steps, slow_share_ratio=_r(slow_us, win),
        max_step_slow_share_ratio=max((p.slow_share_ratio for p in per_step), default=_r(slow_us, win)),
        hccs_measured=measured, hccs_speedup_fraction=frac, nominal_speedup_low_fraction=lo,
        nominal_speedup_high_fraction=hi, speedup_source="measured" if measured else "nominal",
        recoverable_us=recoverable, recoverable_ratio=_r(recoverable, win), intra_roce_forced=roce,
        intra_pcie_forced=pcie, intra_flags_recorded=recorded,
        hccl_env={k: v for k, v in sorted(env.items()) if k.startswith("HCCL_")},
        hccl_algo=env.get("HCCL_ALGO", "").strip() or None, world_size=ctx.trace.meta.world_size, steps=per_step,
        evidence=Evidence(events=list(dict.fromkeys(ops.loc[_on_slow_links(ops), "name"].astype(str)))[:5],
                          counts={"hccl_ops": int(len(ops))}, note=note),
    )  # fmt: skip


def _int_or_none(v: str | None) -> int | None:
    v = (v or "").strip()
    return int(v) if v.lstrip("-").isdigit() else None


def _environment(ctx: RankContext) -> Fact | None:
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


def _affinity(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    ops = tr.cpu_ops
    out: list[Fact] = []
    win = _window_us(ctx)
    if len(ops):
        sel = ops[_window_mask(ctx, ops["ts"].to_numpy(float))]
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
                                      host_us=host, device_us=dev, window_us=win, share_ratio=_r(max(host, dev), win),
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
                                      share_ratio=_r(max(host, dev), win),
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


def _r(a, b) -> float:
    a, b = float(a), float(b)
    return min(max(a / b, 0.0), 1.0) if b > 0 else 0.0
