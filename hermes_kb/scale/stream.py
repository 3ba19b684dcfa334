"""A rank's part of a streamed job: each rank is read, analysed to its facts and digest, and
released before the next is held (``analyse_rank_file``); once every rank is in, ``gather`` runs
the cross-rank analyzers on the digests.

Memory is bounded by the ranks in flight (one per worker) plus what every rank leaves behind in
this process: its digest (analyzers/comm/digest.py, kilobytes) and metadata. Its facts, typed and
flat, go to a temporary file as the rank arrives (facts/store.py, JSON): the rules engine reads
them back a group of ranks at a time and the report decodes only what it shows. Its what-if
replay state is spilled to a temporary directory (analysis/replay_store.py, numbers only) and read back
only for the ranks the combined gain replays.

The per-rank stage runs through an executor: the local forked pool (local.py on
core/workers.py, a dead worker costs its own rank) or a Dask cluster (on_dask.py). Both hand back the
same ``RankOutcome`` and both go through ``gather``, so their results are the same.

Times: a rank is analysed on its own clock (0 = its first event, as when the file is read alone);
its facts and digest are then moved to the job's origin (the earliest first event of all ranks),
as ``trace.load`` moves a bundle's frames before analysis (facts/shift.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis.rank import analyze_cross_rank, analyze_rank, digest_of
from ..analysis.registry import CROSS_RANK_READS
from ..analysis.replay import replay_state
from ..analysis.replay_store import SpilledReplay, pack
from ..core.errors import BadTraceError, NoTracesError
from ..facts.base import Fact
from ..facts.store import SpilledFacts
from ..trace.bundle import LoadProblem, TraceBundle, TraceMeta

# (done, total, path) as each rank finishes
Progress = Callable[[int, int, str], None]


@dataclass
class RankOutcome:
    """What one rank's work leaves behind once its frames are gone."""

    path: str
    meta: TraceMeta
    rank_hint: int | None  # from distributedInfo (profiler_info on Ascend) or the file name
    rank_source: str
    first_us: float  # absolute time of the rank's first event (the trace's clock)
    span: tuple[float, float]  # the rank's time span, on its own clock
    steps_count: int
    has_device: bool
    warnings: list[str]
    facts: list[Fact]  # emptied once spilled (``settle``)
    digest: Any  # analyzers.comm.digest.RankDigest, on the rank's own clock
    replay: bytes | None  # analysis.replay.ReplayState as replay_store.pack writes it; None when the rank has none
    block: int | None = None  # its facts' block in the job's SpilledFacts, once spilled


@dataclass
class RankStub:
    """A rank of a streamed job as the advisor and the input checks see it: its metadata and
    sizes, no frames."""

    meta: TraceMeta
    steps: range  # len() = profiled steps
    has_device: bool
    span: tuple[float, float]  # on the job's origin

    @property
    def rank(self) -> int:
        return self.meta.rank

    def time_span(self) -> tuple[float, float]:
        return self.span


@dataclass
class StreamedJob:
    """A job analysed rank by rank: every rank's facts then the job-wide ones (on disk but for the
    job-wide ones), the replay states (spilled), and a frameless bundle for the advisor."""

    facts: SpilledFacts
    replay: SpilledReplay
    bundle: TraceBundle
    notes: list[str] = field(default_factory=list)  # what the report should say about the run itself


def analyse_rank_file(path: str) -> RankOutcome | LoadProblem:
    """Read one rank, analyse it and digest it; the frames go when this returns. Never raises:
    a rank that cannot be read or analysed comes back as its LoadProblem."""
    from ..trace.kineto.reader import distributed_rank
    from ..trace.loader import parse_one, rank_from_filename

    p, trace, first, err = parse_one(path, split=False)
    if err is not None or trace is None:
        err = err or BadTraceError("not loaded", path)
        return LoadProblem(path=path, message=str(err), exit_code=err.exit_code)
    try:
        hint, how = distributed_rank(trace), ("profiler_info" if trace.meta.format == "ascend" else "distributedInfo")
        if hint is None:
            hint, how = rank_from_filename(trace.meta.source), "filename"
        trace.meta.rank = hint if hint is not None else 0
        trace.meta.rank_source = how if hint is not None else "order"
        trace.meta.origin_us = first
        ctx, facts = analyze_rank(trace)
        digest = digest_of(ctx)
        state = replay_state(ctx.shared, with_deferral=False)
        replay = pack(state) if state is not None else None
        return RankOutcome(path=path, meta=trace.meta, rank_hint=hint, rank_source=how, first_us=first,
                           span=trace.time_span(), steps_count=len(trace.steps), has_device=trace.has_device,
                           warnings=list(trace.warnings), facts=facts, digest=digest, replay=replay)  # fmt: skip
    except MemoryError:
        return LoadProblem(path=path, message=str(BadTraceError("out of memory while analysing", path)), exit_code=3)
    except Exception as exc:  # noqa: BLE001 - one rank's failure must not take the job down
        bad = BadTraceError(f"unexpected {type(exc).__name__} while analysing: {exc}", path)
        return LoadProblem(path=path, message=str(bad), exit_code=bad.exit_code)


