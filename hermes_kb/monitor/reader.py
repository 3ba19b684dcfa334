"""Reading a monitor RUN_DIR back for analysis: standard library only.

Step records become columns (``array('d')``, 8 bytes a step and column), so a rank with
100k steps takes a few MB; the rarer parts (events, resource samples, device times) are kept
sparse, keyed by step. A damaged line (a crash cut it, a disk filled up) is skipped and
counted, and the rest of the log still counts.
"""

from __future__ import annotations

import json
import math
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import MAX_RANK, BadTraceError, as_rank
from ..core.limits import open_regular
from ..core.workers import Died, run_each

# ASCII digits only: "rank\u00b9.jsonl" or "rank\u0661.jsonl" is not a rank log
LOG_RE = re.compile(r"^rank([0-9]+)\.jsonl$")
CAPTURE_RE = re.compile(r"^rank([0-9]+)\.capture(.+)\.json\.gz$")
ASCEND_INFO_RE = re.compile(r"^profiler_info_([0-9]+)\.json$")  # inside a torch_npu *_ascend_pt directory
SAMPLE_KEYS = ("process_cpu_cores", "system_cpu_ratio", "rss_bytes", "affinity_count", "runqueue_wait_ratio",
               "top_procs", "others_cores", "siblings_cores", "children_cores", "children_count", "threads_count",
               "torch_threads", "main_run_ratio")  # fmt: skip


@dataclass
class RankLog:
    rank: int
    path: str
    environment: dict[str, Any] | None = None
    step: array = field(default_factory=lambda: array("q"))
    wall_s: array = field(default_factory=lambda: array("d"))
    end_s: array = field(default_factory=lambda: array("d"))  # wall clock (epoch s) at the step's end; NaN if absent
    data_wait_s: array = field(default_factory=lambda: array("d"))
    # the process' CPU time inside that wait (monitor.wrap): a loader without workers prepares the
    # batch in the process; NaN where not recorded (no wrap, or a log older than the field)
    data_wait_cpu_s: array = field(default_factory=lambda: array("d"))
    gc_pause_s: array = field(default_factory=lambda: array("d"))
    gc_count: array = field(default_factory=lambda: array("q"))
    gc_gen2: array = field(default_factory=lambda: array("q"))
    cpu_s: array = field(default_factory=lambda: array("d"))  # NaN where not recorded
    sys_s: array = field(default_factory=lambda: array("d"))  # system CPU of the process; NaN where not recorded
    minflt: array = field(default_factory=lambda: array("d"))  # minor page faults; NaN where not recorded
    # optimizer.step() in the step (monitor's torch hooks): NaN where not recorded, i.e. no step()
    # ran or torch was not hooked
    optimizer_s: array = field(default_factory=lambda: array("d"))
    optimizer_sys_s: array = field(default_factory=lambda: array("d"))
    optimizer_minflt: array = field(default_factory=lambda: array("d"))
    # time in torch.distributed collectives finished in the step (monitor's comm timing); NaN where not recorded
    comm_s: array = field(default_factory=lambda: array("d"))
    fluctuation: array = field(default_factory=lambda: array("b"))
    samples_per_s: array = field(default_factory=lambda: array("d"))  # NaN where not recorded
    mfu: array = field(default_factory=lambda: array("d"))
    events: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> name -> seconds
    device_s: dict[int, float] = field(default_factory=dict)  # step -> device step time
    samples: list[dict[str, Any]] = field(default_factory=list)  # resource samples, with their "step"
    captures: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    bad_lines: int = 0
    first_bad_line: int | None = None
    ignored_fields: int = 0  # records kept with an ill-typed field left out
    problems: list[str] = field(default_factory=list)  # the first few: "line N: field value: why"

    @property
    def steps_count(self) -> int:
        return len(self.wall_s)


@dataclass
class RunLog:
    run_dir: str
    ranks: dict[int, RankLog]
    captures: dict[int, list[Path]]  # rank -> capture traces (and torch_npu *_ascend_pt dirs), oldest first
    warnings: list[str]

    @property
    def sources(self) -> list[str]:
        return [r.path for r in self.ranks.values()] + [str(p) for ps in self.captures.values() for p in ps]


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else float("nan")


def _decoder():
    """msgspec's JSON decoder when installed (a hermes dependency; ~3x faster), else json's."""
    try:
        import msgspec

        return msgspec.json.decode, msgspec.DecodeError
    except ImportError:
        return json.loads, ValueError


MAX_STEP_S = 7 * 86400.0  # a step longer than a week is damage, not a measurement
MIN_STEP_S = 1e-6  # the monitor's own step() takes ~20 µs: a shorter step was not measured
MAX_LINE_BYTES = 16 << 20  # a log line longer than this is damage (the monitor writes < 10 kB)
_INT64 = 2**63


