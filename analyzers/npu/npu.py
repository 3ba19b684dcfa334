"""Ascend-only analyses (traces read from torch_npu profiler output; nothing on Kineto traces).

Per rank, over the analysed step windows where the data has times, else over the whole trace:
- ``npu_aicpu_ops``: AI CPU tasks, those of ``AICPU_SLOW_US`` or more, their op types and dtypes;
- ``npu_pipe_utilisation``: bound pipe of each AI Core / Vector task from the pipe ratios
  (``*_ratio`` columns, threshold ``PIPE_BOUND``), time of tasks with none bound;
- ``npu_block_dim``: block dim vs the device's cores (only when the device model is known);
- ``npu_aicore_frequency``: the AI Core clock counter, drop from the highest sample;
- ``npu_format_conversion``: TransData / Cast / transpose time, private formats;
- ``npu_dynamic_shape``: OP State dynamic share, online compilation (opCompile) calls and time;
- ``npu_launch_blocking``: stream synchronisation calls right after launches;
- ``npu_allocation``: time in CANN device-memory allocation / free calls inside the steps;
- ``npu_affinity_api``: aten sequences with a fused torch_npu API (table ``AFFINITY``);
- ``npu_small_packets``: SDMA / RDMA volume in packets under ``SMALL_PACKET_BYTES``;
- ``npu_sdma_contention``: SDMA bandwidth with vs without a Cube task running;
- ``npu_rdma_retransmission``: RDMA tasks >= 10x the median and >= 1 ms;
- ``npu_hccl_links``: transit time and bytes per link (HCCS, RDMA, PCIe, SIO) of the HCCL ops in
  the steps, the HCCL_INTRA_ROCE_ENABLE / HCCL_INTRA_PCIE_ENABLE flags, and what moving the
  RDMA + PCIe (slow-link) transit to HCCS would save (``HCCS_MIN_BYTES``, ``NOMINAL_GBPS``);
- ``npu_environment``: the recorded environment variables and memory fragmentation.
Thresholds follow msprof-analyze's advisor where it has one (docs/analysis/npu.md).

The analyses live in the modules beside this one, by mechanism: ``aicore`` (AI CPU, pipes,
block dim, frequency), ``operators`` (format conversion, dynamic shapes), ``runtime`` (launch
blocking, allocation, environment), ``transfers`` (small packets, SDMA contention, byte
alignment, RDMA), ``hccl_links``, ``affinity``; ``tasks`` holds what they share.
"""

from __future__ import annotations

from hermes_kb.facts.base import Fact

from ..context import RankContext
from .affinity import affinity
from .aicore import aicpu, block_dim, frequency, pipes
from .hccl_links import hccl_links
from .operators import dynamic_shape, format_conversion
from .runtime import allocation, environment, launch_blocking
from .tasks import compute_tasks
from .transfers import byte_alignment, rdma, sdma_contention, small_packets


def per_rank(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    if tr.meta.format != "ascend":
        return []
    k = compute_tasks(ctx)
    facts: list[Fact] = []
    for fn in (aicpu, pipes, block_dim, format_conversion, dynamic_shape):
        f = fn(ctx, k)
        if f is not None:
            facts.append(f)
    for fn in (frequency, launch_blocking, allocation, small_packets, sdma_contention, byte_alignment, rdma,
               hccl_links, environment):
        f = fn(ctx)
        if f is not None:
            facts.append(f)
    facts.extend(affinity(ctx))
    return facts
