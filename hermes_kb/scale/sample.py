"""``--sample K``: a first answer from K ranks of a large job.

A cheap first pass reads every rank's ProfilerStep events and distributedInfo only (no frames,
no analysis): its step times and the communication domains (process groups) it belongs to.
The K ranks analysed are then: the slowest rank, the fastest (the reference the cross-rank
facts compare against), one rank of every domain not yet covered (its slowest), and the next
slowest ranks until K are chosen.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..core.errors import as_rank

STEP_RE = re.compile(r"ProfilerStep#\d+")
DEVICE_COPY = "gpu_user_annotation"  # the device timeline's copy of a step annotation


class _Event(msgspec.Struct):
    name: Any = ""
    cat: Any = ""
    ts: Any = None
    dur: Any = None


class _Head(msgspec.Struct):
    traceEvents: list[_Event] = []
    distributedInfo: Any = None


@dataclass
class FirstLook:
    """What the first pass saw of one rank file."""

    path: str
    rank: int | None
    step_us: float | None  # mean ProfilerStep duration; None when the file has none (or is not Kineto)
    steps: int
    domains: list[tuple[int, ...]] = field(default_factory=list)  # process groups' members
    error: str | None = None


def _domains(dist: Any) -> list[tuple[int, ...]]:
    if not isinstance(dist, dict):
        return []
    out = []
    for pg in dist.get("pg_config") or []:
        ranks = pg.get("ranks") if isinstance(pg, dict) else None
        if isinstance(ranks, list):
            members = tuple(sorted({r for r in (as_rank(x) for x in ranks) if r is not None}))
            if len(members) >= 2:
                out.append(members)
    return out


def first_look(path: str) -> FirstLook:
    """Step times and domains of one rank, from its ProfilerStep events only. Never raises."""
    from ..trace.kineto.reader import read_bytes
    from ..trace.loader import rank_from_filename

    if os.path.isdir(path):  # torch_npu output: no cheap step times; still a candidate
        return FirstLook(path=path, rank=rank_from_filename(path), step_us=None, steps=0)
    try:
        head = msgspec.json.decode(read_bytes(path), type=_Head)
    except Exception as exc:  # noqa: BLE001 - a damaged rank is reported by the analysis, if chosen
        return FirstLook(path=path, rank=rank_from_filename(path), step_us=None, steps=0, error=str(exc))
    durs = [float(e.dur) for e in head.traceEvents
            if isinstance(e.name, str) and STEP_RE.fullmatch(e.name) and e.cat != DEVICE_COPY
            and isinstance(e.dur, (int, float)) and not isinstance(e.dur, bool)]  # fmt: skip
    dist = head.distributedInfo if isinstance(head.distributedInfo, dict) else {}
    rank = as_rank(dist.get("rank"))
    return FirstLook(path=path, rank=rank if rank is not None else rank_from_filename(path),
                     step_us=sum(durs) / len(durs) if durs else None, steps=len(durs), domains=_domains(dist))  # fmt: skip


def first_pass(files: Sequence[str], workers: int) -> list[FirstLook]:
    from ..core.workers import Died, run_each

    looks = run_each(first_look, [(f,) for f in files], workers)
    return [x if isinstance(x, FirstLook) else FirstLook(path=f, rank=None, step_us=None, steps=0,
                                                         error=x.describe() if isinstance(x, Died) else str(x))
            for f, x in zip(files, looks)]  # fmt: skip


def choose(looks: Sequence[FirstLook], k: int) -> list[tuple[int, str]]:
    """(index into ``looks``, why) of the ranks to analyse, at most ``k``."""
    timed = [i for i, x in enumerate(looks) if x.step_us is not None]
    by_time = sorted(timed, key=lambda i: (-looks[i].step_us, i))  # type: ignore[operator]
    picked: dict[int, str] = {}

    def pick(i: int, why: str) -> None:
        if len(picked) < k and i not in picked:
            picked[i] = why

    if by_time:
        pick(by_time[0], "slowest step time in the first pass")
        pick(by_time[-1], "fastest step time (the reference)")
    by_rank = {x.rank: i for i, x in enumerate(looks) if x.rank is not None}
    domains = sorted({d for x in looks for d in x.domains})
    for d in domains:
        members = [by_rank[r] for r in d if r in by_rank]
        if not members or any(i in picked for i in members):
            continue
        slowest = max(members, key=lambda i: (looks[i].step_us or -1.0, -i))
        pick(slowest, f"covers process group {_ranks_text(d)}")
    for i in by_time:
        pick(i, "next slowest step time")
    for i in range(len(looks)):  # ranks without step times, in file order
        pick(i, "no ProfilerStep in the first pass")
    return sorted(picked.items())


def _ranks_text(members: tuple[int, ...]) -> str:
    if len(members) > 2 and members == tuple(range(members[0], members[-1] + 1)):
        return f"[{members[0]}-{members[-1]}]"
    return "[" + ",".join(map(str, members[:8])) + (",..." if len(members) > 8 else "") + "]"


def uncovered_domains(looks: Sequence[FirstLook], chosen: Sequence[int]) -> list[tuple[int, ...]]:
    ranks = {looks[i].rank for i in chosen}
    return sorted({d for x in looks for d in x.domains if not ranks & set(d)})


def sample_notes(looks: Sequence[FirstLook], chosen: list[tuple[int, str]]) -> list[str]:
    """What the report says about the sample: what was read, why, and what a full pass adds."""
    n, k = len(looks), len(chosen)
    timed = [x.step_us for x in looks if x.step_us is not None]
    read = ", ".join(f"{looks[i].rank if looks[i].rank is not None else os.path.basename(looks[i].path)} ({why})"
                     for i, why in chosen[:12]) + (", ..." if k > 12 else "")  # fmt: skip
    notes = [f"sampled {k} of {n} ranks (--sample): analysed {read}"]
    if timed:
        mean = sum(timed) / len(timed)
        notes.append(f"first pass over all {n} ranks (ProfilerStep events only): mean step {mean / 1e3:,.3f} ms, "
                     f"slowest {max(timed) / 1e3:,.3f} ms, fastest {min(timed) / 1e3:,.3f} ms")  # fmt: skip
    left = uncovered_domains(looks, [i for i, _ in chosen])
    if left:
        notes.append(f"{len(left)} process group(s) have no sampled rank (K too small): "
                     + ", ".join(_ranks_text(d) for d in left[:6]))  # fmt: skip
    if k < n:
        notes.append(f"a full pass would add: the per-rank findings of the other {n - k} ranks, and imbalance, "
                     f"sync waits and stragglers measured over all {n} ranks rather than the {k} sampled")  # fmt: skip
    return notes


__all__ = ["FirstLook", "choose", "first_look", "first_pass", "sample_notes", "uncovered_domains"]
