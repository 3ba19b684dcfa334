"""Reading monitor logs back (`hermes monitor status`): standard library only."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median


def read_rank_log(path: Path) -> dict:
    env, steps, end = None, [], None
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash: the rest of the log still counts
            kind = rec.get("type")
            if kind == "environment":
                env = rec
            elif kind == "step":
                steps.append(rec)
            elif kind == "end":
                end = rec
    return {"path": str(path), "environment": env, "steps": steps, "end": end}


def status(run_dir: Path) -> list[dict]:
    """Per rank: last step, median step time, data wait, GC, recent fluctuations."""
    out = []
    for p in sorted(run_dir.glob("rank*.jsonl")):
        log = read_rank_log(p)
        steps = log["steps"]
        walls = [s["wall_s"] for s in steps if isinstance(s.get("wall_s"), (int, float))]
        fl = [s["step"] for s in steps if s.get("fluctuation")]
        out.append({
            "rank": (log["environment"] or {}).get("rank", p.stem.removeprefix("rank")),
            "steps": len(steps),
            "last_step": steps[-1]["step"] if steps else None,
            "median_step_s": median(walls) if walls else None,
            "data_wait_ratio": (sum(s.get("data_wait_s", 0.0) for s in steps) / sum(walls)) if walls and sum(walls) else None,
            "gc_pause_ratio": (sum(s.get("gc_pause_s", 0.0) for s in steps) / sum(walls)) if walls and sum(walls) else None,
            "fluctuations": len(fl),
            "recent_fluctuations": fl[-5:],
            "finished": log["end"] is not None,
        })  # fmt: skip
    return out