def _assign(outcomes: list[RankOutcome]) -> list[str]:
    """Final rank numbers, as ``trace.loader.assign_ranks`` gives them: the hint unless another
    file took it first, else the next free number in file order."""
    from ..trace.loader import number_ranks

    return number_ranks([(o.meta, o.rank_hint, o.rank_source) for o in outcomes])


def _file_note(o: RankOutcome, warning: str) -> str:
    from ..trace.loader import names_a_file

    return warning if names_a_file(warning) else f"{o.meta.source}: {warning}"


def gather(files: Sequence[str], results: Sequence[RankOutcome | LoadProblem | BaseException],
           replay: SpilledReplay, store: SpilledFacts) -> StreamedJob:  # fmt: skip
    """The cross-rank stage on the outcomes of the per-rank one (any executor's, in file order)."""
    outcomes: list[RankOutcome] = []
    index: list[int] = []  # each outcome's place in ``files`` (its spilled replay's key)
    problems: list[LoadProblem] = []
    for i, (path, res) in enumerate(zip(files, results)):
        if isinstance(res, RankOutcome):
            outcomes.append(res)
            index.append(i)
        elif isinstance(res, LoadProblem):
            problems.append(res)
        else:
            bad = BadTraceError(f"not analysed: {_why(res)}", path)
            problems.append(LoadProblem(path=path, message=str(bad), exit_code=bad.exit_code))
    if not outcomes:
        if len(problems) == 1:
            raise BadTraceError(problems[0].message.split(": ", 1)[-1], problems[0].path)
        raise NoTracesError(f"none of the {len(files)} trace files could be loaded; first: {problems[0].message}")
    analysed_as = [o.meta.rank for o in outcomes]
    notes = _assign(outcomes)
    for o, i in zip(outcomes, index):
        o.digest.rank = o.meta.rank  # facts are renumbered as they are placed
        if o.block is None:
            o.block = store.spill(o.facts)
            o.facts = []
        replay.rename(("file", i), o.meta.rank)
        notes.extend(_file_note(o, w) for w in o.warnings)
    origin = min(o.first_us for o in outcomes)
    digests = {}
    stubs = {}
    for o, was in sorted(zip(outcomes, analysed_as), key=lambda p: p[0].meta.rank):
        delta = o.first_us - origin
        o.meta.origin_us = origin
        digests[o.meta.rank] = o.digest.shifted(delta)
        store.place(o.block, was, o.meta.rank, delta)
        stubs[o.meta.rank] = RankStub(meta=o.meta, steps=range(o.steps_count), has_device=o.has_device,
                                      span=(o.span[0] + delta, o.span[1] + delta))  # fmt: skip
    store.add(analyze_cross_rank(digests, store.of_kinds(CROSS_RANK_READS)))
    bundle = TraceBundle(ranks=stubs, problems=problems, warnings=notes, origin_us=origin)  # type: ignore[arg-type]
    return StreamedJob(facts=store, replay=replay, bundle=bundle)


def _why(res: Any) -> str:
    from ..core.workers import Died

    if isinstance(res, Died):
        return res.describe()
    return f"{type(res).__name__}: {res}"


def settle(res: Any, index: int, replay: SpilledReplay, store: SpilledFacts) -> None:
    """A finished rank made small as soon as it arrives: its replay state moved to disk (keyed
    by the rank's place in the file list until ``gather`` knows its number), its facts too
    (fact_store.py; their flat copies stay)."""
    if not isinstance(res, RankOutcome):
        return
    if res.replay is not None:
        replay.put(("file", index), res.replay)
        res.replay = None
    res.block = store.spill(res.facts)
    res.facts = []
    # every rank of a job has the same devices: one copy of their properties (~8 kB a rank)
    props = res.meta.device_properties
    if props:
        res.meta.device_properties = store.shared(props)


__all__ = ["Progress", "RankOutcome", "RankStub", "StreamedJob", "analyse_rank_file", "gather", "settle"]
