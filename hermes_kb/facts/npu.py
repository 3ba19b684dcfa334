"""Facts only Ascend NPU traces (torch_npu profiler output) can give.

They read what kernel_details.csv, the CANN API layer, the HCCL task records and the profiler's
metadata add to the common frames: the core an operator ran on (AI Core / AI Vector / AI CPU),
its block dim, pipe utilisation, operator state (dynamic / static shape), formats, the AI Core
clock, HCCL transfer tasks, the transit time per link of each HCCL op and the recorded
environment variables.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import Fact, measure, ratio, us


class NpuAicpuOps(Fact):
    """Operators that ran on the AI CPU (slow scalar cores) instead of AI Core / AI Vector."""

    kind: Literal["npu_aicpu_ops"] = "npu_aicpu_ops"
    device_compute_us: float = us("summed duration of all device compute tasks")
    aicpu_count: int = measure("count", "AI CPU tasks")
    aicpu_us: float = us("summed duration of AI CPU tasks")
    aicpu_ratio: float = ratio("aicpu_us / device_compute_us")
    threshold_us: float = us("duration from which an AI CPU task is counted as slow")
    slow_count: int = measure("count", "AI CPU tasks lasting threshold_us or more")
    slow_us: float = us("summed duration of the slow AI CPU tasks")
    slow_ratio: float = ratio("slow_us / device_compute_us")
    wide_dtype_count: int = measure(
        "count", "slow AI CPU tasks with an INT64 / DOUBLE / complex / BOOL input (types AI Core kernels often lack)"
    )
    op_types: list[str] = Field(default_factory=list, description="operator types of the slow AI CPU tasks, longest first")
    dtypes: list[str] = Field(default_factory=list, description="input data types of the slow AI CPU tasks")


class NpuPipeUtilisation(Fact):
    """How AI Core / AI Vector operators use their pipes (kernel_details pipe-utilisation metrics):
    an operator is bound by a pipe when that pipe is busy for ``bound_threshold_ratio`` of its
    time or more; operators with no bound pipe wait on something else (scheduling, synchronisation
    between pipes, too few cores) and have optimisation space."""

    kind: Literal["npu_pipe_utilisation"] = "npu_pipe_utilisation"
    bound_threshold_ratio: float = ratio("pipe-busy share from which an operator counts as bound by it")
    ops_count: int = measure("count", "AI Core / Vector tasks with pipe metrics")
    ops_us: float = us("their summed duration")
    unbound_count: int = measure("count", "tasks with no pipe at or above the threshold")
    unbound_us: float = us("their summed duration")
    unbound_ratio: float = ratio("unbound_us / ops_us")
    bound_us: dict[str, float] = Field(default_factory=dict, description="µs of tasks bound by each pipe (mac, vec, scalar, mte1, mte2, mte3, fixpipe)")
    top_unbound: list[str] = Field(default_factory=list, description="operator types of the longest unbound tasks")


class NpuBlockDim(Fact):
    """Block dim (how many cores an operator was split over) against the device's core count."""

    kind: Literal["npu_block_dim"] = "npu_block_dim"
    device: str | None = Field(default=None, description="device model the core counts come from (null: unknown)")
    ai_cores_count: int | None = measure("count", "AI Core (cube) cores of the device; null when unknown", default=None)
    vector_cores_count: int | None = measure("count", "AI Vector cores of the device; null when unknown", default=None)
    tasks_count: int = measure("count", "AI Core / Vector / MIX tasks with a block dim")
    tasks_us: float = us("their summed duration")
    not_multiple_count: int = measure("count", "tasks whose block dim is not a multiple of the core count (the last wave leaves cores idle)")
    not_multiple_us: float = us("their summed duration")
    not_multiple_ratio: float = ratio("not_multiple_us / tasks_us")
    under_filled_count: int = measure("count", "tasks with a block dim below the core count (some cores do nothing)")
    under_filled_us: float = us("their summed duration")


class NpuAicoreFrequency(Fact):
    """The AI Core clock as sampled by the profiler (AI Core Freq counter)."""

    kind: Literal["npu_aicore_frequency"] = "npu_aicore_frequency"
    samples_count: int = measure("count", "frequency samples")
    nominal_mhz: float = measure("MHz", "highest sampled frequency, taken as nominal")
    min_mhz: float = measure("MHz", "lowest sampled frequency")
    drop_ratio: float = ratio("1 - min_mhz / nominal_mhz")
    below_nominal_ratio: float = ratio("share of the sampled time spent below the nominal frequency")


