"""Analyzers: pure functions of a TraceBundle that return typed facts (hermes_kb.analyzers).

Each module in ``PER_RANK`` defines ``per_rank(ctx: RankContext) -> list[Fact]``; each in
``CROSS_RANK`` defines ``cross_rank(contexts: dict[int, RankContext], facts: list[Fact]) ->
list[Fact]``, run once all ranks are done. ``steps`` runs first and gives every other
analyzer its step windows.
"""

from __future__ import annotations

import importlib
import traceback

from hermes_kb.facts.base import Fact
from hermes_kb.facts.steps import AnalyzerError
from hermes_kb.trace.bundle import RankTrace

from .context import RankContext, StepWindow
from .steps import step_context

PER_RANK = ["overlap", "critical_path", "io", "cpu", "dispatch", "pyframes", "compute", "kernels", "cpu_batch", "comm", "buckets", "fluctuation", "npu",
            "breakdown", "whatif"]
CROSS_RANK = ["comm", "parallel", "fluctuation"]
# the kinds of per-rank facts the cross-rank analyzers read (besides the ranks' digests): a
# streamed job hands them only these (rank_stream.gather)
CROSS_RANK_READS = frozenset({"pipeline_stage"})


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def _guarded(name: str, rank: int | None, fn, *args) -> list[Fact]:
    try:
        return list(fn(*args))
    except Exception as exc:  # one analyzer's bug must not hide every other fact
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return [AnalyzerError(rank=rank, analyzer=name,
                              message=f"{type(exc).__name__}: {exc} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})")]  # fmt: skip


def _entry(name: str, attr: str):
    mod = _module(name)
    return getattr(mod, attr, None)


def _run(name: str, ctx: RankContext) -> list[Fact]:
    fns = _guarded(name, ctx.rank, lambda: [f] if (f := _entry(name, "per_rank")) else [])
    if fns and isinstance(fns[0], AnalyzerError):
        return fns
    return _guarded(name, ctx.rank, fns[0], ctx) if fns else []


def analyze_rank(trace: RankTrace, *, defer_replays: bool = False) -> tuple[RankContext, list[Fact]]:
    """The rank's facts in PER_RANK order. ``defer_replays``: the what-if facts carry their
    critical-path bounds and the replays wait for the advisor to name the sets it needs
    (hermes_kb/whatif_on_demand.py)."""
    ctx, facts = step_context(trace)
    if defer_replays:
        ctx.shared["whatif_defer"] = True
    for name in PER_RANK:
        facts.extend(_run(name, ctx))
    return ctx, facts


def analyze_cross_rank(contexts: dict[int, RankContext], facts: list[Fact]) -> list[Fact]:
    out: list[Fact] = []
    for name in CROSS_RANK:
        fns = _guarded(name, None, lambda: [f] if (f := _entry(name, "cross_rank")) else [])
        if fns and isinstance(fns[0], AnalyzerError):
            out.extend(fns)
        elif fns:
            out.extend(_guarded(name, None, fns[0], contexts, facts))
    return out


__all__ = ["CROSS_RANK", "CROSS_RANK_READS", "PER_RANK", "RankContext", "StepWindow", "analyze_cross_rank", "analyze_rank"]
