"""Facts of model layers that take slow paths: dense embedding gradients, cross-entropy over a
large vocabulary, convolutions on PyTorch's fallback kernels, and sort / top-k kernels
(analyzers/compute/layers.py; docs/analysis/compute.md "Per kernel")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us


class EmbeddingBackward(Fact):
    """The backward pass of embedding lookups computed as a dense gradient of the whole table."""

    kind: Literal["embedding_backward"] = "embedding_backward"
    dense_calls_count: int = measure("count", "dense embedding backward calls")
    dense_device_us: float = us("device time of their kernels")
    share_of_device_time_ratio: float = ratio("dense_device_us / all device activity time")
    sparse_calls_count: int = measure("count", "sparse embedding backward calls (sparse=True)")
    weight_rows: int | None = measure("count", "rows of the largest embedding table (num_weights; null: shapes not "
                                      "recorded)", default=None)  # fmt: skip


class LargeVocabLoss(Fact):
    """Softmax cross-entropy over a language-model vocabulary: the logits tensor (tokens x vocabulary) is
    written, normalised and read again, usually in FP32."""

    kind: Literal["large_vocab_loss"] = "large_vocab_loss"
    vocab_size: int = measure("count", "last dimension of the log-softmax input")
    rows: int = measure("count", "tokens per call (product of the other dimensions)")
    dtype: str = Field(description="dtype of the log-softmax input")
    logits_bytes: float = measure("bytes", "rows x vocab_size x element size of one call")
    calls_count: int = measure("count", "log-softmax / cross-entropy calls in the analysed steps")
    device_us: float = us("device time of the loss kernels (log-softmax, NLL, their backward)")
    share_of_device_time_ratio: float = ratio("device_us / all device activity time")


class ConvFallback(Fact):
    """Convolutions computed by PyTorch's own CUDA kernels instead of cuDNN / MIOpen: the native
    depthwise kernels (conv_depthwise2d/3d) and the im2col + GEMM path of the slow convolutions.
    Emitted when any ran."""

    kind: Literal["conv_fallback"] = "conv_fallback"
    depthwise_us: float = us("native depthwise convolution kernels (conv_depthwise2d/3d forward, backward, grad weight)")
    im2col_us: float = us("kernels of the im2col/col2im fallback (slow_conv2d, slow_conv_dilated, slow_conv_transpose)")
    fallback_us: float = us("depthwise_us + im2col_us")
    library_conv_us: float = us("convolution kernels of cuDNN / MIOpen beside them")
    share_of_device_time_ratio: float = ratio("fallback_us / all device activity time")
    share_of_conv_time_ratio: float = ratio("fallback_us / (fallback_us + library_conv_us)")
    top_kernel: str = Field(description="the fallback kernel with the most time (short name)")


class SortKernels(Fact):
    """Sorting and selection kernels (CUB radix sorts, ATen's bitonic / segmented sorts, top-k) in the
    step: torch.sort / argsort / unique / topk, and the sorts inside deterministic index_put / scatter
    and embedding backward."""

    kind: Literal["sort_kernels"] = "sort_kernels"
    kernels_count: int = measure("count", "sort and top-k kernels in the analysed windows")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the sort kernel (short name) with the most time")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")
    operators: list[str] = Field(default_factory=list,
                                 description="top-level operators launching sorts, most time first")
