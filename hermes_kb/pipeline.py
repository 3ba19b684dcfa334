"""What the CLI runs: load, analyse, advise, keeping what the renderers need besides the Report
(the facts, the bundle, the monitor's run log) and reporting progress by stage. The report is
built by the advisor (``advise_bundle_full``, ``run_advice.advise_run_dir_full``); this module
only hands them the progress display."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .advisor import Advised
from .render.progress import Stages
from .trace import TraceBundle


def analyze_staged(bundle: TraceBundle, stages: Stages | None = None) -> tuple[list, dict]:
    """``analysis.analyze_with_replay`` with a progress stage: (facts, replay states)."""
    from .analysis import analyze_with_replay

    stages = stages or Stages()
    stages.stage(f"analysing {len(bundle)} rank(s)")
    return analyze_with_replay(bundle)


def critical_paths(trace) -> dict[int, Any]:
    """One rank's critical path per analysed step (analyzers/critical_path.py: a DataFrame of
    segments ``start_us, end_us, category, name, op``), for ``hermes annotate``."""
    from .analyzers import critical_path
    from .analyzers.steps import step_context

    ctx, _ = step_context(trace)
    critical_path.per_rank(ctx)
    return ctx.shared.get("critical_path") or {}


def advise_traces(bundle: TraceBundle, *, config=None, engine: str = "auto", top: int | None = None,
                  rank: int | None = None, stages: Stages | None = None) -> Advised:  # fmt: skip
    """``advisor.advise_bundle``, keeping the facts."""
    from .advisor import advise_bundle_full

    return advise_bundle_full(bundle, config=config, engine=engine, top=top, rank=rank,
                              stage=(stages or Stages()).stage)  # fmt: skip


def advise_run(run_dir: str | os.PathLike, *, config=None, engine: str = "auto", top: int | None = None,
               rank: int | None = None, stages: Stages | None = None) -> Advised:  # fmt: skip
    """``run_advice.advise_run_dir``, keeping the facts and the run log."""
    from .run_advice import advise_run_dir_full

    return advise_run_dir_full(run_dir, config=config, engine=engine, top=top, rank=rank,
                               stage=(stages or Stages()).stage)  # fmt: skip


__all__ = ["Advised", "advise_run", "advise_traces", "analyze_staged", "critical_paths"]
