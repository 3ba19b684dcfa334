"""What the device computes: the ``compute`` analyzer (``compute``: kernel classes, tensor cores,
fusion candidates, the operator roofline and MFU) and the ``kernels`` analyzer (``kernels``: the
per-kernel mechanisms), built from modules by mechanism:

- ``kernel_names``, ``kernel_classes``: what a kernel's (or an operator's) name says;
- ``activities``, ``calltree``: the device activities of the windows; the operators' call trees
  and the operator that launched each kernel;
- ``class_share``: kernel class shares, short kernels;
- ``flops``, ``roofline``: FLOP and byte counts of operators; the operator roofline and MFU;
- ``kernel_roofline``, ``occupancy``: the roofline per kernel; grid fill and wave quantisation;
- ``precision``: tensor cores, FP64 kernels, GradScaler kernels;
- ``fusion``: fusion candidates, written-out normalisations, GEMM epilogues;
- ``layouts``: device copies by kind, GEMM alignment, strided element-wise kernels;
- ``attention``: attention backends, SDPA's math fallback;
- ``training_step``: optimizer device work, recomputation, training-mode layers in inference;
- ``layers``: dense embedding gradients, large-vocabulary losses, convolution fallbacks, sorts;
- ``npu_tasks``: the Ascend task checks (Cube and FlashAttention shapes, FP32 Cube, Vector
  operators over full logits).
"""
