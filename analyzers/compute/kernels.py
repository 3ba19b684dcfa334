"""kernels: the per-kernel part of the compute analysis (runs right after analyzers/compute/compute.py,
which hands it the rank's device activities, the launching operator of each kernel and the
operator calls' FLOPs and bytes through ``ctx.shared``).

Per rank, over the kernels whose start lies in an analysed step window (formulas and parameters:
docs/analysis/compute.md, "Per kernel"):

- a roofline per kernel: every kernel inherits the FLOPs and bytes of the operator call that
  launched it (the outermost recognised operator, as for operator_roofline), split over the call's
  kernels by duration; matrix kernels take a matmul's FLOPs and helpers (split-K reductions,
  epilogues, layout transforms) none;
- grid fill: kernels that launch fewer thread blocks than the GPU has SMs, while nothing on another
  stream runs beside them;
- what the memory-class device time is made of (dtype casts, strided copies, concatenations, fills,
  NCHW<->NHWC transposes, ...);
- named mechanisms: GEMMs on narrow-alignment kernels, the optimizer's device work and how it is
  implemented, forward layers recomputed in backward, normalisations written out as separate
  kernels, FP64 kernels, dense embedding gradients, cross-entropy over a large vocabulary.

Each mechanism that a fix removes registers a what-if set (analyzers/whatif/sets.py) so the
advisor replays the fix instead of subtracting times.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.core.dtypes import input_type
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.attention import AttentionBackends, NpuFlashAttentionAlignment, SdpaMathFallback
from hermes_kb.facts.compute.fusion import DecomposedNorm, GemmEpilogue
from hermes_kb.facts.compute.layers import ConvFallback, EmbeddingBackward, LargeVocabLoss, SortKernels
from hermes_kb.facts.compute.layouts import DeviceCopyKind, GemmAlignment, NpuCubeAlignment, StridedElementwise
from hermes_kb.facts.compute.occupancy import KernelGridFill, KernelWaves
from hermes_kb.facts.compute.precision import Fp64DeviceWork, GradScalerKernels
from hermes_kb.facts.compute.roofline import KernelRoofline, KernelRooflineSummary
from hermes_kb.facts.compute.training_step import ActivationRecompute, OptimizerDevice, TrainModeInference
from hermes_kb.trace.args import decode

from .. import intervals as iv
from .compute import (
    _down,
    _root,
    _spread,
    sdpa_math_ops,
    _CLS_INDEX,
    CLASSES,
    U_THR,
    _Acts,
    _cat_apply,
    _in_windows,
    _is_ascend,
    _ratio,
    short_kernel_name,
    tensor_core_kind,
)
from ..context import RankContext
from ..io.dataloader import name_mask
from ..whatif.sets import WhatIfSet, register

# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
MIN_KERNEL_US = 10.0  # below this a kernel's time is launch latency, not work: no roofline or grid verdict
TOP_KERNELS = 10  # kernel_roofline facts per rank
NORM_BACK = 2  # kernels before the reduction that belong to a written-out normalisation (cast, pow/sub)
NORM_FWD = 3  # kernels after the [r]sqrt that do (normalise, cast back, weight)
VOCAB_MIN = 32768  # a language-model vocabulary (GPT-2 50257, Llama 32000-128256, Qwen 151936)
ALIGN_16BIT = 8  # elements per tensor-core load in FP16/BF16 (16 bytes)
ALIGN_32BIT = 4  # in FP32/TF32
ALIGN_8BIT = 16  # in FP8/INT8

_MATMUL = (_CLS_INDEX["gemm"], _CLS_INDEX["conv"], _CLS_INDEX["attention"])
_COMM = _CLS_INDEX["communication"]
_MEM = _CLS_INDEX["memory"]

# --- name tests (lower-cased full kernel names) ----------------------------------------------
_LAYOUT = ("nchwtonhwc", "nhwctonchw", "nchw2nhwc", "nhwc2nchw", "batched_transpose")
_CONCAT = ("catarraybatchedcopy", "cat_array", "concat_")
_FILL = ("fillfunctor", "fill_kernel", "memset")
_INDEX = ("indexselect", "index_select", "gather", "scatter", "indexfunc", "index_elementwise", "index_put",
          "take_kernel", "masked_select")  # fmt: skip
_COPY = ("copy_kernel", "direct_copy", "_to_copy", "tofloat32_copy", "tobfloat16_copy")
_CAST_NAMES = ("bfloat16_copy_kernel", "float16_copy_kernel", "half_copy_kernel", "float8_copy_kernel",
               "tofloat32_copy", "tobfloat16_copy", "float_to_bf16", "bf16_to_float")  # fmt: skip
# a template argument (before the parameter list) that is double, or a double-precision GEMM
_FP64 = re.compile(r"<[^()]*\bdouble\b|dgemm|_d884gemm|_d16816gemm|\bdmma\b|zgemm")
_ALIGN = re.compile(r"_align(\d+)\b")
_CHECKPOINT_FRAME = re.compile(re.escape("torch/utils/checkpoint.py"))
# ATen's generic (non-vectorised) launch: an OffsetCalculator per operand, used for strided,
# broadcast or cast-on-the-fly operands (not vectorized_/unrolled_elementwise_kernel)
_LEGACY = re.compile(r"(^|[\s:])elementwise_kernel<")
_LOW_PRECISION = re.compile(r"bf16|f16|half|hgemm|h884|h1688|h16816|bfloat16", re.I)
_EIGHT_BIT = re.compile(r"e4m3|e5m2|fp8|i8816|i16832|int8|_i8", re.I)

# module-level forward operators that backward formulas never call (they call the underlying
# convolution_backward, mm, native_*_backward): found under an autograd node, they recompute a layer
_FWD_LAYERS = frozenset(f"aten::{n}" for n in (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
    "batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm", "embedding", "embedding_bag",
    "scaled_dot_product_attention", "dropout", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
))  # fmt: skip
_EMB_DENSE = frozenset({"aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward",
                        "aten::embedding_backward", "aten::_embedding_bag_backward"})  # fmt: skip
_EMB_SPARSE = frozenset({"aten::embedding_sparse_backward", "aten::_embedding_bag_sparse_backward"})
_LOSS_OPS = frozenset({"aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax",
                       "aten::_log_softmax_backward_data", "aten::nll_loss", "aten::nll_loss_nd",
                       "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward",
                       "aten::nll_loss2d_backward"})  # fmt: skip
_LOG_SOFTMAX = frozenset({"aten::log_softmax", "aten::_log_softmax"})
_EVAL = "autograd::engine::evaluate_function:"


def _register(ctx: RankContext, name: str, description: str, act: _Acts, m: np.ndarray) -> None:
    if m.any():
        sub = act.take(m)
        register(ctx, WhatIfSet(name, description, kernels=sub.row[sub.kernel], memcpy=sub.row[~sub.kernel]))


def _top(labels: np.ndarray, weights: np.ndarray) -> str:
    """The label with the largest summed weight ('' when none)."""
    if not len(labels):
        return ""
    s = pd.Series(weights).groupby(pd.Series(labels, dtype=object)).sum()
    s = s[s.index != ""]
    return str(s.idxmax()) if len(s) and s.max() > 0 else ""


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


# --- per-kernel roofline -----------------------------------------------------------------------
def _attribution(ctx: RankContext, k: _Acts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    kvec = np.isin(k.cls, [_CLS_INDEX["elementwise"], _CLS_INDEX["reduction"], _CLS_INDEX["norm"]])
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


def _sm_count(ctx: RankContext) -> int | None:
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


def _blocks(ctx: RankContext, k: _Acts) -> np.ndarray:
    """Thread blocks per launch (-1 when the trace records no grid)."""
    kf = ctx.trace.kernels
    if not all(c in kf.columns for c in ("grid_x", "grid_y", "grid_z")):
        return np.full(len(k), -1, dtype=np.int64)
    g = [kf[c].to_numpy()[k.row].astype(np.int64) for c in ("grid_x", "grid_y", "grid_z")]
    ok = (g[0] > 0) & (g[1] > 0) & (g[2] > 0)
    return np.where(ok, g[0] * g[1] * g[2], -1)


def _roofline(ctx: RankContext, act: _Acts, k: _Acts, dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int,
              att: tuple, blocks: np.ndarray, sms: int | None) -> list[Fact]:  # fmt: skip
    call, flops, nbytes, exact, dtype = att
    live = (call >= 0) & (k.cls != _COMM) & ((flops > 0) | (nbytes > 0))  # helpers of a call inherit nothing
    kernels_time = float(k.dur[k.cls != _COMM].sum())
    if not live.any() or kernels_time <= 0:
        return []
    info = ctx.shared["compute_ops"]
    ops = ctx.trace.cpu_ops
    calls = np.asarray(info["calls"], dtype=np.int64)
    opname = np.asarray(info["op"], dtype=object)
    total_dev = float(act.dur.sum())
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

    def peaks(cls: int, dt: str) -> tuple[str | None, float | None, float | None]:
        if dev is None:
            return None, None, None
        p = dev.matmul_peak(dt, fp32_tf32) if cls in _MATMUL else dev.vector_peak()
        bw = dev.hbm_bytes_per_s * n_dev
        return (p[0], p[1] * n_dev, bw) if p else (None, None, bw)

    cls_time = {"memory_bound": 0.0, "compute_bound": 0.0, "underutilised": 0.0, "unclassified": 0.0}
    bw_starved = bw_starved_bytes = cmp_starved = 0.0
    bw_peak_any = None
    rows = []
    starved_names: list[tuple[float, int]] = []
    for name_id, r in g.iterrows():
        pk, pp, bp = peaks(int(r["cls"]), str(r["dtype"]))
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

    facts: list[Fact] = []
    for name_id, r, label, pk, pp, bp, p_ach, b_ach, ai in rows[:TOP_KERNELS]:
        full = str(k.names[name_id])
        sf = None
        if fill is not None and name_id in fill.index and fill.loc[name_id, "w"] > 0:
            sf = float(fill.loc[name_id, "fw"] / fill.loc[name_id, "w"])
        mb = int(med_blocks[name_id]) if name_id in med_blocks.index else None
        facts.append(KernelRoofline(
            rank=ctx.rank, kernel=short_kernel_name(full), kernel_name=full[:200], kernel_class=CLASSES[int(r["cls"])],
            operator=str(r["op"]), dtype=str(r["dtype"]) or "unknown", launches_count=int(r["n"]),
            time_us=float(r["time"]), share_of_time_ratio=_ratio(r["time"] / total_dev) if total_dev else 0.0,
            mean_duration_us=float(r["time"] / r["n"]),
            flops=float(r["flops"]), bytes=float(r["bytes"]), flops_exact=not bool(r["inexact"]),
            achieved_flops_per_s=float(p_ach), achieved_gbps=float(b_ach) / 1e9, arithmetic_intensity_flop_per_byte=ai,
            peak_dtype=pk, peak_flops_per_s=pp, peak_gbps=bp / 1e9 if bp else None,
            ridge_point_flop_per_byte=(pp / bp) if (pp and bp) else None,
            compute_utilisation_ratio=_ratio(p_ach / pp) if pp else None,
            bandwidth_utilisation_ratio=_ratio(b_ach / bp) if bp else None, roofline_class=label,
            grid_blocks=mb, sm_fill_ratio=_ratio(sf) if sf is not None else None, utilisation_threshold_ratio=U_THR,
            evidence=Evidence(
                time_ranges_us=[ctx.span], events=[full[:200]], counts={"launches": int(r["n"])},
                note="FLOPs/bytes of each launching call split over its kernels by duration (matrix kernels take "
                     "a matmul's FLOPs, helpers none)" + ("; rests on an assumption (flops_exact=false)"
                                                         if r["inexact"] else ""),
            ),
        ))  # fmt: skip
    classified = sum(v for kk, v in cls_time.items() if kk != "unclassified")
    attributed = float(k.dur[live].sum())
    facts.append(KernelRooflineSummary(
        rank=ctx.rank, device=dev.name if dev else None, kernels_time_us=kernels_time, attributed_time_us=attributed,
        attributed_time_ratio=_ratio(attributed / kernels_time), kernel_names_count=len(g),
        memory_bound_time_us=cls_time["memory_bound"], compute_bound_time_us=cls_time["compute_bound"],
        underutilised_time_us=cls_time["underutilised"], unclassified_time_us=cls_time["unclassified"],
        memory_bound_ratio=_ratio(cls_time["memory_bound"] / classified) if classified else None,
        compute_bound_ratio=_ratio(cls_time["compute_bound"] / classified) if classified else None,
        underutilised_ratio=_ratio(cls_time["underutilised"] / classified) if classified else None,
        min_kernel_us=MIN_KERNEL_US, bandwidth_starved_time_us=bw_starved,
        bandwidth_starved_ratio=_ratio(bw_starved / kernels_time),
        bandwidth_starved_utilisation_ratio=(_ratio(bw_starved_bytes / (bw_starved * 1e-6) / bw_peak_any)
                                             if bw_starved > 0 and bw_peak_any else None),
        compute_starved_time_us=cmp_starved, compute_starved_ratio=_ratio(cmp_starved / kernels_time),
        utilisation_threshold_ratio=U_THR,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[short_kernel_name(str(k.names[i])) for _, i in sorted(starved_names, reverse=True)[:3]],
            counts={"kernels": len(g), "launches": int(live.sum())},
            note="classes judged per kernel name on its own FLOPs, bytes and time; events = the longest "
                 "bandwidth-starved kernels",
        ),
    ))  # fmt: skip
    return facts


# --- grid fill -------------------------------------------------------------------------------------
def _grid_fill(ctx: RankContext, k: _Acts, blocks: np.ndarray, sms: int | None) -> list[Fact]:
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
    _register(ctx, "small_grid", "kernels with fewer thread blocks than SMs (running alone)", k, under & (alone > 0))
    top = np.bincount(k.name_id[under], weights=idle[under], minlength=len(k.names)) if under.any() else np.zeros(0)
    events = [short_kernel_name(str(k.names[i])) for i in np.argsort(-top)[:3] if top[i] > 0] if len(top) else []
    return [KernelGridFill(
        rank=ctx.rank, sm_count=int(sms), min_kernel_us=MIN_KERNEL_US, kernels_time_us=kernels_time,
        long_kernels_count=int(long.sum()), underfilled_count=int(under.sum()),
        underfilled_time_us=float(k.dur[under].sum()), underfilled_alone_time_us=ua,
        underfilled_ratio=_ratio(ua / kernels_time), fill_ratio=_ratio(float((fillk[under] * alone[under]).sum()) / ua)
        if ua > 0 else 1.0, idle_sm_time_us=float(idle.sum()), idle_sm_ratio=_ratio(float(idle.sum()) / kernels_time),
        matmul_idle_sm_time_us=float(idle[mm].sum()), other_idle_sm_time_us=float(idle[~mm].sum()), median_blocks=med,
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=events,
            counts={"underfilled_kernels": int(under.sum()), "sms": int(sms)},
            note=f"blocks = grid x*y*z; kernels of at least {MIN_KERNEL_US:g} µs; alone = not overlapped by a "
                 "compute kernel on another stream; events = kernels with the most idle SM time",
        ),
    )]  # fmt: skip


# --- memory-class time by kind -------------------------------------------------------------------
@lru_cache(maxsize=16384)
def copy_kind_of_name(name: str) -> str:
    """What a memory-class kernel does, from its name (casts of a copy_ are refined by the op's dtypes)."""
    low = name.lower()
    if any(s in low for s in _LAYOUT):
        return "layout_transpose"
    if any(s in low for s in _CONCAT):
        return "concat"
    if any(s in low for s in _FILL):
        return "fill"
    if any(s in low for s in _CAST_NAMES):
        return "dtype_cast"
    if any(s in low for s in _COPY):
        legacy = bool(_LEGACY.search(low[:80]))
        if "unrolled_elementwise_kernel<" in low and "direct_copy" in low:
            return "dtype_cast"  # the contiguous path with dynamic casting
        if legacy and "gpu_kernel_impl_nocast" in low:
            return "strided_copy"  # offset-calculator path, same dtype
        if legacy:
            return "dtype_cast"  # offset-calculator path with casting (strided and cast)
        return "contiguous_copy"
    if any(s in low for s in _INDEX):
        return "index"
    return "other"


@lru_cache(maxsize=4096)
def _copy_dtypes_differ(types_text: str) -> bool | None:
    """aten::copy_(dst, src): True when dst and src have different dtypes (None: not recorded)."""
    t = decode(types_text)
    if not isinstance(t, list) or len(t) < 2 or input_type(t[0]) is None or input_type(t[1]) is None:
        return None
    return t[0] != t[1]


def _copies(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    tr = ctx.trace
    mem = act.cls == _MEM
    if not mem.any() or _is_ascend(ctx, tr.kernels):
        return []
    uid, inv = np.unique(act.name_id, return_inverse=True)
    kind = np.array([copy_kind_of_name(str(act.names[i])) for i in uid], dtype=object)[inv.reshape(-1)]
    # memcpy / memset activities: by their direction
    mc = ~act.kernel
    if mc.any() and len(tr.memcpy):
        d = tr.memcpy["kind"].astype(str).to_numpy()[act.row[mc]]
        kind[mc] = np.where(d == "Memset", "fill", np.where(d == "DtoD", "contiguous_copy", "host_transfer"))
    # kernels launched by an aten::copy_ whose dtypes were recorded: a cast exactly when they differ
    top_op = np.full(len(act), "", dtype=object)
    top_shape = np.full(len(act), "", dtype=object)
    ops = tr.cpu_ops
    if launcher is not None and len(ops):
        kpos = np.flatnonzero(act.kernel)  # act rows of k, in order (k = act.take(act.kernel))
        lk = launcher
        ok = lk >= 0
        names_v, ncodes = _cat_apply(ops["name"], str)
        opn = names_v[ncodes]
        if "input_types" in ops.columns:
            diff_v, tcodes = _cat_apply(ops["input_types"], lambda s: _copy_dtypes_differ(s))
            diff = diff_v[tcodes]
            is_copy = np.zeros(len(lk), dtype=bool)
            is_copy[ok] = opn[lk[ok]] == "aten::copy_"
            dk = np.full(len(lk), None, dtype=object)
            dk[is_copy] = diff[lk[is_copy]]
            rows = kpos[is_copy]
            dv = dk[is_copy]
            cur = kind[rows]
            copyish = np.isin(cur, ["dtype_cast", "strided_copy", "contiguous_copy"])
            set_cast = copyish & (dv == True)  # noqa: E712  (object array of True/False/None)
            unset = copyish & (dv == False) & (cur == "dtype_cast")  # noqa: E712
            kind[rows[set_cast]] = "dtype_cast"
            # a copy the name called a cast but whose dtypes agree: strided when it took the legacy path
            legacy = np.array([bool(_LEGACY.search(str(act.names[act.name_id[r]])[:80])) for r in rows[unset]],
                              dtype=bool)  # fmt: skip
            kind[rows[unset]] = np.where(legacy, "strided_copy", "contiguous_copy")
        root = _root(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        r = np.where(ok, root[np.clip(lk, 0, None)], -1)
        top_op[kpos[ok]] = opn[r[ok]]
        if "input_dims" in ops.columns:
            dims_v, dcodes = _cat_apply(ops["input_dims"], str)
            from .flops import shape_signature

            sig = np.array([shape_signature(s) for s in dims_v], dtype=object)[dcodes]
            top_shape[kpos[ok]] = sig[r[ok]]
    total = float(act.dur.sum())
    mem_time = float(act.dur[mem].sum())
    conv_time = float(act.dur[act.cls == _CLS_INDEX["conv"]].sum())
    out: list[Fact] = []
    sets = {"dtype_cast": ("dtype_casts", "dtype conversion kernels"),
            "strided_copy": ("strided_copies", "same-dtype copies of non-contiguous tensors"),
            "concat": ("concat_copies", "concatenation kernels (torch.cat / stack)"),
            "layout_transpose": ("layout_transposes", "NCHW<->NHWC conversions around convolutions"),
            "index": ("index_kernels", "gather / scatter / index_select / index_put kernels"),
            "fill": ("fill_kernels", "fill / zero / memset activities")}  # fmt: skip
    for ck in ("dtype_cast", "strided_copy", "contiguous_copy", "concat", "fill", "index", "layout_transpose",
               "host_transfer", "other"):  # fmt: skip
        m = mem & (kind == ck)
        n = int(m.sum())
        if not n:
            continue
        if ck in sets:
            _register(ctx, sets[ck][0], sets[ck][1], act, m)
        t = float(act.dur[m].sum())
        tk = _top(np.array([short_kernel_name(str(act.names[i])) for i in act.name_id[m]], dtype=object), act.dur[m])
        to = _top(top_op[m], act.dur[m])
        ts_ = ""
        if to:
            sel = m & (top_op == to)
            ts_ = _top(top_shape[sel], act.dur[sel])
        out.append(DeviceCopyKind(
            rank=ctx.rank, copy_kind=ck, time_us=t, count=n, mean_duration_us=t / n,
            share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
            share_of_memory_time_ratio=_ratio(t / mem_time) if mem_time else 0.0, top_kernel=tk, top_operator=to,
            top_operator_shape=ts_,
            conv_time_us=conv_time if ck == "layout_transpose" else None,
            layout_to_conv_ratio=_ratio(t / (t + conv_time)) if ck == "layout_transpose" else None,
            evidence=Evidence(
                time_ranges_us=[ctx.span], events=[tk] + ([to] if to else []), counts={"activities": n},
                note="memory-class kernels by name (casts and copies refined by the dtypes of the launching "
                     "aten::copy_ when recorded), memcpy/memset by direction; top_operator = top-level operator",
            ),
        ))  # fmt: skip
    return out


# --- GEMM alignment ---------------------------------------------------------------------------
def _required_alignment(dtype: str) -> int:
    return ALIGN_8BIT if dtype in ("fp8", "int8") else ALIGN_16BIT if dtype in ("bf16", "fp16") else ALIGN_32BIT


@lru_cache(maxsize=16384)
def narrow_alignment(name: str) -> bool:
    """A CUTLASS/cuBLAS GEMM kernel compiled for operands aligned to fewer elements than a tensor-core
    load (``_align1``, ``_align2``; ``_align4`` in 16 bit), which cuBLAS picks when a leading
    dimension is not a multiple of the full alignment."""
    m = _ALIGN.search(name)
    if not m:
        return False
    a = int(m.group(1))
    full = ALIGN_8BIT if _EIGHT_BIT.search(name) else ALIGN_16BIT if _LOW_PRECISION.search(name) else ALIGN_32BIT
    return a < full


def _alignment(ctx: RankContext, act: _Acts, k: _Acts, att: tuple, dev: DeviceSpec | None, fp32_tf32: bool,
               n_dev: int) -> list[Fact]:  # fmt: skip
    gemm = k.cls == _CLS_INDEX["gemm"]
    if not gemm.any():
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    by_name = np.array([narrow_alignment(str(k.names[i])) for i in uid], dtype=bool)[inv.reshape(-1)] & gemm
    call, flops, _, _, dtype = att
    by_shape = np.zeros(len(k), dtype=bool)
    ex_op = ex_shape = ex_dims = ""
    info = ctx.shared.get("compute_ops")
    if info is not None and (call >= 0).any():
        mkn = np.asarray(info["mkn"], dtype=np.int64)
        cdt = np.asarray(info["dtype"], dtype=object)
        need = np.array([_required_alignment(str(d)) for d in cdt], dtype=np.int64)
        bad_k = (mkn[:, 1] > 0) & (mkn[:, 1] % need != 0)
        bad_n = (mkn[:, 2] > 0) & (mkn[:, 2] % need != 0)
        bad = (bad_k | bad_n) & np.isin(cdt, ["bf16", "fp16", "fp32", "fp8"])
        c = np.where(call >= 0, call, 0)
        by_shape = (call >= 0) & bad[c] & gemm & (np.array([tensor_core_kind(str(k.names[i])) != "aux"
                                                             for i in k.name_id], dtype=bool))  # fmt: skip
        if by_shape.any():
            w = np.bincount(c[by_shape], weights=k.dur[by_shape], minlength=len(mkn))
            j = int(np.argmax(w))
            ex_op, ex_shape = str(info["op"][j]), str(info["shape"][j])
            parts = [f"K={mkn[j, 1]}" for _ in [0] if bad_k[j]] + [f"N={mkn[j, 2]}" for _ in [0] if bad_n[j]]
            ex_dims = ", ".join(parts) + f" (not a multiple of {need[j]} in {cdt[j]})"
    mis = by_name | by_shape
    if not mis.any():
        return []
    _register(ctx, "misaligned_gemms", "GEMM kernels on narrow-alignment paths", k, mis)
    total = float(act.dur.sum())
    gt = float(k.dur[gemm].sum())
    t = float(k.dur[mis].sum())

    def util(sel: np.ndarray) -> float | None:
        if dev is None:
            return None
        sel = sel & (call >= 0) & (flops > 0)
        if not sel.any():
            return None
        dts = pd.Series(k.dur[sel]).groupby(pd.Series(dtype[sel], dtype=object)).sum()
        p = dev.matmul_peak(str(dts.idxmax()), fp32_tf32)
        if not p:
            return None
        return _ratio(float(flops[sel].sum()) / (float(k.dur[sel].sum()) * 1e-6) / (p[1] * n_dev))

    u_mis, u_al = util(mis), util(gemm & ~mis)
    top = np.bincount(k.name_id[mis], weights=k.dur[mis], minlength=len(k.names))
    ex_k = short_kernel_name(str(k.names[int(np.argmax(top))]))
    ex_full = str(k.names[int(np.argmax(top))])
    return [GemmAlignment(
        rank=ctx.rank, gemm_time_us=gt, misaligned_time_us=t, misaligned_count=int(mis.sum()),
        misaligned_by_name_us=float(k.dur[by_name].sum()), misaligned_by_shape_us=float(k.dur[by_shape].sum()),
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        share_of_gemm_time_ratio=_ratio(t / gt) if gt else 0.0,
        misaligned_utilisation_ratio=u_mis, aligned_utilisation_ratio=u_al,
        misaligned_slower=(u_mis < u_al) if (u_mis is not None and u_al is not None) else None,
        example_kernel=ex_k if ex_k != ex_full[:60] else ex_full[:120], example_operator=ex_op,
        example_shape=ex_shape, example_dims=ex_dims,
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=[ex_full[:200]] + ([f"{ex_op} {ex_shape}"] if ex_op else []),
            counts={"misaligned_kernels": int(mis.sum()), "by_name": int(by_name.sum()),
                    "by_shape": int(by_shape.sum())},
            note="narrow alignment: _align1/_align2 (and _align4 in 16 bit) in a CUTLASS/cuBLAS kernel name, or a "
                 f"matmul call whose K or N is not a multiple of {ALIGN_16BIT} (16 bit), {ALIGN_32BIT} (FP32), "
                 f"{ALIGN_8BIT} (8 bit)",
        ),
    )]  # fmt: skip


# --- optimizer -----------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def optimizer_kernel_kind(name: str) -> str:
    low = name.lower()
    if "fused" in low or "adammode" in low:
        return "fused"  # PyTorch fused=True (Fused*MathFunctor), apex FusedAdam (adamMode_t), NpuFused*
    if "multi_tensor_apply" in low or "foreach" in low:
        return "foreach"
    return "per_tensor"


def _optimizer(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    s = ctx.shared.get("whatif_sets", {}).get("optimizer")
    if s is None or (not len(s.kernels) and not len(s.memcpy)):
        return []
    m = (act.kernel & np.isin(act.row, s.kernels)) | (~act.kernel & np.isin(act.row, s.memcpy))
    if not m.any():
        return []
    kin = m & act.kernel
    kinds = {optimizer_kernel_kind(str(act.names[i])) for i in np.unique(act.name_id[kin])}
    impl = "fused" if "fused" in kinds else "foreach" if "foreach" in kinds else "per_tensor"
    ann = ctx.trace.annotations
    calls = ann[ann["name"].astype(str).str.match(r"^Optimizer\.step#\w+\.step$")] if len(ann) else ann
    if len(calls):
        calls = calls[_in_windows(ctx, calls["ts"].to_numpy())]
    if not len(calls):
        return []
    cname = str(calls["name"].iloc[0])
    opt = re.match(r"^Optimizer\.step#(\w+)\.step$", cname)
    dev_t = float(act.dur[m].sum())
    comp = float(act.dur[act.cls != _COMM].sum())
    n = int(m.sum())
    _register(ctx, "optimizer_kernels", "the device work launched inside optimizer.step()", act, m)
    return [OptimizerDevice(
        rank=ctx.rank, optimizer=opt.group(1) if opt else "unknown", implementation=impl,
        calls_count=len(calls), kernels_count=n, kernels_per_call=n / len(calls), device_us=dev_t,
        share_of_device_time_ratio=_ratio(dev_t / comp) if comp else 0.0, mean_kernel_us=dev_t / n,
        evidence=Evidence(
            time_ranges_us=[(float(calls["ts"].iloc[0]), float(calls["end"].iloc[0]))],
            events=[cname] + [short_kernel_name(str(act.names[i])) for i in np.unique(act.name_id[kin])][:3],
            counts={"calls": len(calls), "device_activities": n},
            note="device work launched inside the Optimizer.step annotations; implementation from the kernel "
                 "names (fused: Fused*/apex adamMode; foreach: multi_tensor_apply; else one kernel per tensor)",
        ),
    )]  # fmt: skip


# --- recomputation (activation checkpointing) -----------------------------------------------------
def _recompute(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = _cat_apply(ops["name"], str)
    layer_v = np.array([n in _FWD_LAYERS for n in names_v], dtype=bool)
    eval_v = np.array([n.startswith(_EVAL) for n in names_v], dtype=bool)
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    layer = layer_v[ncodes]
    # TorchScript's differentiable graphs run their own backward graph (aten::matmul, linear, ...)
    # under the autograd node: that is the backward itself, not a recomputation
    scripted_v = np.array([n == "<backward op>" or "DifferentiableGraphBackward" in n for n in names_v], dtype=bool)
    in_bw = _down(parent, depth, eval_v[ncodes]) & ~_down(parent, depth, scripted_v[ncodes])
    under_layer = _down(parent, depth, layer)
    # a forward layer inside a backward node, and everything it calls
    recomp_root = layer & in_bw
    recomp = _down(parent, depth, recomp_root)
    fwd = under_layer & ~in_bw
    ok = launcher >= 0
    lk = np.clip(launcher, 0, None)
    kr = ok & recomp[lk] & (k.cls != _COMM)
    kf = ok & fwd[lk] & (k.cls != _COMM)
    if not kr.any():
        return []
    py = ctx.trace.python
    frames = int(name_mask(py["name"], _CHECKPOINT_FRAME).sum()) if len(py) else 0
    rt = float(k.dur[kr].sum())
    ft = float(k.dur[kf].sum())
    comp = float(act.dur[act.cls != _COMM].sum())
    n_calls = int((recomp_root & _in_windows(ctx, ops["ts"].to_numpy())).sum())
    sub = k.take(kr)
    register(ctx, WhatIfSet("recompute", "kernels of forward layers recomputed in backward", kernels=sub.row))
    return [ActivationRecompute(
        rank=ctx.rank, recompute_calls_count=n_calls, recompute_device_us=rt, forward_device_us=ft,
        recompute_to_forward_ratio=rt / ft if ft > 0 else 0.0, device_compute_us=comp,
        share_of_device_time_ratio=_ratio(rt / comp) if comp else 0.0, checkpoint_frames_count=frames,
        peak_allocated_ratio=_peak_memory_ratio(ctx),
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[_top(names_v[ncodes][recomp_root], ops["dur"].to_numpy()[recomp_root])],
            counts={"recomputed_layer_calls": n_calls, "checkpoint_frames": frames},
            note="forward layers (conv/linear/norm/attention/... module entry points, which backward formulas "
                 "never call) found under an autograd::engine::evaluate_function node",
        ),
    )]  # fmt: skip


def _peak_memory_ratio(ctx: RankContext) -> float | None:
    mem = ctx.trace.memory
    props = list(getattr(ctx.trace.meta, "device_properties", None) or [])
    if not len(mem) or not props or "total_allocated" not in mem.columns:
        return None
    total = float(props[0].get("totalGlobalMem") or 0)
    if total <= 0:
        return None
    dev = mem[(mem["device_type"].astype(str).isin(["1", "cuda", "CUDA"]))] if "device_type" in mem.columns else mem
    a = dev["total_allocated"].to_numpy(dtype=float) if len(dev) else np.zeros(0)
    a = a[a > 0]
    return _ratio(float(a.max()) / total) if len(a) else None


# --- written-out normalisations ---------------------------------------------------------------------
@lru_cache(maxsize=16384)
def _norm_role(name: str, cls: int) -> str:
    low = name.lower()
    if cls == _CLS_INDEX["reduction"] and ("meanops" in low or "welfordops" in low or "mean_kernel" in low):
        return "mean"
    if cls == _CLS_INDEX["elementwise"] and "rsqrt" in low:
        return "sqrt"
    if cls == _CLS_INDEX["elementwise"] and "sqrt_kernel" in low:
        return "sqrt"
    if cls == _CLS_INDEX["elementwise"] or (cls == _MEM and copy_kind_of_name(name) == "dtype_cast"):
        return "pointwise"
    return ""


def _decomposed_norms(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    if len(k) < 3:
        return []
    order = np.lexsort((k.ts, k.stream, k.device))
    ks = k.take(order)
    pair = ks.name_id * len(CLASSES) + ks.cls
    uid, inv = np.unique(pair, return_inverse=True)
    roles = np.array([_norm_role(str(ks.names[p // len(CLASSES)]), int(p % len(CLASSES))) for p in uid],
                     dtype=object)[inv.reshape(-1)]  # fmt: skip
    n = len(ks)
    same = np.zeros(n, dtype=bool)
    same[1:] = (ks.stream[1:] == ks.stream[:-1]) & (ks.device[1:] == ks.device[:-1])  # same stream as the one before
    marked = np.zeros(n, dtype=bool)
    occ = 0
    example: list[int] = []
    for i in np.flatnonzero(roles == "sqrt"):
        if i >= 1 and same[i] and roles[i - 1] == "mean":
            j = i - 1  # mean, rsqrt
        elif i >= 2 and same[i] and same[i - 1] and roles[i - 1] == "pointwise" and roles[i - 2] == "mean":
            j = i - 2  # mean, add eps, rsqrt
        else:
            continue
        lo = j
        for _ in range(NORM_BACK):
            if lo - 1 >= 0 and same[lo] and roles[lo - 1] == "pointwise":
                lo -= 1
            else:
                break
        hi = i
        for _ in range(NORM_FWD):
            if hi + 1 < n and same[hi + 1] and roles[hi + 1] == "pointwise":
                hi += 1
            else:
                break
        marked[lo : hi + 1] = True
        occ += 1
        if not example:
            example = list(range(lo, hi + 1))
    if not occ:
        return []
    t = float(ks.dur[marked].sum())
    total = float(act.dur.sum())
    return [DecomposedNorm(
        rank=ctx.rank, occurrences_count=occ, kernels_count=int(marked.sum()),
        kernels_per_occurrence=float(marked.sum()) / occ, time_us=t,
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        fused_norm_time_us=float(act.dur[act.cls == _CLS_INDEX["norm"]].sum()),
        example=[short_kernel_name(str(ks.names[ks.name_id[x]])) for x in example],
        evidence=Evidence(
            time_ranges_us=[(float(ks.ts[example[0]]), float(ks.end[example[-1]]))] if example else [ctx.span],
            events=[short_kernel_name(str(ks.names[ks.name_id[x]])) for x in example][:8],
            counts={"occurrences": occ, "kernels": int(marked.sum())},
            note=f"a mean/variance reduction followed within two kernels by a [r]sqrt on the same stream, with up "
                 f"to {NORM_BACK} point-wise kernels before it and {NORM_FWD} after",
        ),
    )]  # fmt: skip


# --- FP64 ----------------------------------------------------------------------------------------
@lru_cache(maxsize=16384)
def is_fp64_kernel(name: str) -> bool:
    head = name.split(">(", 1)[0] if ">(" in name else name.split("(", 1)[0]
    return bool(_FP64.search(head))


def _fp64(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None, dev: DeviceSpec | None) -> list[Fact]:
    uid, inv = np.unique(k.name_id, return_inverse=True)
    m = np.array([is_fp64_kernel(str(k.names[i])) for i in uid], dtype=bool)[inv.reshape(-1)] & (k.cls != _COMM)
    if not m.any():
        return []
    _register(ctx, "fp64_kernels", "kernels computing in double precision", k, m)
    t = float(k.dur[m].sum())
    total = float(act.dur.sum())
    ratio_peak = None
    if dev is not None and dev.peak("fp64") and dev.peak("fp32"):
        ratio_peak = float(dev.peak("fp64") / dev.peak("fp32"))
    to = ""
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = _cat_apply(ops["name"], str)
        root = _root(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = m & (launcher >= 0)
        to = _top(names_v[ncodes][root[launcher[ok]]], k.dur[ok]) if ok.any() else ""
    tk = _top(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [Fp64DeviceWork(
        rank=ctx.rank, kernels_count=int(m.sum()), time_us=t,
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        fp64_to_fp32_peak_ratio=ratio_peak, top_kernel=tk, top_operator=to,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ([to] if to else []),
                          counts={"fp64_kernels": int(m.sum())},
                          note="kernels with double in their template arguments, or FP64 GEMMs (dgemm, d884/d16816)"),
    )]  # fmt: skip


# --- dense embedding gradients -----------------------------------------------------------------------
def _embedding(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = _cat_apply(ops["name"], str)
    dense_v = np.array([n in _EMB_DENSE for n in names_v], dtype=bool)
    sparse_v = np.array([n in _EMB_SPARSE for n in names_v], dtype=bool)
    dense = dense_v[ncodes]
    win = _in_windows(ctx, ops["ts"].to_numpy())
    if not (dense & win).any():
        return []
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    under = _down(parent, depth, dense)
    ok = launcher >= 0
    km = ok & under[np.clip(launcher, 0, None)] & (k.cls != _COMM)
    if not km.any():
        return []
    # outermost dense backward call of each tree (embedding_backward calls embedding_dense_backward)
    has_dense_anc = np.zeros(len(ops), dtype=bool)
    ok_p = parent >= 0
    has_dense_anc[ok_p] = under[parent[ok_p]]
    outer = dense & ~has_dense_anc & win
    rows_max = None
    if "input_dims" in ops.columns:
        # embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
        # num_weights is a scalar (Concrete Inputs); the gradient's width is grad_output's last dim
        if "concrete_inputs" in ops.columns:
            cv, cc = _cat_apply(ops["concrete_inputs"], str)
            vals = []
            for txt in cv[cc][dense & win]:  # embedding_backward, embedding_dense_backward: num_weights is arg 2
                c = decode(txt)
                if isinstance(c, list) and len(c) > 2:
                    try:
                        vals.append(int(str(c[2]).strip('"')))
                    except ValueError:
                        pass
            rows_max = max(vals) if vals else None
    t = float(k.dur[km].sum())
    total = float(act.dur.sum())
    sub = k.take(km)
    register(ctx, WhatIfSet("embedding_backward", "kernels of dense embedding gradients", kernels=sub.row))
    return [EmbeddingBackward(
        rank=ctx.rank, dense_calls_count=int(outer.sum()), dense_device_us=t,
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        sparse_calls_count=int((sparse_v[ncodes] & win).sum()), weight_rows=rows_max,
        evidence=Evidence(time_ranges_us=[ctx.span], events=sorted({str(x) for x in names_v[ncodes][outer]}),
                          counts={"dense_calls": int(outer.sum())},
                          note="kernels launched under embedding_dense_backward / _embedding_bag_dense_backward"),
    )]  # fmt: skip


# --- cross-entropy over a large vocabulary --------------------------------------------------------
def _large_vocab(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops) or "input_dims" not in ops.columns:
        return []
    names_v, ncodes = _cat_apply(ops["name"], str)
    ls_v = np.array([n in _LOG_SOFTMAX for n in names_v], dtype=bool)
    win = _in_windows(ctx, ops["ts"].to_numpy())
    ls = ls_v[ncodes] & win
    if not ls.any():
        return []
    dims_v, dcodes = _cat_apply(ops["input_dims"], str)
    if "input_types" in ops.columns:
        types_v, tcodes = _cat_apply(ops["input_types"], str)
    else:
        types_v, tcodes = np.array([""], dtype=object), np.zeros(len(ops), np.int64)
    best = None
    for r in np.flatnonzero(ls):
        dims, types = decode(dims_v[dcodes[r]]), decode(types_v[tcodes[r]])
        try:  # the first argument's shape and dtype (None, an empty list, a number: not recorded)
            d = dims[0]
            t = types[0] if types_v[tcodes[r]] else ""
        except (TypeError, IndexError):
            continue
        if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d) and d[-1] >= VOCAB_MIN:
            rows = int(np.prod(d[:-1]))
            if best is None or rows * d[-1] > best[0] * best[1]:
                best = (rows, int(d[-1]), input_type(t) or ("unknown", 4))
    if best is None:
        return []
    loss_v = np.array([n in _LOSS_OPS for n in names_v], dtype=bool)
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    under = _down(parent, depth, loss_v[ncodes])
    ok = launcher >= 0
    km = ok & under[np.clip(launcher, 0, None)] & (k.cls != _COMM)
    if not km.any():
        return []
    t = float(k.dur[km].sum())
    total = float(act.dur.sum())
    sub = k.take(km)
    register(ctx, WhatIfSet("large_vocab_loss", "kernels of the softmax cross-entropy over the vocabulary",
                            kernels=sub.row))  # fmt: skip
    rows, vocab, (dt, size) = best
    return [LargeVocabLoss(
        rank=ctx.rank, vocab_size=vocab, rows=rows, dtype=dt, logits_bytes=float(rows) * vocab * size,
        calls_count=int(ls.sum()), device_us=t, share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        evidence=Evidence(time_ranges_us=[ctx.span], events=["aten::log_softmax", f"[{rows},{vocab}] {dt}"],
                          counts={"log_softmax_calls": int(ls.sum())},
                          note="kernels launched under log_softmax / nll_loss / cross_entropy and their backward"),
    )]  # fmt: skip


# --- attention backends ----------------------------------------------------------------------------
_FLASH = ("flash_fwd", "flash_bwd", "pytorch_flash", "flashattn", "flash_attn")
_EFFICIENT = ("fmha_cutlass", "cutlassf", "cutlassb", "efficient_attention", "mem_efficient",
              "attention_kernel_batched", "xformers")  # fmt: skip


@lru_cache(maxsize=4096)
def attention_backend(name: str) -> str:
    low = name.lower()
    if "cudnn" in low:
        return "cudnn"
    if any(s in low for s in _FLASH):
        return "flash"
    if any(s in low for s in _EFFICIENT):
        return "efficient"
    return "other"


_SDPA_OP = "aten::scaled_dot_product_attention"


def _sdpa_masks(ctx: RankContext) -> tuple[int, int, int]:
    """(SDPA calls, calls given an attention-mask tensor, those of them with is_causal False) in the
    analysed steps, from the calls' recorded shapes: the mask is the 4th argument of
    ``aten::scaled_dot_product_attention`` and ``is_causal`` its 6th (a concrete input)."""
    ops = ctx.trace.cpu_ops
    if not len(ops) or "input_dims" not in ops.columns:
        return 0, 0, 0
    names_v, ncodes = _cat_apply(ops["name"], str)
    sd = (names_v == _SDPA_OP)[ncodes] & _in_windows(ctx, ops["ts"].to_numpy())
    if not sd.any():
        return 0, 0, 0
    dims_v, dcodes = _cat_apply(ops["input_dims"], str)
    conc = "concrete_inputs" in ops.columns and isinstance(ops["concrete_inputs"].dtype, pd.CategoricalDtype)
    conc_v, ccodes = _cat_apply(ops["concrete_inputs"], str) if conc else (np.array([""], dtype=object), np.zeros(len(ops), np.int64))
    masked = not_causal = 0
    pairs, counts = np.unique(np.stack([dcodes[sd], ccodes[sd]]), axis=1, return_counts=True)
    for (dc, cc), n in zip(pairs.T, counts, strict=True):
        dims = decode(dims_v[dc])
        if isinstance(dims, list) and len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) >= 2:
            masked += int(n)
            flags = decode(conc_v[cc])
            if flags is None:  # not recorded
                flags = []
            if len(flags) > 5 and str(flags[5]) == "False":
                not_causal += int(n)
    return int(sd.sum()), masked, not_causal


def _attention(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    m = k.cls == _CLS_INDEX["attention"]
    if not m.any():
        return []
    uid, inv = np.unique(k.name_id[m], return_inverse=True)
    be = np.array([attention_backend(str(k.names[i])) for i in uid], dtype=object)[inv.reshape(-1)]
    dur = k.dur[m]
    t = float(dur.sum())
    parts = {b: float(dur[be == b].sum()) for b in ("flash", "efficient", "cudnn", "other")}
    info = ctx.shared.get("compute_ops")
    sdpa_dt = None
    if info is not None:
        call = np.asarray(info["kernel_call"], dtype=np.int64)
        ok = m & (call >= 0)
        if ok.any():
            ops_ = np.asarray(info["op"], dtype=object)[call[ok]]
            sd = np.array([("scaled_dot_product" in str(o)) or ("attention" in str(o)) for o in ops_], dtype=bool)
            if sd.any():
                sdpa_dt = _top(np.asarray(info["dtype"], dtype=object)[call[ok]][sd], k.dur[ok][sd]) or None
    if sdpa_dt is None and parts["efficient"] > 0:  # the dtype in the fused kernels' names (fmha_cutlassF_bf16_...)
        names = " ".join(str(k.names[i]).lower() for i in uid[np.unique(inv.reshape(-1)[be == "efficient"])])
        sdpa_dt = "bf16" if "bf16" in names else "fp16" if re.search(r"f16|half", names) else None
    props = list(getattr(ctx.trace.meta, "device_properties", None) or [])
    cc = None
    if props and int(props[0].get("warpSize") or 0) == 32 and "computeMajor" in props[0]:
        cc = float(f"{int(props[0]['computeMajor'])}.{int(props[0].get('computeMinor') or 0)}")
    total = float(act.dur.sum())
    calls, masked, not_causal = _sdpa_masks(ctx)
    return [AttentionBackends(
        rank=ctx.rank, attention_time_us=t, share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        flash_us=parts["flash"], efficient_us=parts["efficient"], cudnn_us=parts["cudnn"], other_us=parts["other"],
        efficient_share_ratio=_ratio(parts["efficient"] / t) if t else 0.0, sdpa_dtype=sdpa_dt, compute_capability=cc,
        sdpa_calls_count=calls, masked_calls_count=masked, masked_share_ratio=_ratio(masked / calls) if calls else 0.0,
        masked_us=t * (masked / calls) if calls else 0.0, masked_not_causal_count=not_causal,
        evidence=Evidence(time_ranges_us=[ctx.span],
                          events=[short_kernel_name(str(k.names[i])) for i in uid][:4],
                          counts={"attention_kernels": int(m.sum())},
                          note="fused attention kernels by name: flash (flash_fwd/bwd), memory-efficient (CUTLASS "
                               "fmha / efficient_attention), cuDNN"),
    )]  # fmt: skip


# --- GradScaler ------------------------------------------------------------------------------------
def _grad_scaler(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    uid, inv = np.unique(k.name_id, return_inverse=True)
    inv = inv.reshape(-1)
    low = [str(k.names[i]).lower() for i in uid]
    gs = np.array([("non_finite_check_and_unscale" in n) or ("amp_update_scale" in n) for n in low], dtype=bool)[inv]
    if not gs.any():
        return []
    mm = np.isin(k.cls, _MATMUL)
    bf = np.array([("bf16" in n) or ("bfloat16" in n) for n in low], dtype=bool)[inv]
    f16 = np.array([bool(re.search(r"(?<!b)f16|fp16|half|hgemm|h884|h1688|h16816", n)) and "bf16" not in n
                    for n in low], dtype=bool)[inv]  # fmt: skip
    mt = float(k.dur[mm].sum())
    t = float(k.dur[gs].sum())
    total = float(act.dur.sum())
    _register(ctx, "grad_scaler", "GradScaler unscale / inf-check / scale-update kernels", k, gs)
    return [GradScalerKernels(
        rank=ctx.rank, kernels_count=int(gs.sum()), time_us=t,
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0,
        bf16_matmul_ratio=_ratio(float(k.dur[mm & bf].sum()) / mt) if mt else 0.0,
        fp16_matmul_ratio=_ratio(float(k.dur[mm & f16].sum()) / mt) if mt else 0.0,
        evidence=Evidence(time_ranges_us=[ctx.span], events=sorted({short_kernel_name(str(k.names[i]))
                                                                     for i in np.unique(k.name_id[gs])}),
                          counts={"grad_scaler_kernels": int(gs.sum())},
                          note="GradScaler kernels by name; matmul precision from the GEMM/conv/attention "
                               "kernel names"),
    )]  # fmt: skip


# --- convolutions on PyTorch's fallback kernels -------------------------------------------------------
_DEPTHWISE = ("conv_depthwise2d", "conv_depthwise3d")
_IM2COL = ("im2col_kernel", "col2im_kernel", "vol2col_kernel", "col2vol_kernel")
_SLOW_CONV_OPS = frozenset(f"aten::{n}" for n in (
    "_slow_conv2d_forward", "_slow_conv2d_backward", "slow_conv_dilated2d", "slow_conv_dilated3d",
    "slow_conv_transpose2d", "slow_conv_transpose3d", "slow_conv3d_forward", "thnn_conv2d", "_conv_depthwise2d",
    "conv_depthwise3d",
))  # fmt: skip


def _conv_fallback(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    uid, inv = np.unique(k.name_id, return_inverse=True)
    inv = inv.reshape(-1)
    low = [str(k.names[i]).lower() for i in uid]
    dw = np.array([any(s in n for s in _DEPTHWISE) for n in low], dtype=bool)[inv]
    ic = np.array([any(s in n for s in _IM2COL) for n in low], dtype=bool)[inv]
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = _cat_apply(ops["name"], str)
        slow_v = np.array([n in _SLOW_CONV_OPS for n in names_v], dtype=bool)
        under = _down(ops["parent"].to_numpy(), ops["depth"].to_numpy(), slow_v[ncodes])
        ok = launcher >= 0
        via_op = ok & under[np.clip(launcher, 0, None)] & (k.cls != _COMM)
        ic = ic | (via_op & ~dw)
    m = (dw | ic) & (k.cls != _COMM)
    if not m.any():
        return []
    _register(ctx, "conv_fallback", "convolution kernels of PyTorch's native fallback paths", k, m)
    d, i = float(k.dur[dw & m].sum()), float(k.dur[ic & m & ~dw].sum())
    lib = float(k.dur[(k.cls == _CLS_INDEX["conv"]) & ~m].sum())
    total = float(act.dur.sum())
    tk = _top(np.array([short_kernel_name(str(k.names[j])) for j in k.name_id[m]], dtype=object), k.dur[m])
    return [ConvFallback(
        rank=ctx.rank, depthwise_us=d, im2col_us=i, fallback_us=d + i, library_conv_us=lib,
        share_of_device_time_ratio=_ratio((d + i) / total) if total else 0.0,
        share_of_conv_time_ratio=_ratio((d + i) / (d + i + lib)) if d + i + lib > 0 else 0.0, top_kernel=tk,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk], counts={"fallback_kernels": int(m.sum())},
                          note="native depthwise kernels and im2col/col2im kernels by name, and every kernel launched "
                               "under a slow_conv* operator"),
    )]  # fmt: skip


# --- Ascend: MatMul inner axes (msprof-analyze's AI Core performance check) ---------------------------
CUBE_INNER_AXIS = 256  # msprof-analyze AICorePerformanceChecker.INNER_AXIS_256
CUBE_GROUP_MB = 100.0  # msprof-analyze AICorePerformanceChecker.CUBE_OPERATOR_MEMORY_SIZE_MB


def _dims(text: str) -> list[list[int]]:
    out = []
    for part in str(text).strip().strip('"').split(";"):
        try:
            out.append([int(x) for x in part.split(",") if x.strip() != ""])
        except ValueError:
            out.append([])
    return out


def cube_inner_axes_aligned(input_shapes: str) -> bool | None:
    """msprof-analyze's rule: ND inputs need the last axis of both operands a multiple of 256, NZ
    (4-D fractal) inputs the product of their axes 1 and 2; None when the shapes do not fit."""
    d = _dims(input_shapes)
    if len(d) < 2 or not d[0] or not d[1]:
        return None
    if len(d[0]) == 4 and len(d[1]) == 4:
        return (d[0][1] * d[0][2]) % CUBE_INNER_AXIS == 0 and (d[1][1] * d[1][2]) % CUBE_INNER_AXIS == 0
    if len(d[0]) == 2:
        return d[0][-1] % CUBE_INNER_AXIS == 0 and d[1][-1] % CUBE_INNER_AXIS == 0
    return None


def _group_mb(input_shapes: str, output_shapes: str) -> float:
    """msprof-analyze's memory_size: elements of the inputs (a 1-D bias counted twice) and the output,
    times 2 bytes, in MB."""
    n = 0
    for d in _dims(input_shapes):
        if len(d) == 1:
            n += d[0] * 2
        elif d:
            n += int(np.prod(d))
    for d in _dims(output_shapes)[:1]:
        n += int(np.prod(d)) if d else 0
    return n * 2 / 1024 / 1024


def _npu_cube(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not _is_ascend(ctx, kf) or not {"input_shapes", "output_shapes"} <= set(kf.columns):
        return []
    rows = k.row[k.kernel] if len(k.kernel) == len(k) else k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).to_numpy()[rows]
    cube = np.array(["matmul" in o.lower() for o in op], dtype=bool) & (tt == "AI_CORE")
    if not cube.any():
        return []
    ins = kf["input_shapes"].astype(str).to_numpy()[rows]
    outs = kf["output_shapes"].astype(str).to_numpy()[rows]
    names = np.array([str(k.names[i]) for i in k.name_id], dtype=object)
    df = pd.DataFrame({"name": names[cube], "ins": ins[cube], "outs": outs[cube], "dur": k.dur[cube]})
    df["mb"] = [_group_mb(a, b) for a, b in zip(df["ins"], df["outs"])]
    g = df.groupby(["name", "ins", "outs"], sort=False).agg(mb=("mb", "sum"), dur=("dur", "sum")).reset_index()
    g = g[g["mb"] >= CUBE_GROUP_MB]
    if not len(g):
        return []
    g["aligned"] = [cube_inner_axes_aligned(x) for x in g["ins"]]
    bad = g[g["aligned"] == False]  # noqa: E712  (None: shapes that do not fit the rule)
    cube_t = float(k.dur[cube].sum())
    total = float(act.dur.sum())
    mis_t = float(bad["dur"].sum())
    if len(bad):
        keys = set(zip(bad["name"], bad["ins"]))
        m = np.zeros(len(k), dtype=bool)
        idx = np.flatnonzero(cube)
        m[idx] = [(a, b) in keys for a, b in zip(df["name"], df["ins"])]
        _register(ctx, "npu_cube_misaligned", "MatMul tasks whose inner axes are not multiples of 256", k, m)
    top = bad.sort_values("dur", ascending=False).iloc[0] if len(bad) else None
    return [NpuCubeAlignment(
        rank=ctx.rank, cube_time_us=cube_t, checked_groups_count=len(g), misaligned_groups_count=len(bad),
        misaligned_time_us=mis_t, share_of_device_time_ratio=_ratio(mis_t / total) if total else 0.0,
        share_of_cube_time_ratio=_ratio(mis_t / cube_t) if cube_t else 0.0, min_group_mb=CUBE_GROUP_MB,
        example_operator=str(top["name"]) if top is not None else "",
        example_shapes=str(top["ins"]).strip('"') if top is not None else "",
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(top["name"])] if top is not None else [],
                          counts={"checked_groups": len(g), "misaligned_groups": len(bad)},
                          note="msprof-analyze AI Core performance rule: MatMul groups of >= 100 MB, inner axes "
                               "multiples of 256 (ND: last axis of both inputs; NZ: axes 1 x 2)"),
    )]  # fmt: skip


FA_AXIS = 128  # msprof-analyze AICorePerformanceChecker.INNER_AXIS_128


def fa_dims(name: str, input_shapes: str, output_shapes: str) -> tuple[int | None, int | None]:
    """(head dimension, sequence length) of a FlashAttentionScore task from its shapes: q is the first
    input ([B,N,S,D] / [B,S,N,D]: D last; [B,S,H] / [S,B,H]: H / N; varlen [T,N,D]: D last, no
    sequence length); N and S from the softmax statistics [B,N,S,8] (the first output)."""
    q = (_dims(input_shapes) or [[]])[0]
    stats = (_dims(output_shapes) or [[]])[0]
    if "varlen" in name.lower():
        return (q[2] if len(q) == 3 else None), None
    seq = stats[2] if len(stats) == 4 else None
    if len(q) == 4:
        return q[3], seq
    if len(q) == 3 and len(stats) == 4 and stats[1] > 0 and q[2] % stats[1] == 0:
        return q[2] // stats[1], seq
    return None, seq


def _npu_fa(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not _is_ascend(ctx, kf) or not {"input_shapes", "output_shapes"} <= set(kf.columns):
        return []
    rows = k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    fwd = op == "FlashAttentionScore"
    fa = fwd | (op == "FlashAttentionScoreGrad")
    if not fwd.any():
        return []
    ins = kf["input_shapes"].astype(str).to_numpy()[rows]
    outs = kf["output_shapes"].astype(str).to_numpy()[rows]
    names = [str(k.names[i]) for i in k.name_id]
    verdict: dict[str, tuple[int | None, int | None]] = {}
    for i in np.flatnonzero(fwd):
        q = ins[i].strip('"').split(";")[0]
        if q not in verdict:
            verdict[q] = fa_dims(names[i], ins[i], outs[i])
    bad = np.zeros(len(k), dtype=bool)
    for i in np.flatnonzero(fa):
        d, sq = verdict.get(ins[i].strip('"').split(";")[0], (None, None))
        bad[i] = (d is not None and d % FA_AXIS != 0) or (sq is not None and sq % FA_AXIS != 0)
    fa_t = float(k.dur[fa].sum())
    mis_t = float(k.dur[bad].sum())
    total = float(act.dur.sum())
    hd = sq = None
    ex = ""
    if bad.any():
        _register(ctx, "npu_fa_misaligned", "FlashAttention tasks with head dim or sequence length off 128", k, bad)
        q_of = [ins[i].strip('"').split(";")[0] for i in np.flatnonzero(bad)]
        qs = pd.Series(k.dur[bad]).groupby(pd.Series(q_of)).sum()
        q = str(qs.idxmax())
        hd, sq = verdict.get(q, (None, None))
        ex = next(ins[i].strip('"') for i in np.flatnonzero(bad) if ins[i].strip('"').split(";")[0] == q)
    return [NpuFlashAttentionAlignment(
        rank=ctx.rank, fa_time_us=fa_t, misaligned_time_us=mis_t,
        share_of_device_time_ratio=_ratio(mis_t / total) if total else 0.0,
        share_of_fa_time_ratio=_ratio(mis_t / fa_t) if fa_t else 0.0, head_dim=hd, seq_len=sq, example_shapes=ex,
        evidence=Evidence(time_ranges_us=[ctx.span], counts={"fa_tasks": int(fa.sum()), "misaligned": int(bad.sum())},
                          note="head dimension and sequence length from q and the softmax statistics' shapes; the "
                               "gradient tasks follow the forward call with the same q shape"),
    )]  # fmt: skip


# --- SDPA's math fallback ----------------------------------------------------------------------------
def _decode_pair(dims_text: str, types_text: str) -> tuple:
    """A call's decoded Input Dims and Input type (an empty text is null); both None when either
    text is not JSON."""
    dims, types = decode(dims_text), decode(types_text)
    if _not_json(dims_text, dims) or _not_json(types_text, types):
        return None, None
    return dims, types


def _not_json(text: str, value) -> bool:
    """``decode`` gave None for a text that is neither empty nor JSON's null."""
    return value is None and bool(text) and text.strip(" \t\n\r") != "null"


def _sdpa_math(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    found = sdpa_math_ops(ctx)
    if found is None:
        return []
    is_math, under, bwd = found
    win = _in_windows(ctx, ops["ts"].to_numpy())
    ok = launcher >= 0
    km = ok & (under | bwd)[np.clip(launcher, 0, None)] & (k.cls != _COMM)
    if not km.any():
        return []
    _register(ctx, "sdpa_math", "kernels of scaled_dot_product_attention's math path (forward and backward)", k, km)
    t = float(k.dur[km].sum())
    total = float(act.dur.sum())
    # the math call with the most device time: its q dtype and shape
    # each op's math ancestor (itself included; the innermost where math calls nest)
    root = _spread(ops["parent"].to_numpy(), ops["depth"].to_numpy(), np.where(is_math, np.arange(len(ops)), -1),
                   lambda own, up: np.where(own >= 0, own, up))
    fk = km & under[np.clip(launcher, 0, None)]  # forward kernels: their call names the shape
    if not fk.any():
        fk = km
    call = root[launcher[fk]]
    best = int(pd.Series(k.dur[fk]).groupby(call).sum().idxmax())
    dtype, head, shape = "unknown", None, ""
    if "input_dims" in ops.columns and "input_types" in ops.columns:
        dims, types = _decode_pair(str(ops["input_dims"].iloc[best]), str(ops["input_types"].iloc[best]))
        if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
            head = int(dims[0][-1])
        if isinstance(types, list) and types:
            dtype = (input_type(types[0]) or ("unknown", 0))[0]
        from .flops import shape_signature

        shape = shape_signature(str(ops["input_dims"].iloc[best]), str(ops["input_types"].iloc[best]))
    return [SdpaMathFallback(
        rank=ctx.rank, calls_count=int((is_math & win).sum()), device_us=t,
        share_of_device_time_ratio=_ratio(t / total) if total else 0.0, dtype=dtype, head_dim=head, shape=shape,
        fused_attention_us=float(k.dur[k.cls == _CLS_INDEX["attention"]].sum()),
        evidence=Evidence(time_ranges_us=[(float(ops["ts"].iloc[best]), float(ops["end"].iloc[best]))],
                          events=["aten::_scaled_dot_product_attention_math"],
                          counts={"math_calls": int((is_math & win).sum()), "kernels": int(km.sum())},
                          note="kernels launched under aten::_scaled_dot_product_attention_math, and under the "
                               "autograd nodes of its operators in backward (same sequence numbers)"),
    )]  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    got = ctx.shared.pop("compute_kernels", None)  # large arrays: not kept in the context once used
    try:
        if ctx.windows and got is not None and not len(ctx.trace.kernels):
            return cpu_op_facts(ctx)  # a CPU-only trace: the mechanisms that show in the operators
        if not ctx.windows or got is None or not len(got["act"]) or not len(got["k"]):
            return []
        return kernel_facts(ctx, got["act"], got["k"], got["device"], got["fp32_tf32"], got["devices"],
                            got["launcher"])  # fmt: skip
    finally:
        ctx.shared.pop("compute_ops", None)
        ctx.shared.pop("sdpa_math_ops", None)


def kernel_facts(ctx: RankContext, act: _Acts, k: _Acts, dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int,
                 launcher: np.ndarray | None) -> list[Fact]:  # fmt: skip
    """Every per-kernel fact of the rank."""
    att = _attribution(ctx, k)
    sms = _sm_count(ctx)
    blocks = _blocks(ctx, k)
    facts: list[Fact] = []
    facts.extend(_roofline(ctx, act, k, dev, fp32_tf32, n_dev, att, blocks, sms))
    facts.extend(_grid_fill(ctx, k, blocks, sms))
    facts.extend(_copies(ctx, act, k, launcher))
    facts.extend(_alignment(ctx, act, k, att, dev, fp32_tf32, n_dev))
    facts.extend(_optimizer(ctx, act, k))
    facts.extend(_recompute(ctx, act, k, launcher))
    facts.extend(_decomposed_norms(ctx, act, k))
    facts.extend(_fp64(ctx, act, k, launcher, dev))
    facts.extend(_embedding(ctx, act, k, launcher))
    facts.extend(_large_vocab(ctx, act, k, launcher))
    facts.extend(_attention(ctx, act, k))
    facts.extend(_sdpa_math(ctx, act, k, launcher))
    facts.extend(_grad_scaler(ctx, act, k))
    facts.extend(_conv_fallback(ctx, act, k, launcher))
    facts.extend(_npu_cube(ctx, act, k))
    facts.extend(_npu_fa(ctx, act, k))
    facts.extend(_waves(ctx, k, blocks, sms))
    facts.extend(_strided_elementwise(ctx, act, k, launcher))
    facts.extend(_train_mode(ctx, act, k, launcher))
    facts.extend(_npu_fp32_cube(ctx, act, k))
    facts.extend(_gemm_epilogue(ctx, act, k))
    facts.extend(_npu_vocab_vector(ctx, act, k))
    facts.extend(_sorts(ctx, act, k, launcher))
    return facts


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


def _waves(ctx: RankContext, k: _Acts, blocks: np.ndarray, sms: int | None) -> list[Fact]:
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
    _register(ctx, "wave_tail", "kernels whose last wave of thread blocks is partly empty", k, multi & (tail > 0))
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
        tail_idle_time_us=t, tail_idle_ratio=_ratio(t / kernels_time), matmul_tail_idle_time_us=float(tail[mm].sum()),
        median_waves=med, top_kernel=tk, top_kernel_waves=tw,
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=[tk] if tk else [],
            counts={"multi_wave_kernels": int(multi.sum()), "sms": int(sms)},
            note="w = blocks / (SMs x resident blocks per SM); resident blocks from threads, registers (256 per "
                 "warp granule) and shared memory (+1 KB per block from sm80) against the device's per-SM limits; "
                 "tail idle = duration x (ceil(w) - w) / ceil(w), each wave taken to last as long as the others",
        ),
    )]  # fmt: skip


# --- element-wise kernels on ATen's generic (strided / broadcast) path ----------------------------------
def _strided_elementwise(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ew = k.cls == _CLS_INDEX["elementwise"]
    if not ew.any():
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    gen = np.array([bool(_LEGACY.search(str(k.names[i])[:80])) for i in uid], dtype=bool)[inv.reshape(-1)] & ew
    vec = np.array([("vectorized_elementwise_kernel<" in str(k.names[i])[:80])
                    or ("unrolled_elementwise_kernel<" in str(k.names[i])[:80]) for i in uid],
                   dtype=bool)[inv.reshape(-1)] & ew  # fmt: skip
    if not gen.any():
        return []
    _register(ctx, "strided_elementwise", "element-wise kernels on ATen's generic strided path", k, gen)
    comp = float(k.dur[k.cls != _COMM].sum())
    et, gt = float(k.dur[ew].sum()), float(k.dur[gen].sum())
    tk = _top(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[gen]], dtype=object), k.dur[gen])
    to = ""
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = _cat_apply(ops["name"], str)
        root = _root(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = gen & (launcher >= 0)
        to = _top(names_v[ncodes][root[launcher[ok]]], k.dur[ok]) if ok.any() else ""
    return [StridedElementwise(
        rank=ctx.rank, elementwise_time_us=et, generic_time_us=gt, generic_count=int(gen.sum()),
        vectorized_time_us=float(k.dur[vec].sum()), generic_share_ratio=_ratio(gt / et) if et else 0.0,
        share_of_device_time_ratio=_ratio(gt / comp) if comp else 0.0, top_kernel=tk, top_operator=to,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ([to] if to else []),
                          counts={"generic_kernels": int(gen.sum())},
                          note="element-wise class kernels named elementwise_kernel<...> (ATen's launch with an "
                               "offset calculator per operand), against vectorized_/unrolled_elementwise_kernel"),
    )]  # fmt: skip


# --- training-mode layers in a forward-only trace ---------------------------------------------------
_DROPOUT_OPS = frozenset({"aten::native_dropout", "aten::bernoulli_", "aten::_fused_dropout", "aten::feature_dropout",
                          "aten::alpha_dropout", "aten::_npu_dropout", "aten::npu_dropout_do_mask"})  # fmt: skip
_BN_TRAIN_KERNELS = ("bn_fw_tr_", "batch_norm_collect_statistics", "batchnormcollectstatistics",
                     "welford_kernel", "bn_fwd_tr", "batchnormfwdtraining")  # fmt: skip
# a backward pass: autograd engine nodes, autograd function nodes of any schema (MmBackward0,
# CudnnConvolutionBackward in 2021 traces) and ATen backward operators (cudnn_batch_norm_backward)
_BACKWARD = re.compile(r"^autograd::engine::|Backward\d*$|_backward")
_DROPOUT_KERNELS = ("fused_dropout", "dropout_kernel", "bernoulli", "genbitmask", "dropoutdomask")


def _train_mode(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = _cat_apply(ops["name"], str)
    win = _in_windows(ctx, ops["ts"].to_numpy())
    bwd_v = np.array([bool(_BACKWARD.search(n)) for n in names_v], dtype=bool)
    nb = int((bwd_v[ncodes] & win).sum())
    if nb:
        return []  # a training step: dropout and batch statistics belong to it
    uid, inv = np.unique(k.name_id, return_inverse=True)
    low = [str(k.names[i]).lower() for i in uid]
    bn_k = np.array([any(s in n for s in _BN_TRAIN_KERNELS) for n in low], dtype=bool)[inv.reshape(-1)]
    dk = np.array([any(s in n for s in _DROPOUT_KERNELS) for n in low], dtype=bool)[inv.reshape(-1)]
    drop_v = np.array([n in _DROPOUT_OPS for n in names_v], dtype=bool)
    under = _down(ops["parent"].to_numpy(), ops["depth"].to_numpy(), drop_v[ncodes])
    ok = launcher >= 0
    via = ok & under[np.clip(launcher, 0, None)]
    m = (bn_k | dk | via) & (k.cls != _COMM)
    if not m.any():
        return []
    _register(ctx, "train_mode_kernels", "dropout-mask and batch-statistics kernels of a forward-only run", k, m)
    # calls: the outermost dropout op of each launch, and the launching op of each batch-statistics kernel
    dcalls = {int(launcher[i]) for i in np.flatnonzero(m & ok & ~bn_k)}
    bcalls = {int(launcher[i]) for i in np.flatnonzero(m & ok & bn_k)}
    t = float(k.dur[m].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = _top(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [TrainModeInference(
        rank=ctx.rank, backward_nodes_count=nb, dropout_calls_count=len(dcalls) if dcalls else int((m & ~bn_k).any()),
        batchnorm_train_calls_count=len(bcalls) if bcalls else int((m & bn_k).any()),
        train_mode_kernels_count=int(m.sum()), train_mode_time_us=t,
        share_of_device_time_ratio=_ratio(t / comp) if comp else 0.0, top_kernel=tk,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk], counts={"kernels": int(m.sum())},
                          note="no autograd::engine backward node in the analysed windows; kernels launched under "
                               "native_dropout / bernoulli_, dropout kernels and batch-norm training-statistics "
                               "kernels by name"),
    )]  # fmt: skip


_DROPOUT_WRAPPERS = frozenset({"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                               "aten::feature_alpha_dropout"})  # fmt: skip
# batch-norm operators whose Concrete Inputs hold `training` as argument 5 (input, weight, bias,
# running_mean, running_var, training, momentum, eps[, cudnn_enabled])
_BN_OPS = frozenset({"aten::batch_norm", "aten::_batch_norm_impl_index", "aten::native_batch_norm",
                     "aten::_native_batch_norm_legit"})  # fmt: skip
_BN_TRAIN_OPS = frozenset({"aten::_batch_norm_with_update"})  # always the training behaviour


def _bn_training(txt: str) -> bool:
    """A batch-norm call's `training` argument from its Concrete Inputs (False when not recorded)."""
    c = decode(txt)
    return isinstance(c, list) and len(c) > 5 and str(c[5]).strip('"') == "True"


def cpu_op_facts(ctx: RankContext) -> list[Fact]:
    """Per-kernel mechanisms that a CPU-only trace shows in its operators instead of kernels."""
    return _train_mode_cpu(ctx)


def _train_mode_cpu(ctx: RankContext) -> list[Fact]:
    """_train_mode on a CPU-only trace: the operators compute the training behaviour themselves.
    A dropout call in training mode runs bernoulli_ (or native_dropout) inside it (in eval mode
    aten::dropout returns its input and calls nothing); a batch-norm call in training mode has
    training=True among its Concrete Inputs (or is _batch_norm_with_update). The time is each
    outermost such call's duration, the share is of the operators' self time in the windows."""
    from .compute import _CPU_COMM, _cpu_self_time

    ops = ctx.trace.cpu_ops
    if not len(ops):
        return []
    names_v, ncodes = _cat_apply(ops["name"], str)
    win = _in_windows(ctx, ops["ts"].to_numpy())
    if not win.any():
        return []
    bwd_v = np.array([bool(_BACKWARD.search(n)) for n in names_v], dtype=bool)
    if int((bwd_v[ncodes] & win).sum()):
        return []  # a training step: dropout and batch statistics belong to it
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    ok_p = parent >= 0
    # dropout: the outermost dropout operator of each call tree that draws a mask
    mask_v = np.array([n in _DROPOUT_OPS for n in names_v], dtype=bool)
    drop_v = mask_v | np.array([n in _DROPOUT_WRAPPERS for n in names_v], dtype=bool)
    drop = drop_v[ncodes]
    draws = mask_v[ncodes].copy()
    for d in range(int(depth.max()), 0, -1):  # a mask drawn anywhere below marks the ancestors
        rows = np.flatnonzero((depth == d) & draws & ok_p)
        draws[parent[rows]] = True
    # batch norm: calls with training=True (the outermost batch-norm operator of each tree)
    bn_names = np.array([n in _BN_OPS for n in names_v], dtype=bool)
    bn_train_v = np.array([n in _BN_TRAIN_OPS for n in names_v], dtype=bool)
    bn = (bn_names | bn_train_v)[ncodes]
    bn_tr = bn_train_v[ncodes].copy()
    if "concrete_inputs" in ops.columns and (bn_names[ncodes] & win).any():
        cv, cc = _cat_apply(ops["concrete_inputs"], str)
        tr_v = np.array([_bn_training(t) for t in cv], dtype=bool)
        bn_tr |= bn_names[ncodes] & tr_v[cc]
    for d in range(int(depth.max()), 0, -1):  # training=True anywhere below marks the ancestors
        rows = np.flatnonzero((depth == d) & bn_tr & ok_p)
        bn_tr[parent[rows]] = True
    anc = np.zeros(len(ops), dtype=bool)  # an ancestor of the same family (dropout or batch norm)
    anc[ok_p] = _down(parent, depth, drop | bn)[parent[ok_p]]
    dcall = drop & draws & ~anc & win
    bcall = bn & bn_tr & ~anc & win
    m = dcall | bcall
    if not m.any():
        return []
    dur = ops["dur"].to_numpy()
    st = _cpu_self_time(ops)[win]
    comp_v = np.array([not _CPU_COMM.search(n) for n in names_v], dtype=bool)
    comp = float(st[comp_v[ncodes][win]].sum())
    t = float(dur[m].sum())
    rows = np.flatnonzero(m)
    register(ctx, WhatIfSet.of_intervals("train_mode_kernels", "dropout and training-mode batch-norm operators of "
                                         "a forward-only run", ops["tid"].to_numpy()[rows],
                                         ops["ts"].to_numpy()[rows], ops["end"].to_numpy()[rows]))  # fmt: skip
    top = _top(names_v[ncodes][m], dur[m])
    return [TrainModeInference(
        rank=ctx.rank, backward_nodes_count=0, dropout_calls_count=int(dcall.sum()),
        batchnorm_train_calls_count=int(bcall.sum()), train_mode_kernels_count=int(m.sum()), train_mode_time_us=t,
        share_of_device_time_ratio=_ratio(t / comp) if comp else 0.0, top_kernel=top, measured_on="operators",
        evidence=Evidence(time_ranges_us=[ctx.span], events=[top], counts={"cpu_ops": int(m.sum())},
                          note="CPU-only trace: no autograd backward operator in the analysed windows; dropout "
                               "operators that draw a mask (bernoulli_ / native_dropout inside) and batch-norm "
                               "operators called with training=True (Concrete Inputs); time = the outermost "
                               "calls' durations, share = of the operators' self time (operators stand for kernels)"),
    )]  # fmt: skip


# --- Ascend: Cube operators fed FP32 --------------------------------------------------------------
_NPU_CUBE_RE = re.compile(r"matmul|batchmatmul|conv|gemm|flashattention|grouped_matmul", re.I)
_NPU_FP32 = frozenset({"FLOAT", "FLOAT32", "DT_FLOAT", "DT_FLOAT32", "FP32"})
_NPU_FLOAT16 = frozenset({"FLOAT16", "DT_FLOAT16", "BF16", "DT_BF16", "BFLOAT16", "DT_BFLOAT16", "HALF", "FP16",
                          "HIFLOAT32", "DT_HIFLOAT32", "HF32"})  # fmt: skip


def npu_all_fp32(dtypes: str) -> bool:
    """True when the task's floating inputs are all FP32 (and there is at least one)."""
    parts = [p.strip().upper() for p in str(dtypes).replace('"', "").split(";") if p.strip()]
    fl = [p for p in parts if p in _NPU_FP32 or p in _NPU_FLOAT16]
    return bool(fl) and all(p in _NPU_FP32 for p in fl)


def _npu_fp32_cube(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not _is_ascend(ctx, kf) or "input_dtypes" not in kf.columns:
        return []
    from hermes_kb.facts.npu import NpuFp32Cube

    rows = k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).str.upper().to_numpy()[rows]
    comp = (k.cls != _COMM) & np.array(["HCCL" not in t and "COMMUNICATION" not in t for t in tt], dtype=bool)
    cube = comp & np.array([bool(_NPU_CUBE_RE.search(o)) for o in op], dtype=bool) & \
        np.array(["AI_CPU" not in t and "VECTOR" not in t for t in tt], dtype=bool)  # fmt: skip
    if not cube.any():
        return []
    dts = kf["input_dtypes"].astype(str).to_numpy()[rows]
    fp32 = cube & np.array([npu_all_fp32(d) for d in dts], dtype=bool)
    if not fp32.any():
        return []
    _register(ctx, "npu_fp32_cube", "Cube (MatMul / Conv) tasks computing in FP32", k, fp32)
    is_conv = np.array(["conv" in o.lower() for o in op], dtype=bool)
    hf = None
    if "hf32_eligible" in kf.columns:
        col = kf["hf32_eligible"].astype(str).str.upper().to_numpy()[rows]
        if np.isin(col, ["YES", "NO"]).any():
            hf = float(k.dur[fp32 & (col == "YES")].sum())
    t = float(k.dur[fp32].sum())
    ct = float(k.dur[cube].sum())
    dc = float(k.dur[comp].sum())
    types = pd.Series(k.dur[fp32]).groupby(op[fp32]).sum().sort_values(ascending=False)
    return [NpuFp32Cube(
        rank=ctx.rank, device_compute_us=dc, cube_us=ct, fp32_cube_count=int(fp32.sum()), fp32_cube_us=t,
        fp32_cube_ratio=_ratio(t / ct) if ct else 0.0, fp32_share_of_compute_ratio=_ratio(t / dc) if dc else 0.0,
        matmul_fp32_us=float(k.dur[fp32 & ~is_conv].sum()), conv_fp32_us=float(k.dur[fp32 & is_conv].sum()),
        hf32_eligible_us=hf, not_hf32_eligible_us=max(0.0, t - (hf or 0.0)),
        op_types=[str(x) for x in types.index[:8]],
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(x) for x in types.index[:3]],
                          counts={"fp32_cube_tasks": int(fp32.sum())},
                          note="Cube tasks: op type MatMul / BatchMatMul / Conv / GEMM / FlashAttention not on the AI "
                               "CPU or the Vector core; FP32 = every floating input FLOAT (Input Data Types)"),
    )]  # fmt: skip


# --- element-wise epilogues after GEMMs ----------------------------------------------------------------
_EPI_ADD = re.compile(r"functor_add|functoronself_add|addfunctor|add_kernel|\bbias")
# ReLU runs as clamp_min (launch_clamp_scalar) or threshold in ATen
_EPI_ACT = re.compile(r"gelu|relu|silu|swish|tanh|sigmoid|hardswish|elu_kernel|mish|clamp_min|launch_clamp_scalar|"
                      r"threshold_kernel")


@lru_cache(maxsize=4096)
def epilogue_kind(name: str) -> str:
    """'add', 'activation' or '' for an element-wise kernel, from the functor in its name."""
    head = name.lower()[:200]
    if _EPI_ACT.search(head):
        return "activation"
    if _EPI_ADD.search(head):
        return "add"
    return ""


def _gemm_epilogue(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    if _is_ascend(ctx, ctx.trace.kernels) or len(k) < 2:
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    inv = inv.reshape(-1)
    aux = np.array([tensor_core_kind(str(k.names[i])) == "aux" for i in uid], dtype=bool)[inv]
    gemm = (k.cls == _CLS_INDEX["gemm"]) & ~aux
    if not gemm.any():
        return []
    kind = np.array([epilogue_kind(str(k.names[i])) for i in uid], dtype=object)[inv]
    order = np.lexsort((k.ts, k.stream, k.device))
    nxt = np.full(len(k), -1, dtype=np.int64)  # the next kernel on the same device and stream
    same = (k.stream[order][1:] == k.stream[order][:-1]) & (k.device[order][1:] == k.device[order][:-1])
    nxt[order[:-1][same]] = order[1:][same]
    g = np.flatnonzero(gemm & (nxt >= 0))
    cand = nxt[g]
    cand = cand[(k.cls[cand] == _CLS_INDEX["elementwise"]) & (kind[cand] != "")]
    m = np.zeros(len(k), dtype=bool)
    m[cand] = True
    if not m.any():
        return []
    _register(ctx, "gemm_epilogues", "element-wise adds and activations run right after a GEMM", k, m)
    t = float(k.dur[m].sum())
    gt = float(k.dur[gemm].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = _top(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [GemmEpilogue(
        rank=ctx.rank, gemm_count=int(gemm.sum()), gemm_time_us=gt, epilogue_count=int(m.sum()), epilogue_time_us=t,
        add_time_us=float(k.dur[m & (kind == "add")].sum()),
        activation_time_us=float(k.dur[m & (kind == "activation")].sum()),
        share_of_device_time_ratio=_ratio(t / comp) if comp else 0.0,
        epilogue_to_gemm_ratio=t / gt if gt else 0.0, top_kernel=tk,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk], counts={"epilogue_kernels": int(m.sum())},
                          note="the kernel right after each GEMM on the same stream, when it is an element-wise "
                               "add or activation (gelu, relu, silu, tanh, sigmoid) by its functor name"),
    )]  # fmt: skip


# --- Ascend: vector operators over full logits ---------------------------------------------------------
def first_input_dims(shapes: str) -> list[int] | None:
    """Axes of the first input in a kernel_details 'Input Shapes' cell ('"4096,1,151936;4096,1,1"')."""
    first = str(shapes).replace('"', "").split(";")[0].strip()
    try:
        dims = [int(x) for x in first.split(",") if x.strip()]
    except ValueError:
        return None
    return dims or None


def _npu_vocab_vector(ctx: RankContext, act: _Acts, k: _Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not _is_ascend(ctx, kf) or "input_shapes" not in kf.columns:
        return []
    from hermes_kb.facts.npu import NpuVocabVectorOps

    rows = k.row
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).str.upper().to_numpy()[rows]
    op = kf["op_type"].astype(str).to_numpy()[rows]
    comp = (k.cls != _COMM) & np.array(["HCCL" not in t and "COMMUNICATION" not in t for t in tt], dtype=bool)
    vec = comp & np.array([("VECTOR" in t) or (t == "MIX_AIV") for t in tt], dtype=bool) & \
        np.array([not _NPU_CUBE_RE.search(o) for o in op], dtype=bool)  # fmt: skip
    if not vec.any():
        return []
    shapes = kf["input_shapes"].astype(str).to_numpy()[rows]
    dims = [first_input_dims(x) if v else None for x, v in zip(shapes, vec)]
    m = np.array([d is not None and len(d) >= 2 and d[-1] >= VOCAB_MIN for d in dims], dtype=bool) & vec
    if not m.any():
        return []
    _register(ctx, "npu_vocab_vector_ops", "Vector operators over full language-model logits", k, m)
    best = max((dims[i] for i in np.flatnonzero(m)), key=lambda d: (int(np.prod(d[:-1])) * d[-1], d[-1]))
    nrows, vocab = int(np.prod(best[:-1])), int(best[-1])
    fp32 = np.zeros(len(k), dtype=bool)
    if "input_dtypes" in kf.columns:
        dts = kf["input_dtypes"].astype(str).to_numpy()[rows]
        fp32 = m & np.array([npu_all_fp32(d) if mm else False for d, mm in zip(dts, m)], dtype=bool)
    t = float(k.dur[m].sum())
    dc = float(k.dur[comp].sum())
    types = pd.Series(k.dur[m]).groupby(op[m]).sum().sort_values(ascending=False)
    return [NpuVocabVectorOps(
        rank=ctx.rank, device_compute_us=dc, tasks_count=int(m.sum()), time_us=t,
        share_of_compute_ratio=_ratio(t / dc) if dc else 0.0, fp32_time_us=float(k.dur[fp32].sum()),
        vocab_size=vocab, rows=nrows, logits_fp32_bytes=float(nrows) * vocab * 4.0,
        op_types=[str(x) for x in types.index[:8]],
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(x) for x in types.index[:4]],
                          counts={"tasks": int(m.sum())},
                          note=f"AI Vector / MIX_AIV tasks (not Cube op types) whose first input's last axis is at "
                               f"least {VOCAB_MIN} (a language-model vocabulary)"),
    )]  # fmt: skip


# --- sorting and top-k -------------------------------------------------------------------------------------
_SORT = re.compile(r"radixsort|segmentedsort|segmented_sort|bitonicsort|sortkeyvalue|mergesort|sort_kernel|"
                   r"radixfindkthvalues|gathertopk|sortpostprocess|segmented_bitonic", re.I)


@lru_cache(maxsize=4096)
def is_sort_kernel(name: str) -> bool:
    return bool(_SORT.search(name[:200]))


def _sorts(ctx: RankContext, act: _Acts, k: _Acts, launcher: np.ndarray | None) -> list[Fact]:
    if _is_ascend(ctx, ctx.trace.kernels):
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    m = np.array([is_sort_kernel(str(k.names[i])) for i in uid], dtype=bool)[inv.reshape(-1)] & (k.cls != _COMM)
    if not m.any():
        return []
    _register(ctx, "sort_kernels", "sort and top-k kernels", k, m)
    t = float(k.dur[m].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = _top(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    ops_list: list[str] = []
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = _cat_apply(ops["name"], str)
        root = _root(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = m & (launcher >= 0)
        if ok.any():
            by = pd.Series(k.dur[ok]).groupby(names_v[ncodes][root[launcher[ok]]]).sum().sort_values(ascending=False)
            ops_list = [str(x) for x in by.index[:5]]
    return [SortKernels(
        rank=ctx.rank, kernels_count=int(m.sum()), time_us=t,
        share_of_device_time_ratio=_ratio(t / comp) if comp else 0.0,
        top_kernel=tk, top_operator=ops_list[0] if ops_list else "", operators=ops_list,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ops_list[:2], counts={"sort_kernels": int(m.sum())},
                          note="CUB radix / segmented sorts, ATen bitonic and segmented sorts, top-k selection "
                               "kernels by name; operators = top-level operators that launched them"),
    )]  # fmt: skip