class _Bad(Exception):
    """A step record with an impossible value: the field and the value."""

    def __init__(self, field: str, value: Any, why: str):
        super().__init__(field)
        self.field, self.value, self.why = field, value, why


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _seconds(rec: dict, key: str, lo: float = 0.0, hi: float = MAX_STEP_S, required: bool = False,
             default: float = float("nan")) -> float:  # fmt: skip
    """A time or count field of a step record: a finite number in [lo, hi], else ``_Bad``;
    absent (or null where the monitor writes null) is ``default``."""
    v = rec.get(key)
    if v is None:
        if required:
            raise _Bad(key, v, "missing")
        return default
    if not _is_num(v):
        raise _Bad(key, v, "not a number")
    f = float(v)
    if not math.isfinite(f):
        raise _Bad(key, v, "not finite")
    if f < lo:
        raise _Bad(key, v, f"below {lo:g}" if lo else "negative")
    if f > hi:
        raise _Bad(key, v, f"above {hi:g}")
    return f


def _count(rec: dict, key: str) -> int:
    v = rec.get(key)
    if v is None:
        return 0
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < _INT64:
        raise _Bad(key, v, "not a count (an integer >= 0)")
    return v


def _step_row(rec: dict) -> tuple:
    """The columns of one step record, checked: every value the monitor writes, of its type and
    physically possible (a wall time above zero, waits and pauses inside the step, no negative
    or non-finite time). Raises ``_Bad`` naming the first field that is not."""
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < _INT64:
        raise _Bad("step", step, "not a step number (an integer >= 0)")
    wall = _seconds(rec, "wall_s", required=True)
    if wall < MIN_STEP_S:
        raise _Bad("wall_s", rec.get("wall_s"), f"below {MIN_STEP_S:g} s" if wall > 0 else "not above zero")
    inside = wall * 1.001 + 1e-6  # measured inside the step: never longer than it
    t = _seconds(rec, "time", hi=1e11)  # epoch seconds
    return (step, wall, t, _seconds(rec, "data_wait_s", hi=inside, default=0.0),
            _seconds(rec, "gc_pause_s", hi=inside, default=0.0), _count(rec, "gc_count"), _count(rec, "gc_gen2"),
            _seconds(rec, "cpu_s", hi=wall * 4096 + 1.0), 1 if rec.get("fluctuation") is True else 0,
            _seconds(rec, "samples_per_s", hi=1e12), _seconds(rec, "mfu", hi=100.0),
            _seconds(rec, "sys_s", hi=wall * 4096 + 1.0), _seconds(rec, "minflt", hi=1e15),
            _seconds(rec, "optimizer_s", hi=inside), _seconds(rec, "optimizer_sys_s", hi=wall * 4096 + 1.0),
            _seconds(rec, "optimizer_minflt", hi=1e15), _seconds(rec, "comm_s", hi=wall * 1024 + 1.0),
            _seconds(rec, "data_wait_cpu_s", hi=wall * 4096 + 1.0))  # fmt: skip


_SAMPLE_RANGES = {  # resource sample fields: (lowest, highest) plausible value
    "process_cpu_cores": (0.0, 1e5), "system_cpu_ratio": (0.0, 1.5), "rss_bytes": (0.0, 2.0**62),
    "affinity_count": (1.0, 1e6), "runqueue_wait_ratio": (0.0, 1e3), "others_cores": (0.0, 1e6),
    "siblings_cores": (0.0, 1e6), "children_cores": (0.0, 1e6), "children_count": (0.0, 1e7),
    "threads_count": (0.0, 1e7), "torch_threads": (1.0, 1e6), "main_run_ratio": (0.0, 1e3),
}  # fmt: skip


def _sample(rec: dict, step: int, ignored: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step}
    for k in SAMPLE_KEYS:
        if k not in rec:
            continue
        v = rec[k]
        if k == "top_procs":
            procs = _top_procs(v)
            if procs is None:
                ignored.append(k)
            else:
                out[k] = procs
            continue
        lo, hi = _SAMPLE_RANGES[k]
        if _is_num(v) and math.isfinite(v) and lo <= v <= hi:
            out[k] = int(v) if k in ("affinity_count", "children_count", "threads_count", "torch_threads") else v
        elif v is not None:
            ignored.append(k)
    return out


def _top_procs(v: Any) -> list[dict[str, Any]] | None:
    if not isinstance(v, list):
        return None
    out = []
    for p in v:
        if not isinstance(p, dict):
            return None
        pid, cores = p.get("pid"), p.get("cores", 0.0)
        if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < 2**32):
            return None
        if not (_is_num(cores) and math.isfinite(cores) and 0 <= cores <= 1e5):
            return None
        out.append({"pid": pid, "name": str(p.get("name", ""))[:200], "cores": float(cores), "rel": str(p.get("rel", ""))})
    return out


