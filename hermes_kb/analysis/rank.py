"""One rank through the per-rank analyzers, and the job through the cross-rank ones, in the
registry's order; an analyzer that raises becomes an ``analyzer_error`` fact instead of hiding
every other fact."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..analyzers.comm.digest import RankDigest, digest_of
from ..analyzers.context import RankContext
from ..analyzers.timeline.steps import step_context
from ..facts.base import Fact
from ..facts.steps import AnalyzerError
from ..trace.bundle import RankTrace
from . import registry


def _error(name: str, rank: int | None, exc: BaseException) -> AnalyzerError:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return AnalyzerError(rank=rank, analyzer=name,
                         message=f"{type(exc).__name__}: {exc} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})")  # fmt: skip


def _guarded(name: str, rank: int | None, fn: Callable[..., Any], *args: Any) -> list[Fact]:
    try:
        return list(fn(*args))
    except Exception as exc:  # one analyzer's bug must not hide every other fact
        return [_error(name, rank, exc)]


def _entry(a: registry.Analyzer, attr: str, rank: int | None) -> Callable | AnalyzerError | None:
    try:
        return getattr(registry.module(a), attr, None)
    except Exception as exc:  # an analyzer that does not import costs its own facts only
        return _error(a.name, rank, exc)


def analyze_rank(trace: RankTrace, *, defer_replays: bool = False, alone: bool = False) -> tuple[RankContext, list[Fact]]:
    """The rank's facts in the registry's order. ``defer_replays``: the what-if facts carry their
    critical-path bounds and the replays wait for the advisor to name the sets it needs
    (advisor/on_demand.py). ``alone``: no other rank is analysed with it, so its part of the job
    graph (whatif/job_forms.py) is not needed."""
    registry.checked()
    ctx, facts = step_context(trace)
    if defer_replays:
        ctx.shared["whatif_defer"] = True
    if alone:
        ctx.shared["job_alone"] = True
    for a in registry.PER_RANK:
        fn = _entry(a, "per_rank", ctx.rank)
        if isinstance(fn, AnalyzerError):
            facts.append(fn)
        elif fn is not None:
            with ctx.shared.only(a.name, a.touches):
                facts.extend(_guarded(a.name, ctx.rank, fn, ctx))
    return ctx, facts


def digests_of(ranks: Mapping[int, RankContext | RankDigest]) -> dict[int, RankDigest]:
    """What the cross-rank analyzers read of each rank: its digest (contexts are digested here;
    a streamed job's ranks arrive digested)."""
    return {r: x if isinstance(x, RankDigest) else digest_of(x) for r, x in ranks.items()}


def analyze_cross_rank(ranks: Mapping[int, RankContext | RankDigest], facts: list[Fact]) -> list[Fact]:
    digests = digests_of(ranks)
    out: list[Fact] = []
    for a in registry.CROSS_RANK:
        fn = _entry(a, "cross_rank", None)
        if isinstance(fn, AnalyzerError):
            out.append(fn)
        elif fn is not None:
            out.extend(_guarded(a.name, None, fn, digests, facts))
    return out


def critical_paths(trace: RankTrace) -> dict[int, Any]:
    """One rank's critical path per analysed step (a DataFrame of segments ``start_us, end_us,
    category, name, op``: analyzers/timeline/critical_path.py), for ``hermes annotate``."""
    from ..analyzers.timeline import critical_path

    ctx, _ = step_context(trace)
    critical_path.per_rank(ctx)
    return ctx.shared.get("critical_path") or {}


__all__ = ["analyze_cross_rank", "analyze_rank", "critical_paths", "digest_of", "digests_of"]
