"""What ``advise`` runs, for every kind of input: a TraceBundle, a monitor RUN_DIR, or a job
streamed rank by rank. Each is analysed its own way into an ``Analysed`` (facts, replay states,
platform, the summary rows, the inputs and warnings); the rules, the findings and the Report are
then made once, the same way for all (``_advised``). ``stage(text)`` is told as the work
advances (the CLI's progress line)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.run import analyze_with_replay, excluded_step_warnings
from ..analysis.run_dir import analyze_run_dir, as_run_dir, run_platform, run_summary
from ..core.version import __version__
from ..facts.base import Fact
from ..facts.store import of_kinds
from ..kb.engine import EngineName, infer
from ..kb.loader import KnowledgeBase
from ..trace import TraceBundle, load
from ..trace.bundle import platform_of
from .diagnose import diagnose
from .findings import evidence_by_rank, partly_linked_ranks, unlinked_ranks, whatif_targets
from .knowledge import knowledge_base
from .on_demand import replay_needed
from .job_gains import job_summary
from .qualify import qualifications
from .report import EvidenceItem, Inputs, KbInfo, RankSummary, Report, SampleInfo
from .summary import phases_summary, rank_summaries
from .whatif_index import whatif_index

Stage = Callable[[str], None]


def _no_stage(what: str, *progress: int) -> None:
    return None


@dataclass
class Advised:
    """A Report and what it was made from: the facts, the bundle, the monitor's run log (the
    HTML report, `hermes annotate` and `hermes diff` read them beside the report)."""

    report: Report
    facts: Sequence[Fact]  # a list, or a streamed job's facts.store.SpilledFacts
    bundle: TraceBundle | None = None
    run: Any = None  # monitor.reader.RunLog for a RUN_DIR
    # per reported finding's case id, per rank it covers: that rank's own evidence (a finding
    # shows one rank's; `hermes annotate` writes each rank's into its trace)
    rank_evidence: dict[str, dict[int, list[EvidenceItem]]] = field(default_factory=dict)


@dataclass
class Analysed:
    """An input analysed and ready for the rules, whatever it was."""

    facts: Sequence[Fact]
    replay: Mapping[Any, Any]  # rank -> analysis.replay.ReplayState
    platform: str
    inputs: Inputs
    summary: list[RankSummary]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # informational lines (Report.notes)
    bundle: TraceBundle | None = None
    run: Any = None
    left_out: int = 0  # a RUN_DIR's captures that were not of its run


def _advised(a: Analysed, kb: KnowledgeBase, *, engine: EngineName, top: int | None, rank: int | None,
             stage: Stage) -> Advised:  # fmt: skip
    """The rules and cases on the facts, the what-if sets the matches need replayed, the
    findings, and the one Report every input kind gets."""
    stage("rules and cases")
    inf = infer(kb, a.facts, engine)
    stage("findings and gains")
    facts = replay_needed(inf, a.facts, a.replay, whatif_targets(inf, kb, a.platform))
    summary = a.summary if rank is None else [s for s in a.summary if s.rank == rank]
    joined_warnings: list[str] = []
    findings, combined, left = diagnose(inf, kb, a.platform, a.replay, rank=rank, top=top, summary=summary,
                                        warnings=joined_warnings)  # fmt: skip
    report = Report(
        hermes_version=__version__,
        inputs=a.inputs,
        summary=summary,
        findings=findings,
        combined=combined,
        unexplained=left,
        kb=KbInfo(rules=len(kb.active_rules()), cases=len(kb.active_cases()), engine=inf.engine),
        warnings=[*a.warnings, *joined_warnings],
        notes=a.notes,
        qualifications=qualifications(a.facts, a.warnings, skipped=len(a.inputs.skipped), left_out=a.left_out,
                                      unlinked=unlinked_ranks(wi := whatif_index(inf, kb)), partly=partly_linked_ranks(wi)),
        job=job_summary(of_kinds(a.facts, ("job_replay",))) if rank is None else None,
    )
    rank_evidence = evidence_by_rank(inf, kb, a.platform, [f.case_id for f in findings])
    return Advised(report=report, facts=facts, bundle=a.bundle, run=a.run, rank_evidence=rank_evidence)


def _of_bundle(bundle: TraceBundle, facts: Sequence[Fact], replay: Mapping[Any, Any]) -> Analysed:
    warnings = [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)
    warnings += [f"analyzer {f.analyzer} failed on rank {f.rank}: {f.message}"
                 for f in of_kinds(facts, ("analyzer_error",))]  # fmt: skip
    warnings += excluded_step_warnings(list(facts))
    return Analysed(
        facts=facts,
        replay=replay,
        platform=platform_of(bundle),
        inputs=Inputs(sources=bundle.sources, ranks=bundle.rank_ids, skipped=[p.path for p in bundle.problems]),
        summary=rank_summaries(bundle, of_kinds(facts, ("step_time", "step_breakdown", "program_phases"))),
        warnings=warnings,
        bundle=bundle,
    )


def advise_bundle_full(
    bundle: TraceBundle,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
    facts: Sequence[Fact] | None = None,
    stage: Stage = _no_stage,
    replay: Mapping[int, Any] | None = None,
) -> Advised:
    """``advise_bundle``, keeping the facts. ``facts`` and ``replay``: the ranks' facts and
    what-if replay states when they were made elsewhere (a streamed job)."""
    kb = knowledge_base(config)
    if facts is None:
        stage(f"analysing {len(bundle)} rank(s)")
        facts, replay = analyze_with_replay(bundle, defer_replays=True)
    return _advised(_of_bundle(bundle, facts, replay or {}), kb, engine=engine, top=top, rank=rank, stage=stage)


def advise_bundle(bundle: TraceBundle, *, config: str | os.PathLike | None = None, engine: EngineName = "auto",
                  top: int | None = None, rank: int | None = None, facts: list[Fact] | None = None) -> Report:  # fmt: skip
    return advise_bundle_full(bundle, config=config, engine=engine, top=top, rank=rank, facts=facts).report


def advise_run_dir_full(run_dir: str | os.PathLike, *, config=None, engine: EngineName = "auto",
                        top: int | None = None, rank: int | None = None, stage: Stage = _no_stage) -> Advised:  # fmt: skip
    """A monitor RUN_DIR: its logs and newest captures analysed together (analysis/run_dir.py)."""
    kb = knowledge_base(config)
    stage(f"reading the monitor logs and captures of {Path(run_dir).name}")
    ra = analyze_run_dir(run_dir)
    skipped = [p.path for p in ra.bundle.problems] if ra.bundle is not None else []
    # the program phases of a rank's captured steps (the monitor's log has no phases)
    captured_phases = {f.rank: f for f in ra.facts if f.kind == "program_phases" and f.step is None}
    analysed = Analysed(
        facts=ra.facts,
        replay=ra.replay,
        platform=run_platform(ra),
        inputs=Inputs(sources=ra.run.sources, ranks=sorted(ra.run.ranks), skipped=skipped),
        summary=[RankSummary(steps=[], **s, **phases_summary(captured_phases.get(s["rank"]), s.get("mean_step_us")))
                 for s in run_summary(ra)],  # fmt: skip
        warnings=ra.warnings,
        notes=ra.notes,
        bundle=ra.bundle,
        run=ra.run,
        left_out=len(ra.left_out),
    )
    return _advised(analysed, kb, engine=engine, top=top, rank=rank, stage=stage)


def advise_run_dir(run_dir: str | os.PathLike, *, config=None, engine: EngineName = "auto", top: int | None = None,
                   rank: int | None = None) -> Report:  # fmt: skip
    return advise_run_dir_full(run_dir, config=config, engine=engine, top=top, rank=rank).report


def advise_streamed(paths, *, workers: int | None = None, dask: str | None = None, sample: int | None = None,
                    config=None, engine: EngineName = "auto", top: int | None = None, rank: int | None = None,
                    stage: Stage = _no_stage, live: bool = False) -> Advised:  # fmt: skip
    """Advise a job rank by rank (scale/stream.py): each rank read, analysed and released before
    the next, on ``workers`` local processes or the Dask scheduler ``dask``; with ``sample``,
    only that many ranks, chosen by a first pass over the step times (scale/sample.py). The
    Advised carries a frameless bundle (a RankStub per rank). ``live``: report each rank done."""
    from ..scale.jobs import analyse_files, stream_workers
    from ..trace import discover

    files = discover([str(p) for p in paths] if isinstance(paths, (list, tuple)) else str(paths))
    notes: list[str] = []
    sample_info = None
    if sample is not None and sample < len(files):
        from ..scale.sample import choose, first_pass, sample_notes

        stage(f"first pass over {len(files)} rank(s): step times")
        looks = first_pass(files, stream_workers(len(files), workers))
        chosen = choose(looks, sample)
        notes = sample_notes(looks, chosen)
        sample_info = (len(files), chosen, looks)
        files = [looks[i].path for i, _ in chosen]
    where = f" on Dask ({dask})" if dask else ""
    stage(f"analysing {len(files)} rank(s){where}", 0, len(files))

    def progress(done: int, total: int, path: str) -> None:
        stage(f"analysed {Path(path).name}{where}", done, total)

    job = analyse_files(files, workers=workers, dask=dask, progress=progress if live else None)
    job.bundle.warnings[:0] = notes
    try:
        adv = advise_bundle_full(job.bundle, config=config, engine=engine, top=top, rank=rank, facts=job.facts,
                                 replay=job.replay, stage=stage)  # fmt: skip
    finally:
        job.replay.close()
    if sample_info is not None:
        total, chosen, looks = sample_info
        adv.report.inputs.sample = SampleInfo(
            ranks_total=total,
            read={str(looks[i].rank if looks[i].rank is not None else looks[i].path): why for i, why in chosen},
            notes=notes,
        )
    return adv


def advise(
    path_or_bundle: TraceBundle | str | os.PathLike | Sequence,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
) -> Report:
    """Diagnose a trace, or a monitor RUN_DIR (its rank<R>.jsonl logs and captured traces):
    findings ranked by expected gain. Safe to call repeatedly and from
    several threads (the KB is loaded once; the rules engine is used behind a lock)."""
    if not isinstance(path_or_bundle, TraceBundle):
        if (run_dir := as_run_dir(path_or_bundle)) is not None:  # a monitor RUN_DIR (rank<R>.jsonl)
            return advise_run_dir(run_dir, config=config, engine=engine, top=top, rank=rank)
    bundle = path_or_bundle if isinstance(path_or_bundle, TraceBundle) else load(path_or_bundle)
    return advise_bundle(bundle, config=config, engine=engine, top=top, rank=rank)


__all__ = ["Advised", "Analysed", "advise", "advise_bundle", "advise_bundle_full", "advise_run_dir",
           "advise_run_dir_full", "advise_streamed"]  # fmt: skip
