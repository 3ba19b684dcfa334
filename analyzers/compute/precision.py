"""The precision the device computes in: tensor-core use of GEMM/convolution kernels and FP32 matmuls
left on the CUDA cores (the ``compute`` analyzer), FP64 kernels and GradScaler's kernels (the
``kernels`` analyzer)."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.precision import Fp64DeviceWork, GradScalerKernels, TensorCoreUsage

from ..context import RankContext
from .activities import Acts, ratio, register_device, register_selected, top_label, top_names
from .calltree import cat_apply, root_rows
from .kernel_classes import CLS_INDEX
from .kernel_names import is_fp32_kernel, is_tf32, short_kernel_name, tensor_core_kind

_COMM = CLS_INDEX["communication"]
_MATMUL = (CLS_INDEX["gemm"], CLS_INDEX["conv"], CLS_INDEX["attention"])


# --- tensor cores ---------------------------------------------------------------------------------
def tensor_core_removes(dev: DeviceSpec | None) -> tuple[float | None, float | None]:
    """Share of FP32 CUDA-core GEMM time that tensor-core math removes on ``dev`` (low, high): the
    kernels' time scales with the peak rate, the low end assuming the tensor-core kernels realise
    only half their peak advantage (TF32, or FP16 where there is no TF32), the high end all of it
    (BF16, else FP16)."""
    fp32 = dev.peak("fp32") if dev is not None else None
    if not fp32:
        return None, None
    low_peak = dev.peak("tf32") or dev.peak("fp16")
    high_peak = dev.peak("bf16") or dev.peak("fp16")
    if not low_peak or not high_peak or high_peak <= fp32:
        return None, None
    hi = 1.0 - fp32 / high_peak
    return min(max(0.0, 1.0 - 2.0 * fp32 / low_peak), hi), hi


def tensor_cores(ctx: RankContext, k: Acts, dev: DeviceSpec | None = None,
                 attention_math: np.ndarray | None = None) -> tuple[list[Fact], bool]:
    """The tensor-core fact, and whether FP32 matmuls run as TF32 (for choosing peaks).
    ``attention_math`` (per kernel): kernels of SDPA's math path, which upcasts to FP32 by design;
    their fix is a fused attention backend (C-COMP-007), not the model's precision, so they are
    left out of the FP32 CUDA-core GEMMs."""
    keep = (k.cls == CLS_INDEX["gemm"]) | (k.cls == CLS_INDEX["conv"])
    if attention_math is not None:
        keep &= ~attention_math
    mm = k.take(keep)
    if not len(mm):
        return [], False
    uid, inv = np.unique(mm.name_id, return_inverse=True)
    un = [str(mm.names[i]) for i in uid]
    kind = np.array([tensor_core_kind(n) for n in un])[inv]
    fp32 = np.array([is_fp32_kernel(n) for n in un], dtype=bool)[inv]
    tf32 = np.array([is_tf32(n) for n in un], dtype=bool)[inv]
    dur = mm.dur
    gemm = mm.cls == CLS_INDEX["gemm"]
    gt = float(dur[gemm].sum())
    ct = float(dur[~gemm].sum())
    tot = gt + ct
    tc = float(dur[kind == "tensor"].sum())
    notc = float(dur[kind == "no_tensor"].sum())
    sel = (kind == "no_tensor") & fp32
    register_device(ctx, "fp32_gemm", "FP32 GEMM kernels on CUDA cores (no tensor cores)", mm.take(sel & gemm))
    register_device(ctx, "fp32_conv", "FP32 convolution kernels on CUDA cores (no tensor cores)", mm.take(sel & ~gemm))
    fp32_notc_g = float(dur[gemm & sel].sum())
    removes = tensor_core_removes(dev)
    fp32_notc_all = float(dur[sel].sum())
    fp32_tc = float(dur[fp32 & tf32 & (kind == "tensor")].sum())
    fact = TensorCoreUsage(
        rank=ctx.rank, gemm_time_us=gt, conv_time_us=ct,
        tensor_core_time_us=tc, non_tensor_core_time_us=notc,
        fp32_non_tensor_core_time_us=fp32_notc_all, tf32_time_us=fp32_tc,
        tensor_core_ratio=ratio(tc / tot) if tot else 0.0,
        fp32_non_tensor_core_gemm_ratio=ratio(fp32_notc_g / gt) if gt else 0.0,
        fp32_non_tensor_core_ratio=ratio(fp32_notc_all / tot) if tot else 0.0,
        fp32_non_tensor_core_gemm_time_us=fp32_notc_g,
        tensor_core_removes_low_ratio=removes[0], tensor_core_removes_high_ratio=removes[1],
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=top_names(mm.name_id[sel], dur[sel], mm.names) if sel.any() else
                   top_names(mm.name_id, dur, mm.names),
            counts={"gemm_kernels": int(gemm.sum()), "conv_kernels": int((~gemm).sum()),
                    "fp32_non_tensor_core_kernels": int(sel.sum())},
            note="tensor-core kernels by name (hmma/xmma/wgmma/tensorop/s1688/tf32/bf16/f16/MFMA 'MI..' ...); "
                 "no tensor core: sgemm/simt/gemv/scudnn/winograd ...; split-K reduce and layout helpers are "
                 "neither; ratios are of GEMM+conv kernel time (fp32_non_tensor_core_gemm_ratio: of GEMM time); "
                 "events = longest FP32 non-tensor-core kernels (else longest GEMM/conv kernels)",
        ),
    )  # fmt: skip
    fp32_time = float(dur[fp32].sum())
    return [fact], fp32_time > 0 and fp32_tc >= 0.5 * fp32_time


# --- FP64 ----------------------------------------------------------------------------------------
# a template argument (before the parameter list) that is double, or a double-precision GEMM
_FP64 = re.compile(r"<[^()]*\bdouble\b|dgemm|_d884gemm|_d16816gemm|\bdmma\b|zgemm")


@lru_cache(maxsize=16384)
def is_fp64_kernel(name: str) -> bool:
    head = name.split(">(", 1)[0] if ">(" in name else name.split("(", 1)[0]
    return bool(_FP64.search(head))


def fp64_work(ctx: RankContext, act: Acts, k: Acts, launcher: np.ndarray | None, dev: DeviceSpec | None) -> list[Fact]:
    uid, inv = np.unique(k.name_id, return_inverse=True)
    m = np.array([is_fp64_kernel(str(k.names[i])) for i in uid], dtype=bool)[inv.reshape(-1)] & (k.cls != _COMM)
    if not m.any():
        return []
    register_selected(ctx, "fp64_kernels", "kernels computing in double precision", k, m)
    t = float(k.dur[m].sum())
    total = float(act.dur.sum())
    ratio_peak = None
    if dev is not None and dev.peak("fp64") and dev.peak("fp32"):
        ratio_peak = float(dev.peak("fp64") / dev.peak("fp32"))
    to = ""
    ops = ctx.trace.cpu_ops
    if launcher is not None and len(ops):
        names_v, ncodes = cat_apply(ops["name"], str)
        root = root_rows(ops["parent"].to_numpy(), ops["depth"].to_numpy())
        ok = m & (launcher >= 0)
        to = top_label(names_v[ncodes][root[launcher[ok]]], k.dur[ok]) if ok.any() else ""
    tk = top_label(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [Fp64DeviceWork(
        rank=ctx.rank, kernels_count=int(m.sum()), time_us=t,
        share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        fp64_to_fp32_peak_ratio=ratio_peak, top_kernel=tk, top_operator=to,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk] + ([to] if to else []),
                          counts={"fp64_kernels": int(m.sum())},
                          note="kernels with double in their template arguments, or FP64 GEMMs (dgemm, d884/d16816)"),
    )]  # fmt: skip


# --- GradScaler ------------------------------------------------------------------------------------
def grad_scaler(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
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
    register_selected(ctx, "grad_scaler", "GradScaler unscale / inf-check / scale-update kernels", k, gs)
    return [GradScalerKernels(
        rank=ctx.rank, kernels_count=int(gs.sum()), time_us=t,
        share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        bf16_matmul_ratio=ratio(float(k.dur[mm & bf].sum()) / mt) if mt else 0.0,
        fp16_matmul_ratio=ratio(float(k.dur[mm & f16].sum()) / mt) if mt else 0.0,
        evidence=Evidence(time_ranges_us=[ctx.span], events=sorted({short_kernel_name(str(k.names[i]))
                                                                     for i in np.unique(k.name_id[gs])}),
                          counts={"grad_scaler_kernels": int(gs.sum())},
                          note="GradScaler kernels by name; matmul precision from the GEMM/conv/attention "
                               "kernel names"),
    )]  # fmt: skip
