"""Which other processes use the CPU, from /proc (Linux; absent elsewhere): standard library only.

A scan reads ``/proc/<pid>/stat`` of every process (about 15 µs each), so the Monitor runs it
at most every ``procs_every_s`` seconds; cores used are the difference of utime+stime between
two scans over the wall time between them. Each process is related to the monitored one:
``self``, ``child`` (a descendant: DataLoader workers), ``sibling`` (same parent and same
name: another rank of the job started by the same launcher) or ``other``.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

TOP = 5
MIN_CORES = 0.05  # below this a process is idle, not a competitor


class ProcStat(NamedTuple):
    name: str
    ppid: int
    ticks: int  # utime + stime, in clock ticks
    threads: int
    start: int  # start time in ticks after boot: tells a reused pid from the same process


def read_procs(proc: str = "/proc") -> dict[int, ProcStat] | None:
    """Every readable process, or None where there is no /proc."""
    try:
        names = os.listdir(proc)
    except OSError:
        return None
    out: dict[int, ProcStat] = {}
    for p in names:
        if not p.isdigit():
            continue
        try:
            with open(f"{proc}/{p}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:  # exited between listdir and open, or not ours to read
            continue
        close = raw.rfind(b")")
        rest = raw[close + 2 :].split()
        if len(rest) < 20:
            continue
        name = raw[raw.find(b"(") + 1 : close].decode("utf-8", "replace")
        out[int(p)] = ProcStat(name, int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[17]), int(rest[19]))
    return out


def descendants(procs: dict[int, ProcStat], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st.ppid, []).append(pid)
    out: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(children.get(pid, ()))
    return out


class ProcessSampler:
    """Cores used by the other processes between two ``sample()`` calls."""

    def __init__(self, pid: int | None = None, proc: str = "/proc", top: int = TOP):
        self.pid = os.getpid() if pid is None else pid
        self.proc = proc
        self.top = top
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, dict[int, ProcStat]] | None = None

    def sample(self, now: float | None = None) -> dict | None:
        """None on the first call (nothing to diff against) and where /proc is absent."""
        now = time.perf_counter() if now is None else now
        cur = read_procs(self.proc)
        if cur is None:
            return None
        last, self._last = self._last, (now, cur)
        if last is None or now <= last[0]:
            return None
        t0, before = last
        dt = now - t0
        me = cur.get(self.pid)
        kids = descendants(cur, self.pid)
        sums = {"child": 0.0, "sibling": 0.0, "other": 0.0}
        threads = me.threads if me else 0
        ranked = []
        for pid, st in cur.items():
            if pid == self.pid:
                continue
            prev = before.get(pid)
            # a process new since the last scan spent all its ticks inside the interval
            ticks = st.ticks - (prev.ticks if prev is not None and prev.start == st.start else 0)
            cores = max(ticks, 0) / self.hz / dt
            if pid in kids:
                rel = "child"
                threads += st.threads
            elif me is not None and st.ppid == me.ppid and st.name == me.name:
                rel = "sibling"
            else:
                rel = "other"
            sums[rel] += cores
            if rel != "child" and cores >= MIN_CORES:
                ranked.append((cores, pid, st.name, rel))
        ranked.sort(reverse=True)
        return {
            "top_procs": [{"pid": pid, "name": name, "cores": round(c, 3), "rel": rel}
                          for c, pid, name, rel in ranked[: self.top]],  # fmt: skip
            "others_cores": round(sums["other"], 3),
            "siblings_cores": round(sums["sibling"], 3),
            "children_cores": round(sums["child"], 3),
            "children_count": len(kids),
            "threads_count": threads,
        }


def main_thread_ns() -> tuple[int, int] | None:
    """(on-CPU, runnable-but-waiting) nanoseconds of the main thread (/proc/self/schedstat); the
    rest of its wall time it slept: on a queue, a lock, a barrier, I/O."""
    try:
        with open("/proc/self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
            return int(run), int(wait)
    except (OSError, ValueError):
        return None

