"""``hermes annotate TRACE -o annotated.json.gz``: the trace as recorded, plus tracks for the
Perfetto UI (https://ui.perfetto.dev) and chrome://tracing:

* a process "hermes: critical path" holding each analysed step's critical path as complete
  (``X``) events, one per segment, named after the operator, kernel or gap (args: category,
  enclosing op, step); a step whose path runs into the next step's (device work still queued)
  goes to a second thread, as the events of one thread must nest;
* a process "hermes: findings" with one thread per finding (more when its windows overlap),
  named by case id and title, holding the finding's evidence windows as ``X`` events named by
  case id (args: title, severity, expected speedup, fact, scope). Each rank a finding covers
  gets its own evidence (``Advised.rank_evidence``: the rank's best match of the case), not the
  one rank's evidence the report's finding shows; evidence scoped to another rank is left out.

Both processes get ``process_name`` / ``thread_name`` / sort-index metadata events and pids
that the trace does not use. Every original event is kept unchanged (same count, same content,
same order; top-level keys too). Times go back on the trace's own clock: the bundle's times are
µs from the bundle origin (``TraceMeta.origin_us``, absolute, with ``baseTimeNanoseconds``
applied by the reader), so a time t of the bundle is ``t + origin_us - baseTimeNanoseconds /
1000`` in the file."""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import BadTraceError, UsageError

CAT = "hermes"
_RANK_IN_SCOPE = re.compile(r"\brank (\d+)\b")


@dataclass
class Written:
    path: str
    rank: int
    original_events: int
    added_events: int
    path_segments: int
    evidence_windows: int


def clock_offset_us(meta) -> float:
    """What to add to a bundle time (µs from the bundle origin) to get the file's own ``ts``."""
    return float(meta.origin_us) - (meta.base_time_ns / 1000.0 if meta.base_time_ns else 0.0)


def _read(path: str):
    from ..trace.kineto.reader import read_bytes

    raw = read_bytes(path)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadTraceError(f"invalid JSON: {exc}", path) from None
    if isinstance(doc, list):
        return doc, doc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise BadTraceError("JSON is not a profiler trace (no 'traceEvents' list of events)", path)
    return doc, doc["traceEvents"]


def _free_pids(events: list, n: int) -> list[int]:
    used = {e.get("pid") for e in events if isinstance(e, dict)}
    ints = [p for p in used if isinstance(p, int) and not isinstance(p, bool)]
    base = max(ints, default=0) + 1
    out, p = [], max(base, 1_000_000_000)
    while len(out) < n:
        if p not in used and str(p) not in used:
            out.append(p)
        p += 1
    return out


def _meta(pid: int, tid: int | None, name: str, value) -> dict:
    e = {"ph": "M", "name": name, "pid": pid, "args": {"name": value} if "name" in name else {"sort_index": value}}
    if tid is not None:
        e["tid"] = tid
    else:
        e["tid"] = 0
    return e


def _x(pid: int, tid: int, name: str, start: float, end: float, args: dict) -> dict:
    """A complete event from ``start`` to ``end`` (file clock, µs), both rounded to ns first so
    that segments that tile time stay end to end (no overlap from rounding the duration)."""
    ts, te = round(start, 3), round(end, 3)
    return {"ph": "X", "cat": CAT, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": round(max(te - ts, 0.0), 3),
            "args": args}  # fmt: skip