class NpuFormatConversion(Fact):
    """Format and type conversion operators (TransData, Cast, ...) on the device."""

    kind: Literal["npu_format_conversion"] = "npu_format_conversion"
    device_compute_us: float = us("summed duration of all device compute tasks")
    transdata_count: int = measure("count", "TransData tasks (layout changes between ND / NCHW and private formats)")
    transdata_us: float = us("their summed duration")
    cast_count: int = measure("count", "Cast tasks (dtype conversion)")
    cast_us: float = us("their summed duration")
    conversion_us: float = us("transdata_us + cast_us + other layout operators (TransposeD, Transpose)")
    conversion_ratio: float = ratio("conversion_us / device_compute_us")
    private_format_count: int = measure("count", "tasks with an input or output in a private format (NC1HWC0, FRACTAL_Z, FRACTAL_NZ, ...)")


class NpuDynamicShape(Fact):
    """Operators run as dynamic-shape kernels, and online operator compilation."""

    kind: Literal["npu_dynamic_shape"] = "npu_dynamic_shape"
    state_known_count: int = measure("count", "tasks whose OP State (dynamic / static) was recorded")
    dynamic_count: int = measure("count", "tasks with OP State dynamic")
    dynamic_ratio: float = ratio("dynamic_count / state_known_count (0 when none known)")
    compile_calls_count: int = measure("count", "aclopCompileAndExecute / opCompile API calls")
    compile_us: float = us("time in opCompile calls (aclopCompileAndExecute when opCompile is absent)")
    window_us: float = us("analysed time (summed step windows)")
    compile_ratio: float = ratio("compile_us / window_us")
    jit_compile_hint: bool = Field(description="compile calls seen: operators are compiled online (jit_compile=True or no binary kernel)")
    host_cache_capacity: str | None = Field(default=None, description="HOST_CACHE_CAPACITY as recorded (null: not recorded)")


class NpuLaunchBlocking(Fact):
    """Stream synchronisation after operator launches (ASCEND_LAUNCH_BLOCKING=1 or explicit syncs)."""

    kind: Literal["npu_launch_blocking"] = "npu_launch_blocking"
    launches_count: int = measure("count", "operator launches (Node@launch) in the steps")
    sync_calls_count: int = measure("count", "stream / device synchronisation API calls in the steps")
    sync_us: float = us("time in those calls")
    synced_launch_ratio: float = ratio("share of launches followed by a synchronisation before the next launch")
    window_us: float = us("analysed time")
    sync_ratio: float = ratio("sync_us / window_us")
    env_launch_blocking: bool = Field(description="ASCEND_LAUNCH_BLOCKING recorded as 1")


class NpuAffinityApi(Fact):
    """A sequence of generic operators that torch_npu offers as one fused (affinity) API."""

    kind: Literal["npu_affinity_api"] = "npu_affinity_api"
    pattern: str = Field(description="pattern id: rms_norm, rotary_embedding, swiglu, attention_softmax, optimizer")
    fused_api: str = Field(description="the torch_npu API that replaces it")
    occurrences_count: int = measure("count", "matches in the analysed steps")
    host_us: float = us("summed host time of the matched operators")
    device_us: float = us("summed device time of the tasks they launched")
    window_us: float = us("analysed time")
    share_ratio: float = ratio("max(host_us, device_us) / window_us")


class NpuSmallPackets(Fact):
    """HCCL transfers in small packets (communication.json size distribution)."""

    kind: Literal["npu_small_packets"] = "npu_small_packets"
    transport: str = Field(description="SDMA or RDMA")
    threshold_bytes: float = measure("bytes", "packet size under which a transfer counts as small")
    volume_bytes: float = measure("bytes", "bytes moved over this transport")
    small_volume_bytes: float = measure("bytes", "bytes moved in small packets")
    small_volume_ratio: float = ratio("small_volume_bytes / volume_bytes")
    small_count: int = measure("count", "small packets")
    small_count_ratio: float = ratio("small_count / all packets on this transport")
    small_us: float = us("transit time of the small packets")
    transit_us: float = us("transit time of all packets on this transport")


class NpuSdmaContention(Fact):
    """SDMA transfer bandwidth while Cube (MatMul / Conv) tasks run against when none runs."""

    kind: Literal["npu_sdma_contention"] = "npu_sdma_contention"
    overlapped_count: int = measure("count", "SDMA transfer tasks overlapping a Cube task")
    overlapped_bytes: float = measure("bytes", "bytes they moved")
    overlapped_gbps: float = measure("gbps", "their bandwidth (bytes / time)")
    alone_count: int = measure("count", "SDMA transfer tasks with no Cube task running")
    alone_gbps: float = measure("gbps", "their bandwidth")
    bandwidth_loss_ratio: float = ratio("1 - overlapped_gbps / alone_gbps (0 when not lower)")
    overlapped_us: float = us("transit time of the overlapped tasks")
    lost_us: float = us("overlapped_us x bandwidth_loss_ratio: time the contention added")


