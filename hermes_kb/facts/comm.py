"""Facts of the comm analyzer (analyzers/comm/comm.py): collectives per process group and kind,
their exposure, bandwidth and message sizes on each rank, and the synchronisation waste of
each collective across ranks. Formulas: docs/analysis/comm.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us


class CommStats(Fact):
    """One rank's collectives of one kind in one process group, over all analysed steps."""

    kind: Literal["comm_stats"] = "comm_stats"
    process_group: str = Field(
        description="process group name as recorded (e.g. '0'); 'unknown' when not recorded"
    )
    pg_desc: str | None = Field(default=None, description="process group description (e.g. 'default_pg')")
    group_ranks: list[int] = Field(default_factory=list, description="member ranks, when recorded")
    group_size_count: int | None = measure("count", "ranks in the group, when known", default=None)
    collective: str = Field(
        description="all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv, ..."
    )
    source: Literal["kernel", "host", "cpu"] = Field(
        description="kernel: device collective kernels; host: the backend's own threads on a CPU-only trace (gloo "
        "spans: the transfer and the wait for peers); cpu: CPU ops only"
    )
    dtypes: list[str] = Field(default_factory=list)
    collectives_count: int = measure("count", "collectives of this kind and group")
    time_us: float = us("sum of their durations (kernel time, gloo span time when source is host, or CPU op time "
                        "when source is cpu)")
    mean_us: float = us("mean duration")
    max_us: float = us("longest one")
    exposed_us: float | None = us(
        "part of time_us not overlapped by any non-communication kernel (host: by the operators of the rank's "
        "own threads; null when source is cpu)",
        default=None,
    )
    exposed_ratio: float | None = ratio("exposed_us / time_us", default=None)
    time_share_ratio: float | None = ratio("time_us / the rank's analysed time", default=None)
    exposed_share_ratio: float | None = ratio("exposed_us / the rank's analysed time", default=None)
    sizes_known: bool = Field(
        description="false when the trace did not record message sizes (no record_param_comms)"
    )
    sized_count: int = measure("count", "collectives whose size is known")
    total_bytes: int | None = measure("bytes", "sum of message sizes (max of in/out bytes)", default=None)
    mean_message_bytes: float | None = measure("bytes", "mean message size", default=None)
    algbw_gbps: float | None = measure(
        "gbps", "algorithm bandwidth: sum of sizes / sum of durations over sized collectives", default=None
    )
    busbw_gbps: float | None = measure(
        "gbps", "bus bandwidth: algbw x NCCL's factor for the kind", default=None
    )
    best_busbw_gbps: float | None = measure(
        "gbps", "highest bus bandwidth of a single collective of at least 1 MiB", default=None
    )
    link: str = Field(description="link the group most likely uses, or 'unknown'")
    link_peak_gbps: float | None = measure(
        "gbps", "per-direction peak of that link per GPU, when known", default=None
    )
    busbw_to_peak_ratio: float | None = ratio("busbw_gbps / link_peak_gbps (capped at 1)", default=None)
    best_busbw_to_peak_ratio: float | None = ratio(
        "best_busbw_gbps / link_peak_gbps (capped at 1): the collective that waited least for other ranks",
        default=None,
    )
    messages_below_1mib_count: int = measure("count", "sized messages < 1 MiB", default=0)
    messages_1_to_32mib_count: int = measure("count", "sized messages in [1 MiB, 32 MiB)", default=0)
    messages_from_32mib_count: int = measure("count", "sized messages >= 32 MiB", default=0)
    small_messages_ratio: float | None = ratio(
        "share of sized messages below 32 MiB (the paper's threshold)", default=None
    )
    unaligned_512_count: int = measure(
        "count", "sized non-empty messages whose size is not a multiple of 512 B", default=0
    )
    unaligned_512_ratio: float | None = ratio("unaligned_512_count / sized non-empty messages", default=None)
    per_step_count: float | None = measure(
        "count", "collectives_count / analysed steps: how many of them each step issues", default=None
    )
    scalar_messages_count: int = measure(
        "count", "sized messages of at most 64 bytes (16 float32 values: a loss and a few metrics, not gradients)",
        default=0
    )
    bulk_messages_count: int = measure(
        "count", "collectives_count - scalar_messages_count: the ones that carry data (gradient buckets, ...)",
        default=0,
    )
    scalar_per_step_count: float | None = measure(
        "count", "scalar_messages_count / analysed steps", default=None
    )
    scalar_exposed_us: float | None = us(
        "exposed_us of the scalar messages alone (null when exposed_us is)", default=None
    )
    scalar_exposed_share_ratio: float | None = ratio(
        "scalar_exposed_us / the rank's analysed time", default=None
    )
    splits_count: int = measure(
        "count", "all_to_all collectives with per-peer split sizes recorded (In / Out split size)", default=0
    )
    split_imbalance_ratio: float | None = ratio(
        "1 - sum of the pieces / (largest piece x peers), summed over those collectives (the more uneven of "
        "the send and receive side of each): 0 when every peer gets the same amount",
        default=None,
    )
    split_excess_us: float | None = us(
        "sum over those collectives of duration x (1 - pieces / (largest piece x peers)): the part of their "
        "time that evenly split pieces of the same total would not need",
        default=None,
    )
    split_excess_share_ratio: float | None = ratio(
        "split_excess_us / the rank's analysed time", default=None
    )


