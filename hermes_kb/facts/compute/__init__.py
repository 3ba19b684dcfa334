"""Facts of the compute analysis (analyzers/compute: the ``compute`` and ``kernels`` analyzers;
formulas in docs/analysis/compute.md), by what they describe:

- ``classes``: the share of time each kernel class takes, short kernels;
- ``roofline``: FLOPs, bytes and rates against the peaks, per operator shape and per kernel, MFU,
  thin GEMMs on CPU-only traces;
- ``occupancy``: grid fill and wave quantisation;
- ``precision``: tensor-core use, FP64 kernels, GradScaler kernels;
- ``fusion``: repeated element-wise sequences, written-out normalisations, GEMM epilogues;
- ``layouts``: copies by kind, GEMM alignment (CUDA, Ascend Cube), strided element-wise kernels;
- ``attention``: attention backends, SDPA's math fallback, Ascend FlashAttention shapes;
- ``training_step``: the optimizer's device work, recomputation, training-mode layers in inference;
- ``layers``: dense embedding gradients, large-vocabulary losses, convolution fallbacks, sorts.
"""
