"""Facts measured on the always-on monitor's logs (analyzers/monitor/run_log.py): the whole run,
not a few profiled steps. Times are per-step values in µs unless the field says total.
Formulas: docs/analysis/monitor.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import Fact, measure, ratio, us


def cores(description: str, **kw):
    return measure("cores", description, **kw)


class MonitorSteps(Fact):
    """One rank's step times over the whole monitored run (warm-up steps, and the steps the
    monitor slowed itself by profiling or counting FLOPs, left out)."""

    kind: Literal["monitor_steps"] = "monitor_steps"
    steps_count: int = measure("count", "steps analysed (after the warm-up steps)")
    warmup_steps_count: int = measure("count", "first steps left out (compilation, caches, allocator warm-up)")
    warmup_detected: bool = Field(default=False, description="the warm-up is the one the monitor detected from the "
                                  "step times (else a fixed 2 steps)")  # fmt: skip
    excluded_steps_count: int = measure("count", "steps after warm-up left out because the monitor slowed them "
                                        "(captured steps and the step writing the trace, the FLOP-counted step), "
                                        "and the outliers below", default=0)  # fmt: skip
    outlier_steps_count: int = measure("count", "steps over 1,000x the median step and over 60 s, left out: a "
                                       "suspended process or a clock jump, not work", default=0)  # fmt: skip
    median_us: float = us("median step time")
    mean_us: float = us("mean step time")
    p95_us: float = us("95th percentile step time")
    max_us: float = us("longest step")
    total_us: float = us("sum of the analysed step times")
    data_wait_us: float = us("mean time per step blocked waiting for the next batch")
    data_wait_ratio: float = ratio("data wait / step time, over the analysed steps")
    gc_us: float = us("mean Python GC pause per step")
    gc_ratio: float = ratio("GC pause / step time, over the analysed steps")
    gc_gen2_count: int = measure("count", "full (generation 2) collections in the analysed steps")
    compute_us: float = us("median per step of step time - data wait - GC pause (the model's work, and the waits for "
                           "peers (comm_us) and for a CPU (monitor_cpu.runqueue_wait_us) that it holds)")
    comm_us: float | None = us("median time per step in torch.distributed collectives, when the monitor timed them "
                               "(docs/monitor.md: NCCL completion hooks, or the collective calls)", default=None)
    comm_ratio: float | None = ratio("collective time / step time over the analysed steps (collectives that overlap "
                                     "compute count in full: not the exposed share)", default=None)
    cpu_us: float | None = us("median process CPU time per step (all threads), when recorded", default=None)
    device_us: float | None = us("median device step time (CUDA events between step boundaries)", default=None)
    samples_per_s: float | None = measure("samples/s", "median throughput, when samples per step were given",
                                          default=None)  # fmt: skip
    mfu_ratio: float | None = ratio("median model FLOPs utilisation (FLOPs per step / step time / peak FLOP/s), when "
                                    "the FLOPs were given or obtained by the monitor", default=None)
    step_flops: float | None = measure("flops", "model FLOPs per step behind mfu_ratio", default=None)
    peak_flops_per_s: float | None = measure("flops_per_s", "the device's peak behind mfu_ratio", default=None)
    mfu_source: str | None = Field(default=None, description="how the FLOPs and the peak were obtained (given, "
                                   "FlopCounterMode on one step, a capture's trace; hermes' device or CPU table)")
    events: list[str] = Field(default_factory=list, description="names of the marked events (checkpoint, eval, ...)")
    online_fluctuations_count: int = measure("count", "steps the monitor flagged while running")


SpikeCause = Literal["all", "gc", "checkpoint", "marked_event", "data_wait", "unexplained"]


class MonitorSpikes(Fact):
    """Step-time spikes of one rank over the monitored run, for all spikes (cause ``all``) and
    for those attributed to one cause. A spike is a step above its rolling median (33 steps,
    centred) by more than max(5 x 1.4826 x MAD, 10% of the median); its excess over the median is
    attributed to the largest of: GC pause, marked checkpoint events, other marked events, data
    wait above the median data wait, when that part is at least half the excess (else
    ``unexplained``)."""

    kind: Literal["monitor_spikes"] = "monitor_spikes"
    cause: SpikeCause
    steps_count: int = measure("count", "steps analysed")
    spikes_count: int = measure("count", "spikes of this cause")
    spike_steps: list[int] = Field(default_factory=list, description="first spike steps (at most 10)")
    excess_us: float = us("total over these spikes of (step time - rolling median)")
    excess_per_step_us: float = us("excess_us / steps analysed: what the spikes cost per step on average")
    excess_ratio: float = ratio("excess_us / total step time: share of the run lost to these spikes")
    mean_step_us: float = us("mean step time over the analysed steps")
    largest_excess_us: float = us("excess of the largest spike")
    period_steps: float | None = measure(
        "count", "median interval between consecutive spikes, when regular (>= 3 spikes)", default=None
    )
    period_regularity_ratio: float | None = ratio(
        "share of the intervals within max(1 step, 10%) of that median", default=None
    )
    with_gc_ratio: float = ratio("share of these spikes with a GC pause of at least a quarter of the excess")
    with_gen2_ratio: float = ratio("share of these spikes with a full (generation 2) collection")
    with_event_ratio: float = ratio("share of these spikes with a marked event")
    with_data_wait_ratio: float = ratio("share of these spikes whose data wait exceeds the median by a quarter of the excess")
    events: list[str] = Field(default_factory=list, description="marked events on these spikes")

    def scope(self) -> str:  # one fact per cause and rank: findings on different causes stay apart
        return f"{super().scope()}, {self.cause} spikes"


class MonitorSlowRank(Fact):
    """The slowest rank of one communication domain (rank = that rank). Per-rank medians of the
    step and its parts are compared with the median of the other ranks. When the ranks' step
    times agree within 5% they synchronise every step (they wait for each other), so the slow
    rank is found by its own work: data wait above the others', and process CPU time above the
    others' (scaled to wall time at its own cores in use)."""

    kind: Literal["monitor_slow_rank"] = "monitor_slow_rank"
    group: str = Field(description="communication domain (from Monitor(domains=...)); 'all': every rank of the run")
    ranks_count: int = measure("count", "ranks compared")
    steps_count: int = measure("count", "fewest analysed steps of a compared rank")
    synchronized: bool = Field(description="the ranks' median step times agree within 5%")
    per_rank_step_us: dict[int, float] = us("median step time per rank (10 slowest)", default_factory=dict)
    per_rank_data_wait_us: dict[int, float] = us("median data wait per rank (10 largest)", default_factory=dict)
    per_rank_cpu_us: dict[int, float] = us("median process CPU time per step per rank, less the CPU time spent "
                                           "inside the data wait when every rank recorded it (10 largest)",
                                           default_factory=dict)  # fmt: skip
    step_us: float = us("the job's step time: the slowest rank's median step")
    others_step_us: float = us("median over the other ranks of their median step")
    data_wait_excess_us: float = us("slow rank's median data wait - the others' median")
    compute_excess_us: float = us("slow rank's own work above the others', outside data wait")
    excess_us: float = us("data_wait_excess_us + compute_excess_us: what the slow rank adds to every step")
    excess_ratio: float = ratio("excess_us / step_us")
    cause: Literal["data_wait", "compute"] = Field(description="the larger part of the excess")
    data_share_ratio: float = ratio("data_wait_excess_us / excess_us")
    measure: Literal["step", "cpu", "communication"] = Field(
        default="step", description="how the compute excess was measured: 'step' (ranks not in lock-step: step - data "
        "wait - GC), 'cpu' (lock-step: process CPU time), 'communication' (every rank's collectives timed: step - data "
        "wait - GC - time in collectives, which the others spend waiting for the slow rank)")
    per_rank_comm_us: dict[int, float] = us("median time in collectives per step per rank (10 largest), when timed",
                                            default_factory=dict)  # fmt: skip
    cpu_wait_excess_us: float | None = us(
        "the slow rank's run-queue wait per step (waiting for a CPU, not computing) above the others' median, from the "
        "monitor's samples; part of compute_excess_us", default=None)

    def scope(self) -> str:
        return f"{super().scope()}, domain {self.group}"


