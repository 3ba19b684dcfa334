"""How tensors are laid out (the ``kernels`` analyzer): what the memory-class device time is made of
(dtype casts, strided copies, concatenations, fills, NCHW<->NHWC transposes, ...), GEMMs on
narrow-alignment kernels or with K / N off the tensor-core load, and element-wise kernels on
ATen's generic strided path."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.core.dtypes import input_type
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.layouts import DeviceCopyKind, GemmAlignment, StridedElementwise
from hermes_kb.trace.args import decode

from ..context import RankContext
from .activities import Acts, is_ascend, ratio, register_selected, top_label
from .calltree import cat_apply, root_rows
from .flops import shape_signature
from .kernel_classes import CLS_INDEX
from .kernel_names import short_kernel_name, tensor_core_kind


# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
ALIGN_16BIT = 8  # elements per tensor-core load in FP16/BF16 (16 bytes)
ALIGN_32BIT = 4  # in FP32/TF32
ALIGN_8BIT = 16  # in FP8/INT8

_COMM = CLS_INDEX["communication"]
_MEM = CLS_INDEX["memory"]

# --- name tests (lower-cased full kernel names) ----------------------------------------------
_LAYOUT = ("nchwtonhwc", "nhwctonchw", "nchw2nhwc", "nhwc2nchw", "batched_transpose")
_CONCAT = ("catarraybatchedcopy", "cat_array", "concat_")
_FILL = ("fillfunctor", "fill_kernel", "memset")
_INDEX = ("indexselect", "index_select", "gather", "scatter", "indexfunc", "index_elementwise", "index_put",
          "take_kernel", "masked_select")  # fmt: skip
_COPY = ("copy_kernel", "direct_copy", "_to_copy", "tofloat32_copy", "tobfloat16_copy")
_CAST_NAMES = ("bfloat16_copy_kernel", "float16_copy_kernel", "half_copy_kernel", "float8_copy_kernel",
               "tofloat32_copy", "tobfloat16_copy", "float_to_bf16", "bf16_to_float")  # fmt: skip

_ALIGN = re.compile(r"_align(\d+)\b")

# ATen's generic (non-vectorised) launch: an OffsetCalculator per operand, used for strided,
# broadcast or cast-on-the-fly operands (not vectorized_/unrolled_elementwise_kernel)
_LEGACY = re.compile(r"(^|[\s:])elementwise_kernel<")
_LOW_PRECISION = re.compile(r"bf16|f16|half|hgemm|h884|h1688|h16816|bfloat16", re.I)
_EIGHT_BIT = re.compile(r"e4m3|e5m2|fp8|i8816|i16832|int8|_i8", re.I)


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


def copy_kinds(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    tr = ctx.trace
    mem = act.cls == _MEM
    if not mem.any() or is_ascend(ctx, tr.kernels):
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
        names_v, ncodes = cat_apply(ops["name"], str)
        opn = names_v[ncodes]
        if "input_types" in ops.columns:
            diff_v, tcodes = cat_apply(ops["input_types"], lambda s: _copy_dtypes_differ(s))
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
        root = root_rows(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        r = np.where(ok, root[np.clip(lk, 0, None)], -1)
        top_op[kpos[ok]] = opn[r[ok]]
        if "input_dims" in ops.columns:
            dims_v, dcodes = cat_apply(ops["input_dims"], str)
            sig = np.array([shape_signature(s) for s in dims_v], dtype=object)[dcodes]
            top_shape[kpos[ok]] = sig[r[ok]]
    total = float(act.dur.sum())
    mem_time = float(act.dur[mem].sum())
    conv_time = float(act.dur[act.cls == CLS_INDEX["conv"]].sum())
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
            # a conversion no longer made, or made once, is a call no longer made
            register_selected(ctx, sets[ck][0], sets[ck][1], act, m, launches=ck in ("dtype_cast", "layout_transpose"))
        t = float(act.dur[m].sum())
        tk = top_label(np.array([short_kernel_name(str(act.names[i])) for i in act.name_id[m]], dtype=object), act.dur[m])
        to = top_label(top_op[m], act.dur[m])
        ts_ = ""
        if to:
            sel = m & (top_op == to)
            ts_ = top_label(top_shape[sel], act.dur[sel])
        out.append(DeviceCopyKind(
            rank=ctx.rank, copy_kind=ck, time_us=t, count=n, mean_duration_us=t / n,
            share_of_device_time_ratio=ratio(t / total) if total else 0.0,
            share_of_memory_time_ratio=ratio(t / mem_time) if mem_time else 0.0, top_kernel=tk, top_operator=to,
            top_operator_shape=ts_,
            conv_time_us=conv_time if ck == "layout_transpose" else None,
            layout_to_conv_ratio=ratio(t / (t + conv_time)) if ck == "layout_transpose" else None,
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


def gemm_alignment(ctx: RankContext, act: Acts, k: Acts, att: tuple, dev: DeviceSpec | None, fp32_tf32: bool,
                   n_dev: int) -> list[Fact]:  # fmt: skip
    gemm = k.cls == CLS_INDEX["gemm"]
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
    register_selected(ctx, "misaligned_gemms", "GEMM kernels on narrow-alignment paths", k, mis)
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
        return ratio(float(flops[sel].sum()) / (float(k.dur[sel].sum()) * 1e-6) / (p[1] * n_dev))

    u_mis, u_al = util(mis), util(gemm & ~mis)
    top = np.bincount(k.name_id[mis], weights=k.dur[mis], minlength=len(k.names))
    ex_k = short_kernel_name(str(k.names[int(np.argmax(top))]))
    ex_full = str(k.names[int(np.argmax(top))])
    return [GemmAlignment(
        rank=ctx.rank, gemm_time_us=gt, misaligned_time_us=t, misaligned_count=int(mis.sum()),
        misaligned_by_name_us=float(k.dur[by_name].sum()), misaligned_by_shape_us=float(k.dur[by_shape].sum()),
        share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        share_of_gemm_time_ratio=ratio(t / gt) if gt else 0.0,
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


# --- element-wise kernels on ATen's generic (strided / broadcast) path ----------------------------------
def strided_elementwise(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ew = k.cls == CLS_INDEX["elementwise"]
    if not ew.any():
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    gen = np.array([bool(_LEGACY.search(str(k.names[i])[:80])) for i in uid], dtype=bool)[inv.reshape(-1)] & ew
    vec = np.array([("vectorized_elementwise_kernel<" in str(k.names[i])[:80])
                    or ("unrolled_elementwise_kernel<" in str(k.names[i])[:80]) for i in uid],
                   dtype=bool)[inv.reshape(-1)] & ew  # fmt: skip
    if not gen.any():
        return []
    register_selected(ctx, "strided_elementwise", "element-wise kernels on ATen's generic strided path", k, gen)
    comp = float(k.dur[k.cls != _COMM].sum())
    et, gt = float(k.dur[ew].sum()), float(k.dur[gen].sum())
    tk = top_label(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[gen]], dtype=object), k.dur[gen])
    to = ""
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = cat_apply(ops["name"], str)
        root = root_rows(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = gen & (launcher >= 0)
        to = top_label(names_v[ncodes][root[launcher[ok]]], k.dur[ok]) if ok.any() else ""
    return [StridedElementwise(
        rank=ctx.rank, elementwise_time_us=et, generic_time_us=gt, generic_count=int(gen.sum()),
        vectorized_time_us=float(k.dur[vec].sum()), generic_share_ratio=ratio(gt / et) if et else 0.0,
        share_of_device_time_ratio=ratio(gt / comp) if comp else 0.0, top_kernel=tk, top_operator=to,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ([to] if to else []),
                          counts={"generic_kernels": int(gen.sum())},
                          note="element-wise class kernels named elementwise_kernel<...> (ATen's launch with an "
                               "offset calculator per operand), against vectorized_/unrolled_elementwise_kernel"),
    )]  # fmt: skip