class CommSummary(Fact):
    """All collectives of one rank together, over all analysed steps."""

    kind: Literal["comm_summary"] = "comm_summary"
    collectives_count: int = measure(
        "count", "collectives in the analysed steps (Work.wait records excluded)"
    )
    kinds: list[str] = Field(default_factory=list, description="collective kinds seen, most time first")
    process_groups: list[str] = Field(default_factory=list)
    source: Literal["kernel", "host", "cpu", "mixed"]
    comm_time_us: float = us("length of the union of all collective intervals")
    exposed_us: float | None = us("part of comm_time_us when no non-communication kernel runs", default=None)
    exposed_ratio: float | None = ratio("exposed_us / comm_time_us", default=None)
    analysed_us: float = us("sum of the analysed step durations")
    comm_share_ratio: float = ratio("comm_time_us / analysed_us")
    exposed_share_ratio: float | None = ratio("exposed_us / analysed_us", default=None)
    sizes_known: bool
    device: str | None = None
    link: str = Field(description="intra-node link of the device model, or 'unknown'")
    link_peak_gbps: float | None = measure("gbps", "per-direction peak of that link per GPU", default=None)


class CommSyncWait(Fact):
    """Synchronisation waste of one collective kind in one process group, across ranks.

    For each collective instance (matched across ranks), R_wait = 1 - mean(T_i) / max(T_i) with
    T_i the collective's duration on rank i (the paper's definition)."""

    kind: Literal["comm_sync_wait"] = "comm_sync_wait"
    process_group: str
    group_ranks: list[int] = Field(
        default_factory=list, description="ranks of the group present in the trace"
    )
    group_size_count: int | None = measure(
        "count", "ranks in the group as recorded, when known", default=None
    )
    collective: str
    source: Literal["kernel", "host", "cpu"]
    matched_by: Literal["seq", "step_order", "order"] = Field(
        description="seq: PyTorch's collective sequence number; step_order: order within the group per step"
    )
    instances_count: int = measure("count", "collective instances matched on every present rank")
    unmatched_count: int = measure("count", "instances left out: not seen on every present rank", default=0)
    r_wait_mean_ratio: float = ratio("mean over instances of 1 - mean(T_i)/max(T_i)")
    r_wait_max_ratio: float = ratio("largest R_wait of one instance")
    r_wait_weighted_ratio: float = ratio("1 - sum of per-instance mean(T_i) / sum of per-instance max(T_i)")
    wait_total_us: float = us(
        "sum over instances and ranks of T_i - min_j T_j (time spent waiting for peers)"
    )
    wait_by_rank_us: dict[int, float] = us("waiting time per rank (10 largest)", default_factory=dict)
    slowest_rank: int = Field(
        description="rank most often last to arrive (shortest collective: the others wait for it)"
    )
    slowest_rank_share_ratio: float = ratio("share of instances where slowest_rank arrived last")
    most_waiting_rank: int = Field(
        description="rank most often first to arrive (longest collective: waits most)"
    )
    most_waiting_rank_share_ratio: float = ratio("share of instances where most_waiting_rank waited longest")
    pipeline_p2p: bool = Field(
        default=False,
        description="point-to-point messages between two stages of one pipeline group (their waits are the pipeline's)",
    )
    most_waiting_rank_wait_us: float | None = us(
        "waiting time of most_waiting_rank summed over the matched instances: the most a fix of the late "
        "arrival can take off that rank", default=None
    )
    arrival_spread_mean_us: float = us(
        "mean over instances of (latest start - earliest start); valid only when the ranks' clocks agree"
    )


