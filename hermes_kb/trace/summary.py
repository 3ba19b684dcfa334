"""What was loaded: the per-rank summary behind `hermes inspect`."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .bundle import FRAMES, RankTrace, TraceBundle


class RankSummary(BaseModel):
    rank: int
    rank_source: str = Field(description="where the rank number came from: distributedInfo, filename or order")
    source: str
    format: str
    device: str | None = None
    world_size: int | None = None
    backend: str | None = None
    rows: dict[str, int] = Field(description="rows per TraceBundle frame")
    events: dict[str, int] = Field(description="events per category as found in the file")
    steps: list[int] = Field(description="ProfilerStep numbers, in time order")
    span_ms: float = Field(description="first start to last end over all events, ms")
    start_ms: float = Field(description="first event, ms from the bundle origin")
    warnings: list[str] = []


class BundleSummary(BaseModel):
    ranks: list[RankSummary]
    skipped: list[dict[str, str]] = Field(default=[], description="files that could not be loaded, and why")
    warnings: list[str] = []


def summarize_rank(t: RankTrace) -> RankSummary:
    lo, hi = t.time_span()
    return RankSummary(
        rank=t.rank,
        rank_source=t.meta.rank_source,
        source=t.meta.source,
        format=t.meta.format,
        device=t.meta.device_name,
        world_size=t.meta.world_size,
        backend=t.meta.backend,
        rows={name: len(getattr(t, name)) for name in FRAMES},
        events=dict(t.counts),
        steps=[int(s) for s in t.steps["step"].tolist()],
        span_ms=round((hi - lo) / 1e3, 3),
        start_ms=round(lo / 1e3, 3),
        warnings=list(t.warnings),
    )


def summarize(bundle: TraceBundle) -> BundleSummary:
    return BundleSummary(
        ranks=[summarize_rank(t) for t in bundle],
        skipped=[{"path": p.path, "error": p.message} for p in bundle.problems],
        warnings=list(bundle.warnings),
    )
