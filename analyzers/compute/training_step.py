"""The training step's phases around the model's layers (the ``kernels`` analyzer): the optimizer's
device work and how it is implemented, forward layers recomputed in backward (activation
checkpointing), and training-mode layers (dropout masks, batch statistics) in a forward-only run,
from kernels or, on a CPU-only trace, from the operators."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.training_step import ActivationRecompute, OptimizerDevice, TrainModeInference
from hermes_kb.trace.args import decode

from ..context import RankContext
from ..selection import name_mask
from ..whatif.sets import WhatIfSet, register
from .activities import Acts, ratio, register_selected, top_label
from .calltree import cat_apply, cpu_self_time, down, in_windows
from .kernel_classes import CLS_INDEX, CPU_COMM
from .kernel_names import short_kernel_name


_COMM = CLS_INDEX["communication"]


# --- optimizer -----------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def optimizer_kernel_kind(name: str) -> str:
    low = name.lower()
    if "fused" in low or "adammode" in low:
        return "fused"  # PyTorch fused=True (Fused*MathFunctor), apex FusedAdam (adamMode_t), NpuFused*
    if "multi_tensor_apply" in low or "foreach" in low:
        return "foreach"
    return "per_tensor"


def optimizer_device(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
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
        calls = calls[in_windows(ctx, calls["ts"].to_numpy())]
    if not len(calls):
        return []
    cname = str(calls["name"].iloc[0])
    opt = re.match(r"^Optimizer\.step#(\w+)\.step$", cname)
    dev_t = float(act.dur[m].sum())
    comp = float(act.dur[act.cls != _COMM].sum())
    n = int(m.sum())
    register_selected(ctx, "optimizer_kernels", "the device work launched inside optimizer.step()", act, m, launches=True)
    return [OptimizerDevice(
        rank=ctx.rank, optimizer=opt.group(1) if opt else "unknown", implementation=impl,
        calls_count=len(calls), kernels_count=n, kernels_per_call=n / len(calls), device_us=dev_t,
        share_of_device_time_ratio=ratio(dev_t / comp) if comp else 0.0, mean_kernel_us=dev_t / n,
        evidence=Evidence(
            time_ranges_us=[(float(calls["ts"].iloc[0]), float(calls["end"].iloc[0]))],
            events=[cname] + [short_kernel_name(str(act.names[i])) for i in np.unique(act.name_id[kin])][:3],
            counts={"calls": len(calls), "device_activities": n},
            note="device work launched inside the Optimizer.step annotations; implementation from the kernel "
                 "names (fused: Fused*/apex adamMode; foreach: multi_tensor_apply; else one kernel per tensor)",
        ),
    )]  # fmt: skip


_CHECKPOINT_FRAME = re.compile(re.escape("torch/utils/checkpoint.py"))

# module-level forward operators that backward formulas never call (they call the underlying
# convolution_backward, mm, native_*_backward): found under an autograd node, they recompute a layer
_FWD_LAYERS = frozenset(f"aten::{n}" for n in (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
    "batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm", "embedding", "embedding_bag",
    "scaled_dot_product_attention", "dropout", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
))  # fmt: skip

_EVAL = "autograd::engine::evaluate_function:"


# --- recomputation (activation checkpointing) -----------------------------------------------------
def recompute(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = cat_apply(ops["name"], str)
    layer_v = np.array([n in _FWD_LAYERS for n in names_v], dtype=bool)
    eval_v = np.array([n.startswith(_EVAL) for n in names_v], dtype=bool)
    parent, depth = ops["parent"].to_numpy(), ops["depth"].to_numpy()
    layer = layer_v[ncodes]
    # TorchScript's differentiable graphs run their own backward graph (aten::matmul, linear, ...)
    # under the autograd node: that is the backward itself, not a recomputation
    scripted_v = np.array([n == "<backward op>" or "DifferentiableGraphBackward" in n for n in names_v], dtype=bool)
    in_bw = down(parent, depth, eval_v[ncodes]) & ~down(parent, depth, scripted_v[ncodes])
    under_layer = down(parent, depth, layer)
    # a forward layer inside a backward node, and everything it calls
    recomp_root = layer & in_bw
    recomp = down(parent, depth, recomp_root)
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
    n_calls = int((recomp_root & in_windows(ctx, ops["ts"].to_numpy())).sum())
    sub = k.take(kr)
    register(ctx, WhatIfSet("recompute", "kernels of forward layers recomputed in backward", kernels=sub.row))
    return [ActivationRecompute(
        rank=ctx.rank, recompute_calls_count=n_calls, recompute_device_us=rt, forward_device_us=ft,
        recompute_to_forward_ratio=rt / ft if ft > 0 else 0.0, device_compute_us=comp,
        share_of_device_time_ratio=ratio(rt / comp) if comp else 0.0, checkpoint_frames_count=frames,
        peak_allocated_ratio=_peak_memory_ratio(ctx),
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[top_label(names_v[ncodes][recomp_root], ops["dur"].to_numpy()[recomp_root])],
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
    return ratio(float(a.max()) / total) if len(a) else None


# --- training-mode layers in a forward-only trace ---------------------------------------------------
_DROPOUT_OPS = frozenset({"aten::native_dropout", "aten::bernoulli_", "aten::_fused_dropout", "aten::feature_dropout",
                          "aten::alpha_dropout", "aten::_npu_dropout", "aten::npu_dropout_do_mask"})  # fmt: skip
_BN_TRAIN_KERNELS = ("bn_fw_tr_", "batch_norm_collect_statistics", "batchnormcollectstatistics",
                     "welford_kernel", "bn_fwd_tr", "batchnormfwdtraining")  # fmt: skip
# a backward pass: autograd engine nodes, autograd function nodes of any schema (MmBackward0,
# CudnnConvolutionBackward in 2021 traces) and ATen backward operators (cudnn_batch_norm_backward)
_BACKWARD = re.compile(r"^autograd::engine::|Backward\d*$|_backward")
_DROPOUT_KERNELS = ("fused_dropout", "dropout_kernel", "bernoulli", "genbitmask", "dropoutdomask")


def train_mode(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if launcher is None or not len(ops):
        return []
    names_v, ncodes = cat_apply(ops["name"], str)
    win = in_windows(ctx, ops["ts"].to_numpy())
    bwd_v = np.array([bool(_BACKWARD.search(n)) for n in names_v], dtype=bool)
    nb = int((bwd_v[ncodes] & win).sum())
    if nb:
        return []  # a training step: dropout and batch statistics belong to it
    uid, inv = np.unique(k.name_id, return_inverse=True)
    low = [str(k.names[i]).lower() for i in uid]
    bn_k = np.array([any(s in n for s in _BN_TRAIN_KERNELS) for n in low], dtype=bool)[inv.reshape(-1)]
    dk = np.array([any(s in n for s in _DROPOUT_KERNELS) for n in low], dtype=bool)[inv.reshape(-1)]
    drop_v = np.array([n in _DROPOUT_OPS for n in names_v], dtype=bool)
    under = down(ops["parent"].to_numpy(), ops["depth"].to_numpy(), drop_v[ncodes])
    ok = launcher >= 0
    via = ok & under[np.clip(launcher, 0, None)]
    m = (bn_k | dk | via) & (k.cls != _COMM)
    if not m.any():
        return []
    register_selected(ctx, "train_mode_kernels", "dropout-mask and batch-statistics kernels of a forward-only run", k, m)
    # calls: the outermost dropout op of each launch, and the launching op of each batch-statistics kernel
    dcalls = {int(launcher[i]) for i in np.flatnonzero(m & ok & ~bn_k)}
    bcalls = {int(launcher[i]) for i in np.flatnonzero(m & ok & bn_k)}
    t = float(k.dur[m].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = top_label(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [TrainModeInference(
        rank=ctx.rank, backward_nodes_count=nb, dropout_calls_count=len(dcalls) if dcalls else int((m & ~bn_k).any()),
        batchnorm_train_calls_count=len(bcalls) if bcalls else int((m & bn_k).any()),
        train_mode_kernels_count=int(m.sum()), train_mode_time_us=t,
        share_of_device_time_ratio=ratio(t / comp) if comp else 0.0, top_kernel=tk,
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


def train_mode_cpu(ctx: RankContext) -> list[Fact]:
    """train_mode on a CPU-only trace: the operators compute the training behaviour themselves.
    A dropout call in training mode runs bernoulli_ (or native_dropout) inside it (in eval mode
    aten::dropout returns its input and calls nothing); a batch-norm call in training mode has
    training=True among its Concrete Inputs (or is _batch_norm_with_update). The time is each
    outermost such call's duration, the share is of the operators' self time in the windows."""
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return []
    names_v, ncodes = cat_apply(ops["name"], str)
    win = in_windows(ctx, ops["ts"].to_numpy())
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
        cv, cc = cat_apply(ops["concrete_inputs"], str)
        tr_v = np.array([_bn_training(t) for t in cv], dtype=bool)
        bn_tr |= bn_names[ncodes] & tr_v[cc]
    for d in range(int(depth.max()), 0, -1):  # training=True anywhere below marks the ancestors
        rows = np.flatnonzero((depth == d) & bn_tr & ok_p)
        bn_tr[parent[rows]] = True
    anc = np.zeros(len(ops), dtype=bool)  # an ancestor of the same family (dropout or batch norm)
    anc[ok_p] = down(parent, depth, drop | bn)[parent[ok_p]]
    dcall = drop & draws & ~anc & win
    bcall = bn & bn_tr & ~anc & win
    m = dcall | bcall
    if not m.any():
        return []
    dur = ops["dur"].to_numpy()
    st = cpu_self_time(ops)[win]
    comp_v = np.array([not CPU_COMM.search(n) for n in names_v], dtype=bool)
    comp = float(st[comp_v[ncodes][win]].sum())
    t = float(dur[m].sum())
    rows = np.flatnonzero(m)
    register(ctx, WhatIfSet.of_intervals("train_mode_kernels", "dropout and training-mode batch-norm operators of "
                                         "a forward-only run", ops["tid"].to_numpy()[rows],
                                         ops["ts"].to_numpy()[rows], ops["end"].to_numpy()[rows]))  # fmt: skip
    top = top_label(names_v[ncodes][m], dur[m])
    return [TrainModeInference(
        rank=ctx.rank, backward_nodes_count=0, dropout_calls_count=int(dcall.sum()),
        batchnorm_train_calls_count=int(bcall.sum()), train_mode_kernels_count=int(m.sum()), train_mode_time_us=t,
        share_of_device_time_ratio=ratio(t / comp) if comp else 0.0, top_kernel=top, measured_on="operators",
        evidence=Evidence(time_ranges_us=[ctx.span], events=[top], counts={"cpu_ops": int(m.sum())},
                          note="CPU-only trace: no autograd backward operator in the analysed windows; dropout "
                               "operators that draw a mask (bernoulli_ / native_dropout inside) and batch-norm "
                               "operators called with training=True (Concrete Inputs); time = the outermost "
                               "calls' durations, share = of the operators' self time (operators stand for kernels)"),
    )]  # fmt: skip
