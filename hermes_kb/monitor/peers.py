"""The slowest rank of each communication domain, found while the job runs, through the run
directory (already shared by every rank: ``hermes monitor profile`` reaches them through it). No
collective and nothing on the training thread: the monitor's background thread does it every
``every_s`` seconds.

- Each rank writes ``RUN_DIR/peers/rank<R>.json``: medians over its last observed steps (after
  warm-up, outside captures) of the step time, the communication time, the process CPU time and
  the data wait, and the domains it is in.
- The lowest rank of each domain (for ``all``, the lowest rank with a fresh summary) reads its
  members' summaries and writes ``RUN_DIR/peers/domain-<name>.json``: each rank's own work, the
  slowest rank and how far it lags the median of the others. Own work is the step less its
  communication when every member measures communication (a rank that waits in a collective
  waits for someone); else the step time when the ranks do not run in lock-step (medians more
  than 5% apart); else (lock-step, no communication measured) the CPU time plus the data wait,
  which is where the rank everyone waits for spends its step. In lock-step with communication
  measured, the larger of the two lags counts (collectives run from C++, DDP's on gloo, are not
  seen by the wrappers).
- A rank reading a verdict that names it, with a lag of at least ``lag`` of the other ranks'
  step, twice in a row, asks for a capture of itself with that reason (``pending``), at most once
  an hour per domain.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from .domains import safe_name
from .safe_read import read_small_json

SYNC_TOL = 0.05
STALE = 3.0  # a summary older than this many intervals is a rank that stopped


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2.0


def _write(path: Path, rec: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, separators=(",", ":")))
    os.replace(tmp, path)  # atomic: a reader never sees half a file


def _read(path: Path) -> dict | None:
    """A peer's summary or a domain verdict: a small regular file of JSON, else None (a FIFO, a
    device, a huge file or garbage in the board never blocks or bloats the training process)."""
    rec, _ = read_small_json(path)
    return rec if isinstance(rec, dict) else None


def verdict(domain: str, summaries: dict[int, dict], now: float) -> dict | None:
    """The slowest rank of ``domain`` from its members' summaries, or None with fewer than two."""
    ok = {r: s for r, s in summaries.items() if s.get("warm") and isinstance(s.get("wall_s"), (int, float))
          and s["wall_s"] > 0}  # fmt: skip
    if len(ok) < 2:
        return None
    walls = {r: float(s["wall_s"]) for r, s in ok.items()}
    mid = _median(list(walls.values()))
    sync = max(walls.values()) - min(walls.values()) <= SYNC_TOL * mid
    # every rank timed its collectives and some took time (all zero: issued from C++, e.g. DDP's)
    comm = all(isinstance(s.get("comm_s"), (int, float)) for s in ok.values()) and any(
        float(s["comm_s"]) > 0 for s in ok.values())
    cpu = all(isinstance(s.get("cpu_s"), (int, float)) for s in ok.values())
    measures: list[tuple[str, dict[int, float]]] = []
    if comm:
        measures.append(("step - communication", {r: walls[r] - min(float(ok[r]["comm_s"]), walls[r]) for r in ok}))
    if not sync:
        if not comm:
            measures.append(("step time", walls))
    elif cpu:
        measures.append(("CPU time + data wait", {r: float(ok[r]["cpu_s"]) + float(ok[r].get("data_wait_s") or 0.0)
                                                   for r in ok}))  # fmt: skip
    best = None
    for name, own in measures:
        slow = max(own, key=lambda r: (own[r], -r))
        others = _median([v for r, v in own.items() if r != slow])
        lag = own[slow] - others
        if best is None or lag > best[2]:
            best = (name, slow, lag, own, others)
    if best is None:
        return None
    name, slow, lag, own, others = best
    step = _median([w for r, w in walls.items() if r != slow])  # the other ranks' step
    return {"domain": domain, "time": now, "ranks": sorted(ok), "synchronized": sync, "measure": name,
            "slowest": slow, "own_s": own[slow], "others_s": others, "lag_s": lag,
            "lag_ratio": lag / step if step > 0 else 0.0, "step_s": step,
            "per_rank_own_s": {str(r): round(v, 9) for r, v in sorted(own.items())}}  # fmt: skip