class CommTransferStall(Fact):
    """Per rank and (process group, kind): how long each collective instance took after the last
    rank of the group had arrived (its start on the latest rank), against the fastest rate the
    same group reached in the same trace. Instances matched across ranks as comm_sync_wait does;
    a cross-rank fact with ``rank`` set (it needs every rank's arrival). Formulas:
    docs/analysis/comm.md, "Transfer after arrival"."""

    kind: Literal["comm_transfer_stall"] = "comm_transfer_stall"
    process_group: str
    group_ranks: list[int] = Field(default_factory=list, description="ranks of the group present in the input")
    collective: str
    source: Literal["kernel", "host", "cpu"]
    instances_count: int = measure("count", "instances matched on every present rank")
    sized_count: int = measure("count", "of them with a known size of at least min_bytes")
    min_bytes: int = measure("bytes", "smallest size judged (bandwidth, not latency, dominates above it)")
    post_arrival_us: float = us("sum over instances of end on this rank - latest start among the ranks (>= 0)")
    arrival_wait_us: float = us("sum over instances of latest start - start on this rank (waiting for peers)")
    best_gbps: float | None = measure(
        "gbps", "fastest post-arrival rate (bytes / post-arrival time) of the sized instances", default=None
    )
    best_bytes: int | None = measure("bytes", "size of the instance that reached best_gbps", default=None)
    median_gbps: float | None = measure("gbps", "median post-arrival rate of the sized instances", default=None)
    stall_ratio_threshold: float = ratio("an instance stalls below this fraction of best_gbps")
    stalled_count: int = measure("count", "sized instances below stall_ratio_threshold x best_gbps")
    stalled_us: float = us("post-arrival time of the stalled instances")
    stalled_bytes: int = measure("bytes", "bytes of the stalled instances")
    stalled_gbps: float | None = measure("gbps", "stalled_bytes / stalled_us", default=None)
    excess_us: float = us(
        "sum over stalled instances of post-arrival time - bytes / best_gbps: the time beyond what the "
        "group's own best rate needs"
    )
    stalled_concurrent_us: float = us(
        "part of the stalled instances' post-arrival windows during which another collective of this rank "
        "(another process group or kind) runs", default=0.0
    )
    stalled_concurrent_ratio: float = ratio("stalled_concurrent_us / stalled_us", default=0.0)
    worst_us: float | None = us("post-arrival time of the slowest stalled instance", default=None)
    worst_bytes: int | None = measure("bytes", "its size", default=None)
    analysed_us: float = us("sum of the rank's analysed step durations")
    excess_share_ratio: float = ratio("excess_us / analysed_us (exposure is left to the what-if replay)")
