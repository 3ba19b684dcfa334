"""What the device computes: kernel classes, roofline and fusion (``compute``), the per-kernel
mechanisms (``kernels``) and FLOP and byte counts of operators (``flops``)."""