def _environment(rec: dict, ignored: list[str]) -> dict[str, Any]:
    """The environment record with every field of the type its readers expect (a field that is
    not is left out and named in the warning)."""
    out: dict[str, Any] = {}
    for k, v in rec.items():
        ok = True
        if k == "env" or k == "versions":
            ok = isinstance(v, dict)
            v = {str(a): str(b) for a, b in v.items() if isinstance(b, (str, int, float)) and not isinstance(b, bool)} if ok else v
        elif k in ("affinity", "gc_thresholds"):
            ok = v is None or (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                           and 0 <= x < 2**31 for x in v))  # fmt: skip
        elif k in ("cpu_count", "torch_threads", "pid", "rank"):
            ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31)
        elif k in ("hostname", "platform", "type"):
            ok = v is None or isinstance(v, str)
        elif k == "domains":
            ok = v is None or (isinstance(v, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v))
        elif k == "cpu":
            ok = isinstance(v, dict)
            if ok:
                v = {a: b for a, b in v.items() if (isinstance(b, str) or (_is_num(b) and math.isfinite(b))
                                                    or (isinstance(b, list) and all(isinstance(x, str) for x in b)))}  # fmt: skip
        elif k == "gc_enabled":
            ok = v is None or isinstance(v, bool)
        elif k == "time":
            ok = v is None or (_is_num(v) and math.isfinite(v))
        if ok:
            out[k] = v
        else:
            ignored.append(k)
    return out


def _readlines(fh, limit: int):
    """(line number, bytes) of every line; a line longer than ``limit`` comes as None (damage),
    its rest skipped without being held in memory."""
    n = 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        n += 1
        if len(line) > limit and not line.endswith(b"\n"):
            while True:  # skip the rest of the overlong line
                more = fh.readline(1 << 20)
                if not more or more.endswith(b"\n"):
                    break
            yield n, None
            continue
        yield n, line


def read_rank_log(path: Path, rank: int) -> RankLog:
    """One rank's log. A line that is not JSON, or a step record with an impossible value, is
    dropped and counted (``bad_lines``, the first in ``first_bad_line``, the reasons in
    ``problems``); a field of the environment or of a resource sample that is ill-typed is left
    out and named. A file that cannot be read (a dangling link, a FIFO, a directory) raises
    ``BadTraceError``."""
    log = RankLog(rank=rank, path=str(path))
    decode, decode_error = _decoder()
    cols = (log.step, log.wall_s, log.end_s, log.data_wait_s, log.gc_pause_s, log.gc_count, log.gc_gen2, log.cpu_s,
            log.fluctuation, log.samples_per_s, log.mfu, log.sys_s, log.minflt, log.optimizer_s, log.optimizer_sys_s,
            log.optimizer_minflt, log.comm_s, log.data_wait_cpu_s)  # fmt: skip
    fh, _ = open_regular(path, "a monitor log (rank<R>.jsonl)")
    with fh:
        for n, line in _readlines(fh, MAX_LINE_BYTES):
            if line is not None and not line.strip():
                continue
            why = None
            rec = None
            try:
                if line is None:
                    raise ValueError("line too long")
                rec = decode(line)
                if not isinstance(rec, dict):
                    raise TypeError("not an object")
                kind = rec.get("type")
                if kind == "step":
                    row = _step_row(rec)
            except _Bad as bad:
                why = f"{bad.field} {bad.value!r}: {bad.why}"[:160]
            except (decode_error, ValueError, TypeError, RecursionError, UnicodeDecodeError, OverflowError):
                why = "not a JSON object"
            if why is not None:
                log.bad_lines += 1
                log.first_bad_line = log.first_bad_line or n
                if len(log.problems) < 3:
                    log.problems.append(f"line {n}: {why}")
                continue
            ignored: list[str] = []
            if kind == "step":
                step = row[0]
                for col, v in zip(cols, row):
                    col.append(v)
                if "events" in rec and isinstance(ev := rec["events"], dict):
                    good = {str(k): _num(v) for k, v in ev.items()}
                    good = {k: v for k, v in good.items() if v == v and 0 <= v <= MAX_STEP_S}
                    if len(good) < len(ev):
                        ignored.append("events")
                    log.events[step] = good
                if "device_s" in rec and isinstance(dev := rec["device_s"], list):
                    for pair in dev:
                        if (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)
                                and 0 <= pair[0] < _INT64 and 0 <= _num(pair[1]) <= MAX_STEP_S):  # fmt: skip
                            log.device_s[pair[0]] = _num(pair[1])
                        else:
                            ignored.append("device_s")
                if "process_cpu_cores" in rec or "affinity_count" in rec or "top_procs" in rec:
                    log.samples.append(_sample(rec, step, ignored))
            elif kind == "environment":
                log.environment = _environment(rec, ignored)
            elif kind == "capture":
                log.captures.append(rec)
            elif kind == "end":
                log.end = rec
            if ignored:
                log.ignored_fields += 1
                if len(log.problems) < 3:
                    log.problems.append(f"line {n}: ignored ill-typed {', '.join(sorted(set(ignored)))}")
    return log