class PeerBoard:
    """Owned by a Monitor; ``tick()`` runs on its background thread."""

    def __init__(self, run_dir: Path, rank: int, *, every_s: float = 5.0, lag: float = 0.10, confirm: int = 2,
                 stats: Callable[[], dict | None], domains: Callable[[], list[dict]]):  # fmt: skip
        self.dir = Path(run_dir) / "peers"
        self.rank = rank
        self.every_s = every_s
        self.lag = lag
        self.confirm = confirm
        self.stats = stats
        self.domains = domains
        self._last = float("-inf")
        self._seen: dict[str, float] = {}
        self._streak: dict[str, int] = {}
        self.pending: dict | None = None  # read and cleared by the training thread
        self.fired: dict[str, float] = {}  # domain -> when this rank last asked for a capture for it

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if now - self._last < self.every_s:
            return
        self._last = now
        mine = self.stats()
        if mine is None:
            return
        doms = self.domains() or [{"name": "all", "ranks": None}]
        self.dir.mkdir(parents=True, exist_ok=True)
        _write(self.dir / f"rank{self.rank}.json", {**mine, "rank": self.rank, "time": now,
                                                     "domains": [d["name"] for d in doms]})  # fmt: skip
        for d in doms:
            name = safe_name(d["name"])
            members = d.get("ranks")
            if members:  # a process group: its lowest rank judges
                if min(members) == self.rank:
                    sums = self._summaries(members, now, d["name"])
                    if (v := verdict(d["name"], sums, now)) is not None:
                        _write(self.dir / f"domain-{name}.json", v)
            else:  # members unknown (no torch.distributed): the lowest rank with a fresh summary judges
                ranks = self._present()
                if ranks and min(ranks) == self.rank:
                    sums = self._summaries(ranks, now, d["name"])
                    if (v := verdict(d["name"], sums, now)) is not None:
                        _write(self.dir / f"domain-{name}.json", v)
            self._judge(d["name"], _read(self.dir / f"domain-{name}.json"), now)

    def _present(self) -> list[int]:
        """Ranks with a summary in the board (names only: one directory listing)."""
        out = []
        try:
            for p in self.dir.iterdir():
                n = p.name
                if n.startswith("rank") and n.endswith(".json") and n[4:-5].isdigit():
                    out.append(int(n[4:-5]))
        except OSError:
            pass
        return out

    def _summaries(self, members: list[int], now: float, domain: str) -> dict[int, dict]:
        """Fresh summaries of ``members`` that name ``domain``."""
        out: dict[int, dict] = {}
        for r in members:
            rec = _read(self.dir / f"rank{r}.json")
            if rec is None or rec.get("rank") != r or domain not in (rec.get("domains") or []):
                continue
            if now - float(rec.get("time") or 0.0) > STALE * self.every_s:
                continue
            out[r] = rec
        return out

    def _judge(self, domain: str, v: dict | None, now: float) -> None:
        if v is None or not isinstance(v.get("time"), (int, float)) or now - v["time"] > STALE * self.every_s:
            return
        if v["time"] <= self._seen.get(domain, float("-inf")):
            return
        self._seen[domain] = v["time"]
        if v.get("slowest") != self.rank or float(v.get("lag_ratio") or 0.0) < self.lag:
            self._streak[domain] = 0
            return
        self._streak[domain] = self._streak.get(domain, 0) + 1
        if self._streak[domain] >= self.confirm and now - self.fired.get(domain, float("-inf")) >= 3600.0 \
                and self.pending is None:
            self.fired[domain] = now
            n = len(v.get("ranks") or []) - 1
            self.pending = {
                "kind": "slow_rank", "domain": domain, "verdict": v,
                "reason": (f"slowest rank of domain {domain}: its {v['measure']} is {v['own_s'] * 1e3:,.2f} ms per step "
                           f"against {v['others_s'] * 1e3:,.2f} ms for the median of the other {n} rank(s) "
                           f"(+{v['lag_ratio']:.0%} of the other ranks' {v['step_s'] * 1e3:,.2f} ms step), in "
                           f"{self._streak[domain]} verdicts in a row"),
            }  # fmt: skip


__all__ = ["PeerBoard", "verdict"]
