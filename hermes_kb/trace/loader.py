"""``load``: paths in, TraceBundle out.

Accepts one trace file, a directory of per-rank files, or a list of files. Ranks are parsed
in parallel worker processes (only the frames travel back). A rank that fails is reported in
``bundle.problems`` and skipped; if none loads, the first problem is raised.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from ..core.errors import BadTraceError, HermesError, InputNotFoundError, NoTracesError, as_rank
from ..core.cpus import usable_cpus
from ..core.workers import Died, run_each
from .ascend.files import OUTPUT_DIR, ascend_rank_dir, find_ascend_ranks
from .bundle import LoadProblem, RankTrace, TraceBundle, TraceMeta
from .kineto.reader import distributed_rank, parse_kineto

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
_RANK_RE = re.compile(r"(?:rank|worker)[-_]?([0-9]+)", re.IGNORECASE)  # ASCII digits: int() reads others too

MIN_SPAN_US = 1.0  # a profile shorter than a microsecond has recorded nothing to analyse
PathLike = str | os.PathLike
Progress = Callable[[int, int, str], None]


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(TRACE_SUFFIXES)


def _cluster_output(p: Path) -> bool:
    return (p / "cluster_step_trace_time.csv").is_file() or (p / "cluster_communication.json").is_file()


def discover(paths: PathLike | Sequence[PathLike]) -> list[str]:
    """Expand the user's input into a list of ranks to read: Kineto trace files (directories:
    their direct children) and torch_npu ``*_ascend_pt`` directories (or a directory of them)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise NoTracesError("no input paths given")
    files: list[str] = []
    for item in items:
        p = Path(item)
        if not p.exists():
            if p.is_symlink():
                raise BadTraceError("is a dangling symbolic link", str(p))
            raise InputNotFoundError("no such file or directory", str(p))
        if p.is_dir():
            npu = find_ascend_ranks(p)
            if npu:
                files.extend(str(a.root) if a.root.name != OUTPUT_DIR else str(a.output) for a in npu)
                continue
            if _cluster_output(p):
                raise NoTracesError("this is msprof-analyze cluster output, not profiler output: pass the "
                                    "*_ascend_pt directories it was computed from", str(p))  # fmt: skip
            found = sorted(c for c in p.iterdir() if is_trace_file(c))
            if not found:
                deeper = _traces_below(p)
                hint = f" ({deeper} in subdirectories: pass one of those directories)" if deeper else ""
                raise NoTracesError(
                    f"directory holds no trace files (*.json, *.json.gz) and no torch_npu output (*_ascend_pt){hint}", str(p)
                )
            files.extend(str(c) for c in found)
        elif p.name == "trace_view.json" or p.suffix == ".csv" or p.suffix == ".db":
            files.append(str(p.parent))  # one file of a torch_npu export: read its directory
        else:
            files.append(str(p))
    return files


def _traces_below(root: Path, depth: int = 6, budget: int = 100_000) -> int:
    """How many trace files lie in ``root``'s subdirectories, breadth first, at most ``depth``
    levels down and ``budget`` entries looked at (a tree 1,100 levels deep, or a home
    directory, must not hang or overflow the stack); links to directories are not followed."""
    found, seen = 0, 0
    level = [root]
    for _ in range(depth):
        nxt: list[Path] = []
        for d in level:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                seen += 1
                if seen > budget:
                    return found
                try:
                    if e.is_dir(follow_symlinks=False):
                        nxt.append(Path(e.path))
                    elif d != root and is_trace_file(Path(e.path)):
                        found += 1
                except OSError:
                    continue
        level = nxt
    return found


def rank_from_filename(path: str) -> int | None:
    m = None
    for m in _RANK_RE.finditer(Path(path).name):
        pass
    return as_rank(m.group(1)) if m else None


def parse_one(path: str, split: bool = True) -> tuple[str, RankTrace | None, float, HermesError | None]:
    try:
        if os.path.isdir(path):
            from .ascend.reader import parse_ascend

            af = ascend_rank_dir(Path(path))
            if af is None:
                raise NoTracesError("no torch_npu profiler output in this directory", path)
            trace, first = parse_ascend(af)
        else:
            trace, first = parse_kineto(path, split=split)
        lo, hi = trace.time_span()
        if not hi - lo >= MIN_SPAN_US:  # every step, share and gain would divide by (nearly) nothing
            raise BadTraceError(f"its events span {max(hi - lo, 0.0):g} µs in all: no time to analyse", path)
        return path, trace, first, None
    except HermesError as exc:
        return path, None, 0.0, exc
    except MemoryError:
        return path, None, 0.0, BadTraceError("out of memory while reading", path)
    except Exception as exc:  # a reader bug must not take the other ranks down
        return path, None, 0.0, BadTraceError(f"unexpected {type(exc).__name__} while reading: {exc}", path)