class NpuByteAlignment(Fact):
    """HCCL SDMA transfer tasks whose size is not a multiple of 512 bytes (the Hermes paper's HCCS
    rule; msprof-analyze's byte-alignment check), judged task by task, and what they measurably
    cost against the aligned tasks of the same kind."""

    kind: Literal["npu_byte_alignment"] = "npu_byte_alignment"
    tasks_count: int = measure(
        "count", "SDMA transfer tasks (Memcpy / Reduce_Inline) off the chip, over 512 bytes, in the analysed steps"
    )
    task_time_us: float = us("their summed duration")
    task_size_bytes: float = measure("bytes", "their summed size")
    ops_count: int = measure("count", "HCCL operations those tasks belong to")
    unaligned_count: int = measure("count", "tasks whose size is not a multiple of 512 bytes")
    unaligned_ops_count: int = measure("count", "HCCL operations with at least one such task")
    unaligned_size_bytes: float = measure("bytes", "their summed size")
    unaligned_time_us: float = us("their summed duration (msprof-analyze's 'abnormal duration')")
    unaligned_time_ratio: float = ratio("unaligned_time_us / task_time_us")
    excess_us: float | None = us(
        "sum over unaligned tasks of max(0, duration - size / reference bandwidth), the reference being the aligned "
        "tasks of the same type in the same HCCL operation (else of the same type and link on the rank); null when "
        "no aligned task gives a reference",
        default=None,
    )
    unaligned_exposed_us: float = us(
        "the unaligned tasks' time (union of their intervals) not overlapped by any compute task"
    )
    window_us: float = us("analysed step time (the tasks' own span when no step is known)")


class NpuRdmaRetransmission(Fact):
    """RDMA transfer tasks far slower than the rest of the same size class (retransmission)."""

    kind: Literal["npu_rdma_retransmission"] = "npu_rdma_retransmission"
    rdma_count: int = measure("count", "RDMA transfer tasks")
    median_us: float = us("median RDMA task duration")
    slow_count: int = measure("count", "RDMA tasks lasting at least 10x the median and 1 ms or more")
    slow_us: float = us("their summed duration")
    max_us: float = us("longest RDMA task")


class NpuEnvironment(Fact):
    """Environment variables torch_npu recorded (profiler_metadata.json ENV_VARIABLES)."""

    kind: Literal["npu_environment"] = "npu_environment"
    recorded: dict[str, str] = Field(default_factory=dict, description="variable -> value as recorded ('' = unset)")
    launch_blocking: bool = Field(description="ASCEND_LAUNCH_BLOCKING=1")
    log_level: int | None = measure("level", "ASCEND_GLOBAL_LOG_LEVEL (0 debug, 1 info, 2 warning, 3 error, 4 null); null when unset", default=None)
    debug_logging: bool = Field(description="log level 0 or 1 (debug / info): every API call is logged")
    alloc_conf_set: bool = Field(description="PYTORCH_NPU_ALLOC_CONF set")
    expandable_segments: bool = Field(description="PYTORCH_NPU_ALLOC_CONF has expandable_segments:True")
    aclnn_cache_limit: int | None = measure("count", "ACLNN_CACHE_LIMIT; null when unset (CANN default 10000)", default=None)
    host_cache_capacity: int | None = measure("count", "HOST_CACHE_CAPACITY; null when unset (0: dynamic-shape cache off)", default=None)
    hccl_vars_set_count: int = measure("count", "HCCL_* variables set")
    reserved_peak_bytes: float | None = measure("bytes", "peak reserved device memory (memory records)", default=None)
    allocated_peak_bytes: float | None = measure("bytes", "peak allocated device memory", default=None)
    fragmentation_ratio: float | None = ratio("1 - allocated_peak / reserved_peak (memory held but unused)", default=None)