class MonitorCpu(Fact):
    """CPU use around one rank, from the monitor's low-rate samples (medians over samples)."""

    kind: Literal["monitor_cpu"] = "monitor_cpu"
    samples_count: int = measure("count", "resource samples")
    machine_cores: int | None = measure("count", "CPUs of the machine", default=None)
    usable_cores: int | None = measure("count", "CPUs the process may run on (affinity mask)", default=None)
    host_usable_cores: int | None = measure("count", "CPUs in the union of the masks of the ranks on this host",
                                            default=None)  # fmt: skip
    pinned: bool = Field(default=False, description="the affinity mask holds fewer CPUs than the machine has")
    host: str | None = Field(default=None, description="host name")
    host_ranks_count: int = measure("count", "monitored ranks on the same host", default=1)
    process_cores: float | None = cores("cores the training process used", default=None)
    children_cores: float | None = cores("cores its child processes (DataLoader workers) used", default=None)
    children_count: int | None = measure("count", "child processes", default=None)
    own_busy_ratio: float | None = ratio(
        "(process + children cores) / usable cores: how full the affinity mask is (capped at 1)", default=None
    )
    system_busy_ratio: float | None = ratio("busy share of all the machine's CPUs", default=None)
    others_cores: float | None = cores("cores used by processes that are not this job's (not children, not ranks)",
                                       default=None)  # fmt: skip
    siblings_cores: float | None = cores("cores used by the job's other ranks on the host", default=None)
    top_other: str | None = Field(default=None, description="the busiest other process, 'name (pid N)'")
    top_other_cores: float | None = cores("cores it used", default=None)
    top_others: list[str] = Field(default_factory=list, description="up to 5 busiest other processes with their cores")
    runqueue_wait_ratio: float | None = ratio(
        "share of wall time the main thread was runnable but waiting for a CPU (/proc/self/schedstat)", default=None
    )
    runqueue_wait_us: float | None = us("runqueue_wait_ratio x mean step: per step", default=None)
    data_wait_us: float = us("mean data wait per step (from the step records)")
    wait_from_others_us: float | None = us(
        "the part of runqueue_wait_us other processes cause: all of it when the job's threads fit its cores, else "
        "split by others_cores : (threads_wanted_count - host_usable_cores)", default=None
    )
    wait_from_own_us: float | None = us("runqueue_wait_us - wait_from_others_us: the part the job's own excess "
                                        "threads cause", default=None)  # fmt: skip
    main_run_ratio: float | None = ratio(
        "median share of wall time the main thread was on a CPU (/proc/self/schedstat)", default=None
    )
    main_sleep_us: float | None = us(
        "per step, the main thread's time neither running nor waiting for a CPU, less the data wait: "
        "mean step x (1 - main_run_ratio - runqueue_wait_ratio) - data_wait_us (blocked on a lock, a barrier, I/O, "
        "a device)", default=None,
    )
    own_stall_us: float | None = us(
        "wait_from_own_us + main_sleep_us x (wait_from_own_us / runqueue_wait_us), only for a rank without device "
        "step times, with more than one torch thread, whose host has more threads wanted than cores (CPU "
        "training, where the main thread's sleeps are its OpenMP barriers and joins): what the job's own excess "
        "threads cost the main thread at most; else wait_from_own_us", default=None,
    )
    starved_us: float = us("runqueue_wait_us + data_wait_us: time per step the loop waits for CPU or for data")
    starved_ratio: float = ratio("starved_us / mean step")
    torch_threads: int | None = measure("count", "torch intra-op threads of the rank", default=None)
    threads_wanted_count: int | None = measure(
        "count", "on this host: per rank, torch threads + DataLoader workers, summed over its ranks", default=None
    )
    threads_per_core: float | None = measure(
        "threads per core", "threads_wanted_count / host_usable_cores (above 1: oversubscribed)", default=None
    )
    mean_step_us: float = us("mean step time")

    @model_validator(mode="after")
    def _own_stall(self) -> MonitorCpu:
        if self.own_stall_us is None:
            self.own_stall_us = self.wait_from_own_us
        return self


