"""compute: what the device computes, how well, and what could be fused.

Per rank, over the analysed step windows (see docs/analysis/compute.md for every formula):

- kernel classes (GEMM, convolution, attention, element-wise, reduction, normalisation, memory,
  communication, other) by kernel-name patterns, with their share of device time and of step
  time; on CPU-only traces the ATen operators are classified instead (self time);
- FLOPs and bytes of recognised ATen operators from recorded shapes (analyzers/compute/flops.py), kernel
  time attributed to the operator that launched it (External id, else the enclosing operator at
  the launch), a roofline class per operator and shape (the paper's rule), and MFU;
- tensor-core use of GEMM/convolution kernels, short kernels, and repeated element-wise kernel
  sequences (fusion candidates).

Everything is vectorised: Python loops run over distinct kernel names, distinct operator
shapes, streams and tree depth levels only.

This module runs the analysis; the parts live by mechanism: ``kernel_classes`` / ``kernel_names``
(what a kernel's name says), ``activities`` (the device activities of the windows), ``calltree``
(the operators' call trees and the launching operator of each kernel), ``class_share``,
``precision`` (tensor cores), ``fusion``, ``roofline`` (FLOPs, roofline, MFU) and ``attention``
(the SDPA math-path rows, which the per-kernel analysis needs too).
"""

from __future__ import annotations

import numpy as np

from hermes_kb.core.devices import device_of_trace
from hermes_kb.facts.base import Fact

from ..context import RankContext
from .activities import device_activities
from .attention import sdpa_math_ops
from .calltree import cpu_self_time, in_windows, launching_op
from .class_share import class_facts, cpu_class_facts, short_kernels
from .fusion import fusion_candidates
from .precision import tensor_cores
from .roofline import operator_roofline


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    act = device_activities(ctx)
    facts: list[Fact] = []
    fp32_tf32 = False
    k = act.take(act.kernel)
    if len(act):
        facts.extend(class_facts(ctx, act))
        total_dev = float(act.dur.sum())
    else:
        facts.extend(cpu_class_facts(ctx) if not len(ctx.trace.kernels) else [])
        ops = ctx.trace.cpu_ops
        total_dev = float(cpu_self_time(ops)[in_windows(ctx, ops["ts"].to_numpy())].sum()) if len(ops) else 0.0
    devices = np.unique(k.device[k.device >= 0]) if len(k) else np.zeros(0, dtype=np.int64)
    dev = device_of_trace(ctx.trace, int(devices[0]) if len(devices) else None)
    launcher = None
    if len(k) and len(ctx.trace.cpu_ops):
        launcher = launching_op(ctx.trace, ctx.trace.cpu_ops, k.row)
    if len(k):
        facts.extend(short_kernels(ctx, k))
        math = sdpa_math_ops(ctx) if launcher is not None else None
        att = None
        if math is not None:
            on = math[1] | math[2]
            att = (launcher >= 0) & on[np.clip(launcher, 0, None)]
        tc, fp32_tf32 = tensor_cores(ctx, k, dev, att)
        facts.extend(tc)
        facts.extend(fusion_candidates(ctx, k))
    if len(k) or not len(ctx.trace.kernels):  # GPU trace with kernels in the windows, or CPU-only
        facts.extend(operator_roofline(ctx, k, total_dev, dev, fp32_tf32, max(1, len(devices)), launcher))
    # for the per-kernel analysis (analyzers/compute/kernels.py, run next)
    ctx.shared["compute_kernels"] = {"act": act, "k": k, "device": dev, "fp32_tf32": fp32_tf32,
                                     "devices": max(1, len(devices)), "launcher": launcher}  # fmt: skip
    return facts