class NpuAllocation(Fact):
    """Time the host spends in CANN device-memory allocation calls inside the steps (aclrtMalloc*,
    aclrtFree*, aclrtMallocHost, the expandable-segment reserve / map / unmap calls): what a warm
    caching allocator avoids. Only on exports with the CANN API layer (Level1 and up)."""

    kind: Literal["npu_allocation"] = "npu_allocation"
    steps_count: int = measure("count", "analysed steps (1 when the trace has no step windows)")
    window_us: float = us("analysed time (summed step windows)")
    malloc_count: int = measure("count", "allocation calls in the windows")
    malloc_us: float = us("time in them")
    free_count: int = measure("count", "free / unmap / release calls in the windows")
    free_us: float = us("time in them")
    alloc_us: float = us("malloc_us + free_us: the most a warm caching allocator can remove")
    per_step_us: float = us("alloc_us / steps_count")
    alloc_ratio: float = ratio("alloc_us / window_us")
    alloc_conf: str | None = Field(default=None, description="PYTORCH_NPU_ALLOC_CONF as recorded (null: not recorded or unset)")
    expandable_segments: bool = Field(default=False, description="PYTORCH_NPU_ALLOC_CONF has expandable_segments:True")


class HcclLinkStep(BaseModel):
    """HCCL transit time and bytes per link in one analysed step (communication.json)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="step number of the analysis window")
    window_us: float = us("length of the step window")
    hccs_us: float = us("transit time on HCCS")
    hccs_bytes: float = measure("bytes", "bytes moved on HCCS")
    rdma_us: float = us("transit time on RDMA (RoCE)")
    rdma_bytes: float = measure("bytes", "bytes moved on RDMA")
    pcie_us: float = us("transit time on PCIe")
    pcie_bytes: float = measure("bytes", "bytes moved on PCIe")
    sio_us: float = us("transit time on SIO (die to die)")
    sio_bytes: float = measure("bytes", "bytes moved on SIO")
    slow_us: float = us("rdma_us + pcie_us")
    slow_share_ratio: float = ratio("slow_us / window_us (capped at 1)")


class NpuHcclLinks(Fact):
    """Which links HCCL moved the rank's bytes over (communication.json: transit time, bytes and
    bandwidth per link of each op, summed over the ops that start in the analysed steps), with the
    HCCL variables that choose the intra-server link. HCCL_INTRA_ROCE_ENABLE=1 sends intra-server
    traffic over RoCE (RDMA), HCCL_INTRA_PCIE_ENABLE=1 over PCIe; RDMA + PCIe transit is the
    'slow-link' time. torch_npu does not record these two variables; hermes' monitor does, and
    ``hermes advise RUN_DIR`` merges its record into the trace's environment."""

    kind: Literal["npu_hccl_links"] = "npu_hccl_links"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("analysed time (summed step windows)")
    ops_count: int = measure("count", "HCCL ops (communication.json rows) starting in the windows")
    hccs_us: float = us("transit time on HCCS")
    hccs_bytes: float = measure("bytes", "bytes moved on HCCS")
    hccs_gbps: float | None = measure("gbps", "hccs_bytes / hccs_us; null when no HCCS time", default=None)
    rdma_us: float = us("transit time on RDMA (RoCE)")
    rdma_bytes: float = measure("bytes", "bytes moved on RDMA")
    rdma_gbps: float | None = measure("gbps", "rdma_bytes / rdma_us; null when no RDMA time", default=None)
    pcie_us: float = us("transit time on PCIe")
    pcie_bytes: float = measure("bytes", "bytes moved on PCIe")
    pcie_gbps: float | None = measure("gbps", "pcie_bytes / pcie_us; null when no PCIe time", default=None)
    sio_us: float = us("transit time on SIO (die to die, Atlas A3)")
    sio_bytes: float = measure("bytes", "bytes moved on SIO")
    sio_gbps: float | None = measure("gbps", "sio_bytes / sio_us; null when no SIO time", default=None)
    slow_us: float = us("rdma_us + pcie_us: transit on the links HCCL_INTRA_* force intra-server traffic onto")
    slow_bytes: float = measure("bytes", "rdma_bytes + pcie_bytes")
    slow_gbps: float | None = measure("gbps", "slow_bytes / slow_us; null when no slow-link time", default=None)
    slow_per_step_us: float = us("slow_us / steps_count")
    slow_share_ratio: float = ratio("slow_us / window_us (capped at 1)")
    max_step_slow_share_ratio: float = ratio("largest slow-link share of one step")
    hccs_measured: bool = Field(description="at least HCCS_MIN_BYTES (1 MB) moved on HCCS in the windows: its bandwidth is a usable yardstick")  # fmt: skip
    hccs_speedup_fraction: float | None = ratio(
        "1 - slow_gbps / hccs_gbps (0 when the slow links were not slower): the share of the slow-link "
        "transit HCCS would have saved at the bandwidth it reached in this trace; null when HCCS was not "
        "measured or there was no slow-link time",
        default=None,
    )
    nominal_speedup_low_fraction: float = ratio("the same from nominal link bandwidths, low end (docs/analysis/npu.md)")
    nominal_speedup_high_fraction: float = ratio("the same from nominal link bandwidths, high end")
    speedup_source: Literal["measured", "nominal"] = Field(
        description="measured: HCCS moved at least 1 MB in this trace and its bandwidth is the yardstick of "
        "recoverable_us; nominal: the middle of the nominal range is used"
    )
    recoverable_us: float = us(
        "slow_us x hccs_speedup_fraction when measured, else slow_us x the middle of the nominal range: "
        "the transit time moving this traffic to HCCS would save"
    )
    recoverable_ratio: float = ratio("recoverable_us / window_us")
    intra_roce_forced: bool = Field(description="HCCL_INTRA_ROCE_ENABLE recorded as 1")
    intra_pcie_forced: bool = Field(description="HCCL_INTRA_PCIE_ENABLE recorded as 1")
    intra_flags_recorded: bool = Field(description="either variable is in the recorded environment (torch_npu alone never records them)")  # fmt: skip
    hccl_env: dict[str, str] = Field(default_factory=dict, description="HCCL_* variables as recorded ('' = unset)")
    hccl_algo: str | None = Field(default=None, description="HCCL_ALGO when set")
    world_size: int | None = measure("count", "ranks in the job as recorded; RDMA time of a multi-server job includes inter-server traffic", default=None)  # fmt: skip
    steps: list[HcclLinkStep] = Field(default_factory=list, description="per analysed step")