class MonitorPageFaults(Fact):
    """System CPU time and minor page faults per step (getrusage, every step), and the share of
    them inside optimizer.step() when the monitor hooked torch's optimizers. A minor fault is a
    page the kernel maps and zeroes on first touch: memory the allocator took fresh from the OS.
    glibc's malloc serves large tensors with mmap and hands them back on free, so a loop that
    allocates and frees large temporaries every step faults its memory back in every step."""

    kind: Literal["monitor_page_faults"] = "monitor_page_faults"
    steps_count: int = measure("count", "analysed steps with the system time recorded")
    mean_step_us: float = us("mean step time")
    faults_per_step: float = measure("count", "mean minor page faults per step (whole process)")
    faulted_mb_per_step: float = measure("MB", "faults_per_step x 4 KiB (the usual page size)")
    sys_us: float = us("mean system CPU time per step (all threads of the process)")
    sys_ratio: float = ratio("min(sys_us / mean_step_us, 1)")
    sys_us_per_fault: float | None = us("sys_us / faults_per_step: about 0.3-2 us where faults make the system "
                                        "time; far more means other kernel work (I/O calls)", default=None)  # fmt: skip
    optimizer_us: float | None = us("mean optimizer.step() time per step, unprofiled (monitor hooks)", default=None)
    optimizer_ratio: float | None = ratio("optimizer_us / mean_step_us", default=None)
    optimizer_sys_us: float | None = us("mean system CPU time per step inside optimizer.step()", default=None)
    optimizer_faults_per_step: float | None = measure("count", "mean minor faults per step inside optimizer.step()",
                                                      default=None)  # fmt: skip
    outside_optimizer_sys_us: float | None = us("sys_us - optimizer_sys_us", default=None)