def _lanes(windows: list[tuple[float, float, dict]]) -> list[list[tuple[float, float, dict]]]:
    """Windows split into lanes without overlap (one thread each: a thread's X events must nest)."""
    lanes: list[list] = []
    ends: list[float] = []
    for w in sorted(windows, key=lambda w: (w[0], -w[1])):
        for i, end in enumerate(ends):
            if w[0] >= end:
                lanes[i].append(w)
                ends[i] = w[1]
                break
        else:
            lanes.append([w])
            ends.append(w[1])
    return lanes


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def tracks(adv, rank: int, offset: float, pids: tuple[int, int]) -> tuple[list[dict], int, int]:
    """The added events of one rank: (events, critical-path segments, evidence windows)."""
    cp_pid, fd_pid = pids
    out: list[dict] = [
        _meta(cp_pid, None, "process_name", "hermes: critical path"),
        _meta(cp_pid, None, "process_sort_index", -2),
        _meta(fd_pid, None, "process_name", "hermes: findings (evidence windows)"),
        _meta(fd_pid, None, "process_sort_index", -1),
    ]
    segments = 0
    from ..analysis.rank import critical_paths

    # a step's path can run past the next step's start (device work still queued): steps whose
    # paths overlap go to separate threads, as chrome://tracing nests events of one thread
    steps = []
    for step, df in sorted(critical_paths(adv.bundle[rank]).items()):
        rows = [(a, b, c, n, o) for a, b, c, n, o in zip(df["start_us"], df["end_us"], df["category"].astype(str),
                                                           df["name"].astype(str), df["op"].astype(str))
                if _finite(a, b) and b >= a]  # fmt: skip
        if rows:
            steps.append((min(r[0] for r in rows), max(r[1] for r in rows), {"step": int(step), "rows": rows}))
    for lane_no, lane in enumerate(_lanes(steps)):
        tid = 1 + lane_no
        out.append(_meta(cp_pid, tid, "thread_name", f"critical path, rank {rank}" + (f" ({lane_no + 1})" if lane_no else "")))
        out.append(_meta(cp_pid, tid, "thread_sort_index", lane_no))
        for _, _, item in lane:
            for start, end, cat, name, op in item["rows"]:
                label = name or ("device idle" if cat == "device_idle" else cat)
                out.append(_x(cp_pid, tid, label, start + offset, end + offset,
                              {"category": cat, "op": op, "step": item["step"]}))  # fmt: skip
                segments += 1
    windows = 0
    tid = 10
    own = getattr(adv, "rank_evidence", None) or {}
    for i, f in enumerate(adv.report.findings, 1):
        if f.ranks and rank not in f.ranks:
            continue
        items = []
        # the rank's own evidence (the finding itself keeps one rank's); the finding's when the
        # rank's is not known
        evidence = own.get(f.case_id, {}).get(rank, f.evidence)
        for e in evidence:
            m = _RANK_IN_SCOPE.search(e.scope)
            if m and int(m.group(1)) != rank:
                continue
            for a, b in e.time_ranges_us:
                if _finite(a, b) and b >= a:
                    items.append((a, b, {"title": f.title, "severity": f.severity, "fact": e.fact, "scope": e.scope,
                                         "expected_speedup": f"{f.expected_speedup.low:.2f}x-{f.expected_speedup.high:.2f}x",
                                         "finding": i}))  # fmt: skip
        for j, lane in enumerate(_lanes(items)):
            suffix = f" ({j + 1})" if j else ""
            out.append(_meta(fd_pid, tid, "thread_name", f"{f.case_id} {f.title}{suffix}"))
            out.append(_meta(fd_pid, tid, "thread_sort_index", i * 100 + j))
            for a, b, args in lane:
                out.append(_x(fd_pid, tid, f.case_id, a + offset, b + offset, args))
                windows += 1
            tid += 1
    return out, segments, windows


def _output_for(output: Path, source: str, several: bool) -> Path:
    if not several:
        return output
    name = Path(source).name
    for suffix in (".pt.trace.json.gz", ".json.gz", ".pt.trace.json", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return output / f"{name}.annotated.json.gz"


def annotate_bundle(adv, output: str | Path) -> list[Written]:
    """Write each rank's trace with the added tracks (``advisor.run.Advised`` of Kineto traces).
    One rank: ``output`` is the file; several: a directory (created) holding
    ``<name>.annotated.json.gz`` per rank."""
    bundle = adv.bundle
    if bundle is None or not len(bundle):
        raise UsageError("nothing to annotate: no trace loaded")
    if any(t.meta.format != "kineto" for t in bundle):
        raise UsageError("annotate writes Kineto JSON traces back; torch_npu (Ascend) output is not supported")
    output = Path(output)
    several = len(bundle) > 1
    if several:
        if output.exists() and not output.is_dir():
            raise UsageError(f"{len(bundle)} ranks given: -o must be a directory, and {output} is a file")
        output.mkdir(parents=True, exist_ok=True)
    written = []
    for t in bundle:
        doc, events = _read(t.meta.source)
        n0 = len(events)
        added, segs, wins = tracks(adv, t.rank, clock_offset_us(t.meta), tuple(_free_pids(events, 2)))
        events.extend(added)
        dest = _output_for(output, t.meta.source, several)
        data = json.dumps(doc, ensure_ascii=False, allow_nan=True).encode("utf-8")
        if dest.name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=6)
        dest.write_bytes(data)
        written.append(Written(path=str(dest), rank=t.rank, original_events=n0, added_events=len(added),
                               path_segments=segs, evidence_windows=wins))  # fmt: skip
    return written


__all__ = ["Written", "annotate_bundle", "clock_offset_us", "tracks"]