def _workers(n_files: int, max_workers: int | None) -> int:
    if max_workers is not None:
        return max(1, min(max_workers, n_files))
    cpus = usable_cpus()
    return max(1, min(cpus, n_files))


def _parse_all(files: list[str], max_workers: int | None, progress: Progress | None):
    """Every file parsed, each in its own forked worker when there are several (a worker that
    dies, e.g. killed for memory, costs its own rank only: it is reported as that rank's problem)."""
    n = _workers(len(files), max_workers)
    finished = 0

    def done(i: int, res) -> None:
        nonlocal finished
        finished += 1
        if progress:
            progress(finished, len(files), files[i])

    out = []
    for f, res in zip(files, run_each(parse_one, [(f, n == 1) for f in files], n, done)):
        if isinstance(res, Died):
            res = (f, None, 0.0, BadTraceError(f"not loaded: {res.describe()}", f))
        elif isinstance(res, BaseException):  # parse_one catches everything; kept for safety
            res = (f, None, 0.0, BadTraceError(f"unexpected {type(res).__name__} while reading: {res}", f))
        out.append(res)
    return out


def names_a_file(warning: str) -> bool:
    first = warning.split(": ", 1)[0]
    return "/" in first or os.sep in first or first.endswith((".json", ".gz", ".csv", ".db", ".jsonl"))


def assign_ranks(traces: list[RankTrace]) -> list[str]:
    """Rank from distributedInfo.rank, else from the file name, else by order (with a warning)."""
    claims = []
    for t in traces:
        r = distributed_rank(t)
        how = "profiler_info" if t.meta.format == "ascend" else "distributedInfo"
        if r is None:
            r = rank_from_filename(t.meta.source)
            how = "filename"
        claims.append((t.meta, r, how))
    return number_ranks(claims)


def number_ranks(claims: list[tuple[TraceMeta, int | None, str]]) -> list[str]:
    """Final rank numbers for (meta, claimed rank, where the claim comes from), in file order: the
    claim unless another file took it first, else the next free number (with a note)."""
    notes: list[str] = []
    taken: set[int] = set()
    pending: list[tuple[TraceMeta, int | None, str]] = []
    for meta, r, how in claims:
        if r is None or r in taken:
            pending.append((meta, r, how))
            continue
        meta.rank, meta.rank_source = r, how
        taken.add(r)
    nxt = 0
    for meta, r, how in pending:
        while nxt in taken:
            nxt += 1
        meta.rank, meta.rank_source = nxt, "order"
        taken.add(nxt)
        if r is not None:
            notes.append(f"{meta.source}: rank {r} ({how}) already taken by another file; numbered {nxt} by file order")
        elif len(claims) > 1:
            notes.append(f"{meta.source}: no rank in distributedInfo or file name; numbered {nxt} by file order")
    return notes


def load(
    paths: PathLike | Sequence[PathLike],
    *,
    max_workers: int | None = None,
    progress: Progress | None = None,
) -> TraceBundle:
    """Load PyTorch profiler traces into a TraceBundle (the public entry point; see docs/api.md).

    Raises ``InputNotFoundError`` for a missing path, ``NoTracesError`` when nothing loadable
    is found, ``BadTraceError`` when the only trace given is damaged. With several files, a
    damaged one is recorded in ``bundle.problems`` and the others load.
    """
    files = discover(paths)
    results = _parse_all(files, max_workers, progress)
    good = [(t, first) for _, t, first, err in results if t is not None]
    problems = [
        LoadProblem(path=p, message=str(err), exit_code=err.exit_code) for p, t, _, err in results if err is not None
    ]
    if not good:
        errs = [err for *_, err in results if err is not None]
        if len(errs) == 1:
            raise errs[0]
        raise NoTracesError(f"none of the {len(files)} trace files could be loaded; first: {errs[0]}")
    traces = [t for t, _ in good]
    notes = assign_ranks(traces)
    for t in traces:  # damage a reader dropped or skipped reaches every report, named by file
        notes.extend(w if names_a_file(w) else f"{t.meta.source}: {w}" for w in t.warnings)
    origin = min(first for _, first in good)
    for t, first in good:
        t.shift(first - origin)
        t.meta.origin_us = origin
    return TraceBundle(ranks={t.rank: t for t in traces}, problems=problems, warnings=notes, origin_us=origin)