class NpuFp32Cube(Fact):
    """Cube-unit operators (MatMul, BatchMatMul, Conv, ...) fed FP32 inputs: the Cube multiplies
    FP16/BF16 (and HF32 where enabled) natively, so FP32 work runs far below its peak (Ascend)."""

    kind: Literal["npu_fp32_cube"] = "npu_fp32_cube"
    device_compute_us: float = us("non-HCCL device task time in the analysed windows")
    cube_us: float = us("Cube operator time (op type matches MatMul / BatchMatMul / Conv / GEMM / FlashAttention)")
    fp32_cube_count: int = measure("count", "Cube tasks whose floating inputs are all FP32 (FLOAT)")
    fp32_cube_us: float = us("their summed duration")
    fp32_cube_ratio: float = ratio("fp32_cube_us / cube_us")
    fp32_share_of_compute_ratio: float = ratio("fp32_cube_us / device_compute_us")
    matmul_fp32_us: float = us("the part in MatMul / BatchMatMul / GEMM tasks (torch_npu.npu.matmul.allow_hf32 "
                               "is off by default)")  # fmt: skip
    conv_fp32_us: float = us("the part in Conv tasks (torch_npu.npu.conv.allow_hf32 is on by default)")
    hf32_eligible_us: float | None = us("of fp32_cube_us, tasks the profiler marks HF32 Eligible YES (null: column "
                                        "absent)", default=None)  # fmt: skip
    not_hf32_eligible_us: float = us("fp32_cube_us less hf32_eligible_us: FP32 work that HF32 cannot already be "
                                     "running (with conv.allow_hf32 on, eligible convolutions may run in HF32)")
    op_types: list[str] = Field(default_factory=list, description="op types of the FP32 Cube tasks, most time first")


class NpuVocabVectorOps(Fact):
    """Vector-core operators over full language-model logits (first input's last axis at least a
    vocabulary, 32768): a softmax / cross-entropy written out as separate Cast, max, Sub, Exp,
    ReduceSum, RealDiv, Mul passes, each reading and writing the whole logits tensor (Ascend)."""

    kind: Literal["npu_vocab_vector_ops"] = "npu_vocab_vector_ops"
    device_compute_us: float = us("non-HCCL device task time in the analysed windows")
    tasks_count: int = measure("count", "AI Vector / MIX_AIV tasks whose first input's last axis >= 32768")
    time_us: float = us("their summed duration")
    share_of_compute_ratio: float = ratio("time_us / device_compute_us")
    fp32_time_us: float = us("the part whose floating inputs are all FP32")
    vocab_size: int = measure("count", "the largest such last axis")
    rows: int = measure("count", "rows of the largest such input (product of its other axes)")
    logits_fp32_bytes: float = measure("bytes", "rows x vocab x 4: one FP32 pass over the logits")
    op_types: list[str] = Field(default_factory=list, description="op types of these tasks, most time first")
