"""Facts of attention: the fused backends' time, SDPA's math fallback and Ascend FlashAttention
shapes (analyzers/compute/attention.py, analyzers/compute/npu_tasks.py; docs/analysis/compute.md
"Per kernel")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us


class AttentionBackends(Fact):
    """Which fused attention kernels ran (from kernel names), and in which dtype the SDPA calls were
    made. Emitted when fused attention kernels ran."""

    kind: Literal["attention_backends"] = "attention_backends"
    attention_time_us: float = us("attention-class kernel time")
    share_of_device_time_ratio: float = ratio("attention_time_us / all device activity time")
    flash_us: float = us("FlashAttention kernels (flash_fwd / flash_bwd, pytorch_flash)")
    efficient_us: float = us("memory-efficient kernels (CUTLASS fmha_cutlassF/B, efficient_attention, xformers)")
    cudnn_us: float = us("cuDNN fused attention kernels")
    other_us: float = us("other attention kernels")
    efficient_share_ratio: float = ratio("efficient_us / attention_time_us")
    sdpa_dtype: str | None = Field(default=None, description="dtype of the SDPA calls with the most time, else the "
                                   "one in the memory-efficient kernels' names (null: unknown)")  # fmt: skip
    compute_capability: float | None = measure("version", "the GPU's compute capability (major.minor; null: not "
                                               "an NVIDIA trace)", default=None, le=None)  # fmt: skip
    sdpa_calls_count: int = measure("count", "aten::scaled_dot_product_attention calls in the analysed steps", default=0)
    masked_calls_count: int = measure("count", "of them, calls given an attention-mask tensor (4th argument)", default=0)
    masked_share_ratio: float = ratio("masked_calls_count / sdpa_calls_count", default=0.0)
    masked_us: float = us("attention kernel time in proportion to the masked calls (attention_time_us x "
                          "masked_share_ratio: forward and backward kernels alike)", default=0.0)
    masked_not_causal_count: int = measure("count", "masked calls with is_causal=False (the mask carries the causality, if any)",
                                         default=0)  # fmt: skip


class SdpaMathFallback(Fact):
    """scaled_dot_product_attention calls that took PyTorch's unfused math path: the
    aten::_scaled_dot_product_attention_math operator it records when no fused backend accepts the
    inputs, and the kernels it launched (separate matmuls, softmax, dropout)."""

    kind: Literal["sdpa_math_fallback"] = "sdpa_math_fallback"
    calls_count: int = measure("count", "_scaled_dot_product_attention_math calls in the analysed steps")
    device_us: float = us("device time of the kernels they launched")
    share_of_device_time_ratio: float = ratio("device_us / all device activity time")
    dtype: str = Field(default="unknown", description="dtype of q in the call with the most time")
    head_dim: int | None = measure("count", "last dimension of q in that call (null: shapes not recorded)", default=None)
    shape: str = Field(default="", description="its input shapes")
    fused_attention_us: float = us("time of fused attention kernels (flash, memory-efficient, cuDNN) on the rank")


class NpuFlashAttentionAlignment(Fact):
    """Ascend FlashAttentionScore (and its gradient) tasks whose head dimension or sequence length is
    not a multiple of 128 (the FlashAttention affinity rule of msprof-analyze's AI Core performance
    check)."""

    kind: Literal["npu_fa_alignment"] = "npu_fa_alignment"
    fa_time_us: float = us("time of FlashAttentionScore / FlashAttentionScoreGrad tasks")
    misaligned_time_us: float = us("time of the tasks whose head dimension or sequence length is not a multiple of 128")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_fa_time_ratio: float = ratio("misaligned_time_us / fa_time_us")
    head_dim: int | None = measure("count", "head dimension of the misaligned calls with the most time", default=None)
    seq_len: int | None = measure("count", "their sequence length (null: variable-length layout)", default=None)
    example_shapes: str = Field(default="", description="their input shapes")
