"""`hermes monitor status`: a per-rank summary of the logs, read by the same parser as advise."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from .reader import LOG_RE, read_rank_log


def status(run_dir: Path) -> list[dict]:
    """Per rank: last step, median step time, data wait, GC, recent fluctuations."""
    out = []
    for p in sorted(run_dir.glob("rank*.jsonl")):
        m = LOG_RE.match(p.name)
        if not m:
            continue
        log = read_rank_log(p, int(m.group(1)))
        walls = list(log.wall_s)
        total = sum(walls)
        fl = [s for s, f in zip(log.step, log.fluctuation) if f]
        out.append({
            "rank": (log.environment or {}).get("rank", log.rank),
            "steps": log.steps_count,
            "last_step": log.step[-1] if log.steps_count else None,
            "median_step_s": median(walls) if walls else None,
            "data_wait_ratio": sum(log.data_wait_s) / total if total else None,
            "gc_pause_ratio": sum(log.gc_pause_s) / total if total else None,
            "fluctuations": len(fl),
            "recent_fluctuations": fl[-5:],
            "finished": log.end is not None,
        })  # fmt: skip
    return out
