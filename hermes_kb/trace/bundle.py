"""TraceBundle: the columnar form every analyzer reads.

One ``RankTrace`` per rank, each a set of pandas frames (one row per trace event of that
kind, categorical names, times in µs from the bundle's earliest event) plus metadata.
Frame columns are documented in docs/trace_bundle.md; ``FRAMES`` lists the frame names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

FRAMES = (
    "cpu_ops",
    "python",
    "annotations",
    "gpu_annotations",
    "kernels",
    "runtime",
    "memcpy",
    "syncs",
    "collectives",
    "links",
    "memory",
    "steps",
)

TIME_COLUMNS = ("ts", "end", "launch_ts", "gpu_ts")  # every absolute time column of every frame


@dataclass
class TraceMeta:
    source: str
    rank: int
    rank_source: str  # "distributedInfo", "filename" or "order"
    world_size: int | None = None
    schema_version: str | None = None
    trace_name: str | None = None
    display_time_unit: str | None = None
    base_time_ns: int | None = None
    # absolute time (µs, the trace's own clock incl. baseTimeNanoseconds) of ts == 0 in this bundle
    origin_us: float = 0.0
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    distributed_info: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)
    format: str = "kineto"  # or "ascend" (torch_npu profiler output)
    env: dict[str, str] = field(default_factory=dict)  # environment variables the profiler recorded
    # the host CPU (model, vector flags, MHz) and torch intra-op threads, where a monitor log
    # recorded them (a Kineto trace does not)
    host_cpu: dict[str, Any] = field(default_factory=dict)
    torch_threads: int | None = None
    # the host's own time per step unprofiled over profiled, where a monitor log timed both: the
    # what-if replay scales the host events by it (analyzers/whatif/replay.py)
    profiler_host_scale: float | None = None

    @property
    def device_name(self) -> str | None:
        for dev in self.device_properties:
            name = dev.get("name")
            if name:
                return str(name)
        return None

    @property
    def backend(self) -> str | None:
        return (self.distributed_info or {}).get("backend")

    @property
    def process_groups(self) -> list[dict[str, Any]]:
        return list((self.distributed_info or {}).get("pg_config") or [])


@dataclass
class RankTrace:
    meta: TraceMeta
    cpu_ops: pd.DataFrame
    python: pd.DataFrame
    annotations: pd.DataFrame
    gpu_annotations: pd.DataFrame
    kernels: pd.DataFrame
    runtime: pd.DataFrame
    memcpy: pd.DataFrame
    syncs: pd.DataFrame
    collectives: pd.DataFrame
    links: pd.DataFrame
    memory: pd.DataFrame
    steps: pd.DataFrame
    # events by kind as found in the file (Kineto category, or "metadata"/"flow"/"other")
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # tables only some formats have (Ascend: step_stats, comm_ops, comm_matrix, ...; docs/trace_bundle.md)
    extras: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.meta.rank

    def frames(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in FRAMES}

    @property
    def has_device(self) -> bool:
        return len(self.kernels) > 0 or len(self.memcpy) > 0

    def time_span(self) -> tuple[float, float]:
        """(first start, last end) over every timed frame, µs."""
        lo, hi = float("inf"), float("-inf")
        for name in FRAMES:
            df = getattr(self, name)
            if len(df) and "ts" in df.columns:
                lo = min(lo, float(df["ts"].min()))
                hi = max(hi, float(df["end"].max() if "end" in df.columns else df["ts"].max()))
        if lo == float("inf"):
            return (0.0, 0.0)
        return (lo, hi)

    def shift(self, delta_us: float) -> None:
        """Move every time column by ``delta_us`` (used to put ranks on the bundle's origin)."""
        if delta_us == 0.0:
            return
        for df in [getattr(self, name) for name in FRAMES] + list(self.extras.values()):
            for col in TIME_COLUMNS:
                if col in df.columns:
                    df[col] = df[col] + delta_us


@dataclass
class LoadProblem:
    """A rank (file) that could not be loaded; the rest of the bundle still is."""

    path: str
    message: str
    exit_code: int


@dataclass
class TraceBundle:
    ranks: dict[int, RankTrace]
    problems: list[LoadProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    origin_us: float = 0.0

    def __iter__(self):
        return iter(self.ranks[r] for r in sorted(self.ranks))

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, rank: int) -> RankTrace:
        return self.ranks[rank]

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def sources(self) -> list[str]:
        return [self.ranks[r].meta.source for r in self.rank_ids]


def platform_of(bundle: TraceBundle) -> str:
    """npu (an Ascend export among the ranks), gpu (device activities) or cpu."""
    if any(t.meta.format == "ascend" for t in bundle):
        return "npu"
    if any(t.has_device for t in bundle):
        return "gpu"
    return "cpu"

