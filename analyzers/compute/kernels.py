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

This module runs the analysis; the mechanisms live in ``kernel_roofline``, ``occupancy``,
``layouts``, ``precision``, ``fusion``, ``attention``, ``training_step``, ``layers`` and
``npu_tasks``.
"""

from __future__ import annotations

import numpy as np

from hermes_kb.core.devices import DeviceSpec
from hermes_kb.facts.base import Fact

from ..context import RankContext
from .activities import Acts
from .attention import attention_backends, sdpa_math
from .fusion import decomposed_norms, gemm_epilogue
from .kernel_roofline import attribution, kernel_roofline
from .layers import conv_fallback, embedding_backward, large_vocab_loss, sort_kernels
from .layouts import copy_kinds, gemm_alignment, strided_elementwise
from .npu_tasks import npu_cube, npu_fa, npu_fp32_cube, npu_vocab_vector
from .occupancy import grid_fill, launch_blocks, sm_count, waves
from .precision import fp64_work, grad_scaler
from .training_step import optimizer_device, recompute, train_mode, train_mode_cpu


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


def kernel_facts(ctx: RankContext, act: Acts, k: Acts, dev: DeviceSpec | None, fp32_tf32: bool, n_dev: int,
                 launcher: np.ndarray | None) -> list[Fact]:  # fmt: skip
    """Every per-kernel fact of the rank."""
    att = attribution(ctx, k)
    sms = sm_count(ctx)
    blocks = launch_blocks(ctx, k)
    facts: list[Fact] = []
    facts.extend(kernel_roofline(ctx, act, k, dev, fp32_tf32, n_dev, att, blocks, sms))
    facts.extend(grid_fill(ctx, k, blocks, sms))
    facts.extend(copy_kinds(ctx, act, k, launcher))
    facts.extend(gemm_alignment(ctx, act, k, att, dev, fp32_tf32, n_dev))
    facts.extend(optimizer_device(ctx, act, k))
    facts.extend(recompute(ctx, act, k, launcher))
    facts.extend(decomposed_norms(ctx, act, k))
    facts.extend(fp64_work(ctx, act, k, launcher, dev))
    facts.extend(embedding_backward(ctx, act, k, launcher))
    facts.extend(large_vocab_loss(ctx, act, k, launcher))
    facts.extend(attention_backends(ctx, act, k))
    facts.extend(sdpa_math(ctx, act, k, launcher))
    facts.extend(grad_scaler(ctx, act, k))
    facts.extend(conv_fallback(ctx, act, k, launcher))
    facts.extend(npu_cube(ctx, act, k))
    facts.extend(npu_fa(ctx, act, k))
    facts.extend(waves(ctx, k, blocks, sms))
    facts.extend(strided_elementwise(ctx, act, k, launcher))
    facts.extend(train_mode(ctx, act, k, launcher))
    facts.extend(npu_fp32_cube(ctx, act, k))
    facts.extend(gemm_epilogue(ctx, act, k))
    facts.extend(npu_vocab_vector(ctx, act, k))
    facts.extend(sort_kernels(ctx, act, k, launcher))
    return facts


def cpu_op_facts(ctx: RankContext) -> list[Fact]:
    """Per-kernel mechanisms that a CPU-only trace shows in its operators instead of kernels."""
    return train_mode_cpu(ctx)