def ascend_rank(d: Path) -> int | None:
    """The rank of a torch_npu profiler directory (``*_ascend_pt``) from its profiler_info_<R>.json."""
    try:
        children = list(d.iterdir())
    except OSError:
        return None
    for c in children:
        if m := ASCEND_INFO_RE.match(c.name):
            return as_rank(m.group(1))
    return None


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    try:
        return p.is_dir() and any(LOG_RE.match(c.name) for c in p.iterdir())
    except OSError:
        return False


PARALLEL_BYTES = 8 << 20  # below this, worker processes cost more than they save


def _read_one(path: Path, rank: int) -> RankLog | BadTraceError:
    try:
        return read_rank_log(path, rank)
    except BadTraceError as exc:
        return exc
    except OSError as exc:  # the file went away or became unreadable while it was read
        return BadTraceError(f"cannot read: {exc.strerror or exc}", str(path))


def _read_all(logs: list[tuple[Path, int]]) -> list[RankLog | BadTraceError]:
    """Every log; large ones in forked workers, one rank each (a worker that dies costs its rank)."""
    size = 0
    for p, _ in logs:
        try:
            size += p.stat().st_size
        except OSError:
            pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(cpus, len(logs)) if size >= PARALLEL_BYTES else 1
    out = run_each(_read_one, logs, workers)
    return [BadTraceError(f"not read: {r.describe()}", str(p)) if isinstance(r, Died)
            else BadTraceError(f"unexpected {type(r).__name__} while reading: {r}", str(p))
            if isinstance(r, BaseException) and not isinstance(r, BadTraceError) else r
            for (p, _), r in zip(logs, out)]  # fmt: skip


def read_run(run_dir: str | Path) -> RunLog:
    """Every rank<R>.jsonl and rank<R>.capture<ID>.json.gz in ``run_dir``, and the torch_npu
    profiler directories (``*_ascend_pt``) written into it (large logs are read in parallel
    processes, one rank each). A log that cannot be read (a dangling link, a FIFO, a directory
    with a log's name) or whose lines are damaged is named in ``warnings``; the other ranks count."""
    d = Path(run_dir)
    ranks: dict[int, RankLog] = {}
    captures: dict[int, list[Path]] = {}
    warnings: list[str] = []
    logs: list[tuple[Path, int]] = []
    for c in sorted(d.iterdir()):
        if m := LOG_RE.match(c.name):
            r = as_rank(m.group(1))
            if r is None:
                warnings.append(f"{c}: rank {m.group(1)[:20]} out of range (at most {MAX_RANK}): ignored")
                continue
            logs.append((c, r))
        elif m := CAPTURE_RE.match(c.name):
            if (r := as_rank(m.group(1))) is not None:
                captures.setdefault(r, []).append(c)
        elif c.name.endswith("_ascend_pt") and c.is_dir() and (r := ascend_rank(c)) is not None:
            captures.setdefault(r, []).append(c)
    claims: dict[int, list[Path]] = {}
    for c, r in logs:
        claims.setdefault(r, []).append(c)
    for r, paths in claims.items():
        if len(paths) > 1:  # rank01.jsonl and rank1.jsonl: neither can be trusted to be rank 1
            warnings.append(f"{d}: rank {r} is claimed by {len(paths)} logs ({', '.join(p.name for p in paths)}): "
                            "all of them skipped")  # fmt: skip
    logs = [(c, r) for c, r in logs if len(claims[r]) == 1]
    for (c, _), log in zip(logs, _read_all(logs)):
        if isinstance(log, BadTraceError):
            warnings.append(f"skipped {log}")
            continue
        if log.bad_lines:
            detail = f": {'; '.join(log.problems)}" if log.problems else ""
            warnings.append(f"{c}: skipped {log.bad_lines} damaged line(s) (first at line {log.first_bad_line}){detail}")
        elif log.problems:
            warnings.append(f"{c}: {'; '.join(log.problems)}")
        if log.steps_count == 0:
            warnings.append(f"{c}: no step records")
            continue
        ranks[log.rank] = log
    for r, ps in list(captures.items()):
        ok = []
        for p in ps:
            try:
                ok.append((p.stat().st_mtime, p))
            except OSError:  # a dangling link among the captures
                warnings.append(f"{p}: cannot read (a dangling link?): capture ignored")
        captures[r] = [p for _, p in sorted(ok, key=lambda x: x[0])]
        if not captures[r]:
            del captures[r]
    return RunLog(run_dir=str(d), ranks=ranks, captures=captures, warnings=warnings)
