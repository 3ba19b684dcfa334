"""Attention (the ``kernels`` analyzer, with the SDPA math-path rows the ``compute`` analyzer also
needs): the fused backends' share of attention time and the masks SDPA calls pass, and SDPA's
math fallback (unfused matmuls and softmax, upcast to FP32) in forward and backward."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from hermes_kb.core.dtypes import input_type
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.attention import AttentionBackends, SdpaMathFallback
from hermes_kb.trace.args import decode

from ..context import RankContext
from .activities import Acts, ratio, register_selected, top_label
from .calltree import cat_apply, down, in_windows, spread
from .flops import shape_signature
from .kernel_classes import CLS_INDEX
from .kernel_names import short_kernel_name


_COMM = CLS_INDEX["communication"]

_SDPA_MATH = frozenset({"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_attention_math_for_mps"})


def sdpa_math_ops(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per cpu-op row (the math call itself, ops under a math call, ops of its backward) when SDPA
    ran its math path in the analysed steps, else None. The backward's autograd nodes carry the
    sequence number of the forward operator that made them. Computed once per rank (the compute
    and kernel analyzers both need it)."""
    if "sdpa_math_ops" in ctx.shared:
        return ctx.shared["sdpa_math_ops"]
    ctx.shared["sdpa_math_ops"] = found = _sdpa_math_ops(ctx)
    return found


def _sdpa_math_ops(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return None
    names_v, ncodes = cat_apply(ops["name"], str)
    is_math = np.array([n in _SDPA_MATH for n in names_v], dtype=bool)[ncodes]
    win = in_windows(ctx, ops["ts"].to_numpy())
    if not (is_math & win).any():
        return None
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    under = down(parent, depth, is_math)
    bwd = np.zeros(len(ops), dtype=bool)
    if "seq" in ops.columns:
        seq = ops["seq"].to_numpy()
        fseq = np.unique(seq[under & (seq >= 0)])  # a forward before the first window still has its backward in it
        bnames = np.array([("Backward" in n) for n in names_v], dtype=bool)[ncodes]
        bwd = ~under & bnames & np.isin(seq, fseq) & (seq >= 0)
        bwd = down(parent, depth, bwd) if bwd.any() else bwd
    return is_math, under, bwd


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
    names_v, ncodes = cat_apply(ops["name"], str)
    sd = (names_v == _SDPA_OP)[ncodes] & in_windows(ctx, ops["ts"].to_numpy())
    if not sd.any():
        return 0, 0, 0
    dims_v, dcodes = cat_apply(ops["input_dims"], str)
    conc = "concrete_inputs" in ops.columns and isinstance(ops["concrete_inputs"].dtype, pd.CategoricalDtype)
    conc_v, ccodes = cat_apply(ops["concrete_inputs"], str) if conc else (np.array([""], dtype=object), np.zeros(len(ops), np.int64))
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


def attention_backends(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    m = k.cls == CLS_INDEX["attention"]
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
                sdpa_dt = top_label(np.asarray(info["dtype"], dtype=object)[call[ok]][sd], k.dur[ok][sd]) or None
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
        rank=ctx.rank, attention_time_us=t, share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        flash_us=parts["flash"], efficient_us=parts["efficient"], cudnn_us=parts["cudnn"], other_us=parts["other"],
        efficient_share_ratio=ratio(parts["efficient"] / t) if t else 0.0, sdpa_dtype=sdpa_dt, compute_capability=cc,
        sdpa_calls_count=calls, masked_calls_count=masked, masked_share_ratio=ratio(masked / calls) if calls else 0.0,
        masked_us=t * (masked / calls) if calls else 0.0, masked_not_causal_count=not_causal,
        evidence=Evidence(time_ranges_us=[ctx.span],
                          events=[short_kernel_name(str(k.names[i])) for i in uid][:4],
                          counts={"attention_kernels": int(m.sum())},
                          note="fused attention kernels by name: flash (flash_fwd/bwd), memory-efficient (CUTLASS "
                               "fmha / efficient_attention), cuDNN"),
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


def sdpa_math(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    found = sdpa_math_ops(ctx)
    if found is None:
        return []
    is_math, under, bwd = found
    win = in_windows(ctx, ops["ts"].to_numpy())
    ok = launcher >= 0
    km = ok & (under | bwd)[np.clip(launcher, 0, None)] & (k.cls != _COMM)
    if not km.any():
        return []
    register_selected(ctx, "sdpa_math", "kernels of scaled_dot_product_attention's math path (forward and backward)", k, km,
                      launches=True)
    t = float(k.dur[km].sum())
    total = float(act.dur.sum())
    # the math call with the most device time: its q dtype and shape
    # each op's math ancestor (itself included; the innermost where math calls nest)
    root = spread(ops["parent"].to_numpy(), ops["depth"].to_numpy(), np.where(is_math, np.arange(len(ops)), -1),
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
        shape = shape_signature(str(ops["input_dims"].iloc[best]), str(ops["input_types"].iloc[best]))
    return [SdpaMathFallback(
        rank=ctx.rank, calls_count=int((is_math & win).sum()), device_us=t,
        share_of_device_time_ratio=ratio(t / total) if total else 0.0, dtype=dtype, head_dim=head, shape=shape,
        fused_attention_us=float(k.dur[k.cls == CLS_INDEX["attention"]].sum()),
        evidence=Evidence(time_ranges_us=[(float(ops["ts"].iloc[best]), float(ops["end"].iloc[best]))],
                          events=["aten::_scaled_dot_product_attention_math"],
                          counts={"math_calls": int((is_math & win).sum()), "kernels": int(km.sum())},
                          note="kernels launched under aten::_scaled_dot_product_attention_math, and under the "
                               "autograd nodes of its operators in backward (same sequence numbers)"),
    )]  # fmt: skip
