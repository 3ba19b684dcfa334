"""Reading a monitor RUN_DIR back for analysis: standard library only.

Step records become columns (``array('d')``, 8 bytes a step and column), so a rank with
100k steps takes a few MB; the rarer parts (events, resource samples, device times) are kept
sparse, keyed by step. A damaged line (a crash cut it, a disk filled up) is skipped and
counted, and the rest of the log still counts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_RE = re.compile(r"^rank(\d+)\.jsonl$")
CAPTURE_RE = re.compile(r"^rank(\d+)\.capture(.+)\.json\.gz$")
ASCEND_INFO_RE = re.compile(r"^profiler_info_(\d+)\.json$")  # inside a torch_npu *_ascend_pt directory
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
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def _decoder():
    """msgspec's JSON decoder when installed (a hermes dependency; ~3x faster), else json's."""
    try:
        import msgspec

        return msgspec.json.decode, msgspec.DecodeError
    except ImportError:
        return json.loads, ValueError


def read_rank_log(path: Path, rank: int) -> RankLog:
    log = RankLog(rank=rank, path=str(path))
    nan = float("nan")
    decode, decode_error = _decoder()
    cols = (log.step, log.wall_s, log.end_s, log.data_wait_s, log.gc_pause_s, log.gc_count, log.gc_gen2, log.cpu_s,
            log.fluctuation, log.samples_per_s, log.mfu, log.sys_s, log.minflt, log.optimizer_s, log.optimizer_sys_s,
            log.optimizer_minflt)  # fmt: skip
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = decode(line)
                kind = rec.get("type")
                if kind == "step":
                    step = rec["step"]
                    if not isinstance(step, int):
                        raise TypeError("step")
                    # the monitor writes these types; anything else is damage, caught below
                    row = (step, float(rec["wall_s"]), float(rec.get("time", nan)), float(rec.get("data_wait_s") or 0.0),
                           float(rec.get("gc_pause_s") or 0.0), int(rec.get("gc_count") or 0),
                           int(rec.get("gc_gen2") or 0), float(rec.get("cpu_s", nan)), 1 if rec.get("fluctuation") else 0,
                           float(rec.get("samples_per_s", nan)), float(rec.get("mfu", nan)),
                           float(rec.get("sys_s", nan)), float(rec.get("minflt", nan)), float(rec.get("optimizer_s", nan)),
                           float(rec.get("optimizer_sys_s", nan)), float(rec.get("optimizer_minflt", nan)))  # fmt: skip
            except (decode_error, ValueError, AttributeError, KeyError, TypeError, UnicodeDecodeError):
                log.bad_lines += 1
                log.first_bad_line = log.first_bad_line or n
                continue
            if kind == "step":
                for col, v in zip(cols, row):
                    col.append(v)
                if "events" in rec and isinstance(ev := rec["events"], dict):
                    log.events[step] = {str(k): _num(v) for k, v in ev.items()}
                if "device_s" in rec and isinstance(dev := rec["device_s"], list):
                    for pair in dev:
                        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int):
                            log.device_s[pair[0]] = _num(pair[1])
                if "process_cpu_cores" in rec or "affinity_count" in rec or "top_procs" in rec:
                    log.samples.append({"step": step, **{k: rec[k] for k in SAMPLE_KEYS if k in rec}})
            elif kind == "environment":
                log.environment = rec
            elif kind == "capture":
                log.captures.append(rec)
            elif kind == "end":
                log.end = rec
    return log


def ascend_rank(d: Path) -> int | None:
    """The rank of a torch_npu profiler directory (``*_ascend_pt``) from its profiler_info_<R>.json."""
    for c in d.iterdir():
        if m := ASCEND_INFO_RE.match(c.name):
            return int(m.group(1))
    return None


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and any(LOG_RE.match(c.name) for c in p.iterdir())


PARALLEL_BYTES = 8 << 20  # below this, worker processes cost more than they save


def _read_all(logs: list[tuple[Path, int]]) -> list[RankLog]:
    size = sum(p.stat().st_size for p, _ in logs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if len(logs) < 2 or cpus < 2 or size < PARALLEL_BYTES or not sys.platform.startswith("linux"):
        return [read_rank_log(p, r) for p, r in logs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(cpus, len(logs)), mp_context=mp.get_context("fork")) as pool:
        return list(pool.map(read_rank_log, *zip(*logs)))


def read_run(run_dir: str | Path) -> RunLog:
    """Every rank<R>.jsonl and rank<R>.capture<ID>.json.gz in ``run_dir``, and the torch_npu
    profiler directories (``*_ascend_pt``) written into it (large logs are read in parallel
    processes, one rank each)."""
    d = Path(run_dir)
    ranks: dict[int, RankLog] = {}
    captures: dict[int, list[Path]] = {}
    warnings: list[str] = []
    logs: list[tuple[Path, int]] = []
    for c in sorted(d.iterdir()):
        if m := LOG_RE.match(c.name):
            logs.append((c, int(m.group(1))))
        elif m := CAPTURE_RE.match(c.name):
            captures.setdefault(int(m.group(1)), []).append(c)
        elif c.is_dir() and c.name.endswith("_ascend_pt") and (r := ascend_rank(c)) is not None:
            captures.setdefault(r, []).append(c)
    for log in _read_all(logs):
        c = log.path
        if log.bad_lines:
            warnings.append(f"{c}: skipped {log.bad_lines} damaged line(s) (first at line {log.first_bad_line})")
        if log.steps_count == 0:
            warnings.append(f"{c}: no step records")
            continue
        ranks[log.rank] = log
    for ps in captures.values():
        ps.sort(key=lambda p: p.stat().st_mtime)
    return RunLog(run_dir=str(d), ranks=ranks, captures=captures, warnings=warnings)