EnvIssue = Literal[
    "launch_blocking", "debug_logging", "p2p_disabled", "ib_disabled", "hccl_intra_link_forced", "omp_threads_too_high",
    "gc_threshold_lowered", "nccl_tuning_overridden", "gdr_disabled", "versions_differ",
]


class MonitorEnvSetting(Fact):
    """A setting in the rank's recorded environment known to cost performance."""

    kind: Literal["monitor_env_setting"] = "monitor_env_setting"
    issue: EnvIssue
    variable: str = Field(description="the environment variable (or gc.set_threshold; for nccl_tuning_overridden "
                          "the variables set, comma-separated; for versions_differ the packages that differ)")
    value: str = Field(description="its value")
    device: Literal["cpu", "gpu", "npu"] = Field(description="what the rank trained on, as far as the log shows")
    step_us: float = us("mean step time")
    cpu_us: float | None = us("median process CPU time per step", default=None)
    hidden_bound_us: float = us(
        "what the setting can cost per step at most: launch blocking min(host CPU, step - host CPU - data wait) "
        "(without it host and device overlap); debug logging the host CPU time; GC the GC pause; NCCL_P2P_DISABLE the "
        "median collective time per step (when the monitor timed them); NCCL_IB_DISABLE the same when the run's "
        "ranks sit on more than one host (else 0: one node never uses InfiniBand); NCCL tuning overrides the median "
        "collective time; GPUDirect RDMA off (NCCL_NET_GDR_LEVEL=LOC) that time on a run over several hosts; "
        "versions_differ 0 (what a slow rank costs is in monitor_slow_rank); else 0"
    )
    share_ratio: float = ratio("hidden_bound_us / step_us")

    def scope(self) -> str:
        return f"{super().scope()}, {self.variable}"


class ProfilerOverhead(Fact):
    """How much slower the profiled steps ran than the others, from the monitor's step records
    matched by wall clock to the capture's step windows (analyzers/monitor/profiler_overhead.py). Times
    the profiler itself added are in the trace's operators and Python frames, so a cost the
    trace measures that is no larger than this is not evidence of a cost in the real run."""

    kind: Literal["profiler_overhead"] = "profiler_overhead"
    profiled_steps_count: int = measure("count", "monitor steps overlapping the capture's step windows by half their length")
    unprofiled_steps_count: int = measure("count", "monitor steps after warm-up that do not overlap the capture")
    profiled_step_us: float = us("lower quartile of the wall times of the profiled steps")
    unprofiled_step_us: float = us("lower quartile of the wall times of the unprofiled steps")
    added_per_step_us: float = us("max(profiled_step_us - unprofiled_step_us, 0): what profiling added to a step")
    added_ratio: float = ratio("added_per_step_us / profiled_step_us: the share of a profiled step the profiler added")
    inflation_factor: float = measure("factor", "profiled_step_us / unprofiled_step_us (above 1: profiling slowed the step)")
