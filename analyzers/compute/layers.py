"""Model layers that take slow paths (the ``kernels`` analyzer): dense embedding gradients,
cross-entropy over a large vocabulary, convolutions on PyTorch's native fallback kernels
(depthwise, im2col), and sort / top-k kernels."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from hermes_kb.core.dtypes import input_type
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.layers import ConvFallback, EmbeddingBackward, LargeVocabLoss, SortKernels
from hermes_kb.trace.args import decode

from ..context import RankContext
from ..whatif.sets import WhatIfSet, register
from .activities import Acts, is_ascend, ratio, register_selected, top_label
from .calltree import cat_apply, down, in_windows, root_rows
from .kernel_classes import CLS_INDEX
from .kernel_names import short_kernel_name


VOCAB_MIN = 32768  # a language-model vocabulary (GPT-2 50257, Llama 32000-128256, Qwen 151936)

_COMM = CLS_INDEX["communication"]


# --- dense embedding gradients -----------------------------------------------------------------------
_EMB_DENSE = frozenset({"aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward",
                        "aten::embedding_backward", "aten::_embedding_bag_backward"})  # fmt: skip
_EMB_SPARSE = frozenset({"aten::embedding_sparse_backward", "aten::_embedding_bag_sparse_backward"})


def embedding_backward(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = cat_apply(ops["name"], str)
    dense_v = np.array([n in _EMB_DENSE for n in names_v], dtype=bool)
    sparse_v = np.array([n in _EMB_SPARSE for n in names_v], dtype=bool)
    dense = dense_v[ncodes]
    win = in_windows(ctx, ops["ts"].to_numpy())
    if not (dense & win).any():
        return []
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    under = down(parent, depth, dense)
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
            cv, cc = cat_apply(ops["concrete_inputs"], str)
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
        share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        sparse_calls_count=int((sparse_v[ncodes] & win).sum()), weight_rows=rows_max,
        evidence=Evidence(time_ranges_us=[ctx.span], events=sorted({str(x) for x in names_v[ncodes][outer]}),
                          counts={"dense_calls": int(outer.sum())},
                          note="kernels launched under embedding_dense_backward / _embedding_bag_dense_backward"),
    )]  # fmt: skip


_LOSS_OPS = frozenset({"aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax",
                       "aten::_log_softmax_backward_data", "aten::nll_loss", "aten::nll_loss_nd",
                       "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward",
                       "aten::nll_loss2d_backward"})  # fmt: skip
_LOG_SOFTMAX = frozenset({"aten::log_softmax", "aten::_log_softmax"})


# --- cross-entropy over a large vocabulary --------------------------------------------------------
def large_vocab_loss(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops) or "input_dims" not in ops.columns:
        return []
    names_v, ncodes = cat_apply(ops["name"], str)
    ls_v = np.array([n in _LOG_SOFTMAX for n in names_v], dtype=bool)
    win = in_windows(ctx, ops["ts"].to_numpy())
    ls = ls_v[ncodes] & win
    if not ls.any():
        return []
    dims_v, dcodes = cat_apply(ops["input_dims"], str)
    if "input_types" in ops.columns:
        types_v, tcodes = cat_apply(ops["input_types"], str)
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
    under = down(parent, depth, loss_v[ncodes])
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
        calls_count=int(ls.sum()), device_us=t, share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        evidence=Evidence(time_ranges_us=[ctx.span], events=["aten::log_softmax", f"[{rows},{vocab}] {dt}"],
                          counts={"log_softmax_calls": int(ls.sum())},
                          note="kernels launched under log_softmax / nll_loss / cross_entropy and their backward"),
    )]  # fmt: skip


# --- convolutions on PyTorch's fallback kernels -------------------------------------------------------
_DEPTHWISE = ("conv_depthwise2d", "conv_depthwise3d")
_IM2COL = ("im2col_kernel", "col2im_kernel", "vol2col_kernel", "col2vol_kernel")
_SLOW_CONV_OPS = frozenset(f"aten::{n}" for n in (
    "_slow_conv2d_forward", "_slow_conv2d_backward", "slow_conv_dilated2d", "slow_conv_dilated3d",
    "slow_conv_transpose2d", "slow_conv_transpose3d", "slow_conv3d_forward", "thnn_conv2d", "_conv_depthwise2d",
    "conv_depthwise3d",
))  # fmt: skip


def conv_fallback(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    uid, inv = np.unique(k.name_id, return_inverse=True)
    inv = inv.reshape(-1)
    low = [str(k.names[i]).lower() for i in uid]
    dw = np.array([any(s in n for s in _DEPTHWISE) for n in low], dtype=bool)[inv]
    ic = np.array([any(s in n for s in _IM2COL) for n in low], dtype=bool)[inv]
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = cat_apply(ops["name"], str)
        slow_v = np.array([n in _SLOW_CONV_OPS for n in names_v], dtype=bool)
        under = down(ops["parent"].to_numpy(), ops["depth"].to_numpy(), slow_v[ncodes])
        ok = launcher >= 0
        via_op = ok & under[np.clip(launcher, 0, None)] & (k.cls != _COMM)
        ic = ic | (via_op & ~dw)
    m = (dw | ic) & (k.cls != _COMM)
    if not m.any():
        return []
    register_selected(ctx, "conv_fallback", "convolution kernels of PyTorch's native fallback paths", k, m)
    d, i = float(k.dur[dw & m].sum()), float(k.dur[ic & m & ~dw].sum())
    lib = float(k.dur[(k.cls == CLS_INDEX["conv"]) & ~m].sum())
    total = float(act.dur.sum())
    tk = top_label(np.array([short_kernel_name(str(k.names[j])) for j in k.name_id[m]], dtype=object), k.dur[m])
    return [ConvFallback(
        rank=ctx.rank, depthwise_us=d, im2col_us=i, fallback_us=d + i, library_conv_us=lib,
        share_of_device_time_ratio=ratio((d + i) / total) if total else 0.0,
        share_of_conv_time_ratio=ratio((d + i) / (d + i + lib)) if d + i + lib > 0 else 0.0, top_kernel=tk,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk], counts={"fallback_kernels": int(m.sum())},
                          note="native depthwise kernels and im2col/col2im kernels by name, and every kernel launched "
                               "under a slow_conv* operator"),
    )]  # fmt: skip


# --- sorting and top-k -------------------------------------------------------------------------------------
_SORT = re.compile(r"radixsort|segmentedsort|segmented_sort|bitonicsort|sortkeyvalue|mergesort|sort_kernel|"
                   r"radixfindkthvalues|gathertopk|sortpostprocess|segmented_bitonic", re.I)


@lru_cache(maxsize=4096)
def is_sort_kernel(name: str) -> bool:
    return bool(_SORT.search(name[:200]))


def sort_kernels(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    if is_ascend(ctx, ctx.trace.kernels):
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    m = np.array([is_sort_kernel(str(k.names[i])) for i in uid], dtype=bool)[inv.reshape(-1)] & (k.cls != _COMM)
    if not m.any():
        return []
    register_selected(ctx, "sort_kernels", "sort and top-k kernels", k, m)
    t = float(k.dur[m].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = top_label(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    ops_list: list[str] = []
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = cat_apply(ops["name"], str)
        root = root_rows(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = m & (launcher >= 0)
        if ok.any():
            by = pd.Series(k.dur[ok]).groupby(names_v[ncodes][root[launcher[ok]]]).sum().sort_values(ascending=False)
            ops_list = [str(x) for x in by.index[:5]]
    return [SortKernels(
        rank=ctx.rank, kernels_count=int(m.sum()), time_us=t,
        share_of_device_time_ratio=ratio(t / comp) if comp else 0.0,
        top_kernel=tk, top_operator=ops_list[0] if ops_list else "", operators=ops_list,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ops_list[:2], counts={"sort_kernels": int(m.sum())},
                          note="CUB radix / segmented sorts, ATen bitonic and segmented sorts, top-k selection "
                               "kernels by name; operators = top-level operators that launched them"),
    )]  # fmt: skip
