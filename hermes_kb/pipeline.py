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


def advise_streamed(paths, *, workers: int | None = None, dask: str | None = None, sample: int | None = None,
                    config=None, engine: str = "auto", top: int | None = None, rank: int | None = None,
                    stages: Stages | None = None) -> Advised:  # fmt: skip
    """Advise a job rank by rank (rank_stream.py): each rank read, analysed and released before
    the next, on ``workers`` local processes or the Dask scheduler ``dask``; with ``sample``,
    only that many ranks, chosen by a first pass over the step times (rank_sample.py). The
    Advised carries a frameless bundle (rank_stream.RankStub per rank)."""
    from .advisor import advise_bundle_full
    from .rank_stream import analyse_files, stream_workers
    from .trace import discover

    st = stages or Stages()
    files = discover([str(p) for p in paths] if isinstance(paths, (list, tuple)) else str(paths))
    notes: list[str] = []
    sample_info = None
    if sample is not None and sample < len(files):
        from .rank_sample import choose, first_pass, sample_notes

        st.stage(f"first pass over {len(files)} rank(s): step times")
        looks = first_pass(files, stream_workers(len(files), workers))
        chosen = choose(looks, sample)
        notes = sample_notes(looks, chosen)
        sample_info = (len(files), chosen, looks)
        files = [looks[i].path for i, _ in chosen]
    where = f" on Dask ({dask})" if dask else ""
    st.stage(f"analysing {len(files)} rank(s){where}", 0, len(files))

    def progress(done: int, total: int, path: str) -> None:
        st.stage(f"analysed {Path(path).name}{where}", done, total)

    job = analyse_files(files, workers=workers, dask=dask, progress=progress if st.live else None)
    job.bundle.warnings[:0] = notes
    try:
        adv = advise_bundle_full(job.bundle, config=config, engine=engine, top=top, rank=rank, facts=job.facts,
                                 replay=job.replay, stage=st.stage)  # fmt: skip
    finally:
        job.replay.close()
    if sample_info is not None:
        from .report import SampleInfo

        total, chosen, looks = sample_info
        adv.report.inputs.sample = SampleInfo(
            ranks_total=total,
            read={str(looks[i].rank if looks[i].rank is not None else looks[i].path): why for i, why in chosen},
            notes=notes,
        )
    return adv


__all__ = ["Advised", "advise_run", "advise_streamed", "advise_traces", "analyze_staged", "critical_paths"]
