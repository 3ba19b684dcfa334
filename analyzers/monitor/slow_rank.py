"""``monitor_slow_rank``: per communication domain (the process groups the monitor found, the
domains given to it, else the whole run), the slowest rank and whether its excess is data wait or
its own compute."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.monitor import MonitorSlowRank
from hermes_kb.monitor.reader import RunLog

from .series import Series, nan_median

SYNC_TOL = 0.05  # ranks whose median steps agree within 5% synchronise every step


def domains_of(run: RunLog, notes: dict[int, list[dict]] | None = None) -> dict[str, list[int]]:
    """Communication domains: the process groups the monitor found in torch.distributed (its
    notes: every member, the ranks without a log left out), the names given with
    ``Monitor(domains=...)``, else every rank of the run (``all``)."""
    groups: dict[str, set[int]] = defaultdict(set)
    for r, log in run.ranks.items():
        named = (log.environment or {}).get("domains")
        for d in named if isinstance(named, list) else []:
            groups[str(d)].add(r)
    for r, recs in (notes or {}).items():
        found = [x for x in recs if x.get("type") == "domains" and isinstance(x.get("domains"), list)]
        for d in found[-1]["domains"] if found else []:
            if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                continue
            listed = d.get("ranks") if isinstance(d.get("ranks"), list) else []
            ranks = [x for x in listed if isinstance(x, int) and x in run.ranks]
            groups[d["name"]].update(ranks or [r])
    if not groups:
        groups["all"] = set(run.ranks)
    return {g: sorted(rs) for g, rs in groups.items()}


def slow_rank_fact(group: str, series: dict[int, Series], rq_us: dict[int, float] | None = None) -> MonitorSlowRank | None:
    ranks = sorted(series)
    if len(ranks) < 2:
        return None
    wall = {r: float(np.median(series[r].wall)) for r in ranks}
    dw = {r: float(np.median(series[r].dw)) for r in ranks}
    comp = {r: float(np.median(series[r].compute)) for r in ranks}
    cpu = {r: nan_median(series[r].cpu) for r in ranks}
    # a loader without workers prepares the batch in the process: the CPU time of the data wait
    # is in the step's CPU time too, and the data wait is counted apart (d below), so the
    # compute comparison takes it out when every rank recorded it (monitor.wrap)
    dwc = {r: nan_median(series[r].dwc) for r in ranks}
    if all(not np.isnan(v) for v in dwc.values()):
        cpu = {r: cpu[r] - min(dwc[r], cpu[r]) if not np.isnan(cpu[r]) else cpu[r] for r in ranks}
    comm = {r: nan_median(series[r].comm) for r in ranks}
    # timed: every rank timed its collectives and some took time. All zero means the job's
    # collectives were issued where the monitor does not see them (DDP's, from C++): "step less
    # communication" would then be the whole step, waits included
    timed = all(not np.isnan(v) for v in comm.values()) and any(v > 0 for v in comm.values())
    mid = float(np.median(list(wall.values())))
    sync = (max(wall.values()) - min(wall.values())) <= SYNC_TOL * mid
    own = {r: float(np.median(series[r].compute - series[r].comm)) for r in ranks} if timed else {}

    def parts(r: int) -> tuple[float, float, str]:
        others = [o for o in ranks if o != r]
        d = max(dw[r] - float(np.median([dw[o] for o in others])), 0.0)
        got: list[tuple[float, str]] = []
        if timed:
            # a rank waiting in a collective waits for someone: its own work is the rest
            got.append((own[r] - float(np.median([own[o] for o in others])), "communication"))
        if not sync and not timed:
            got.append((comp[r] - float(np.median([comp[o] for o in others])), "step"))
        if sync:
            # synchronised: the others' compute includes waiting for this rank, so compare the
            # CPU time the ranks burn per step, converted to wall time at this rank's own rate
            # (also with collectives timed: those issued from C++, DDP's on gloo, are not seen)
            co = nan_median(np.array([cpu[o] for o in others]))
            ok = not np.isnan(cpu[r]) and not np.isnan(co) and cpu[r] > co > 0
            got.append((comp[r] * (1 - co / cpu[r]) if ok else 0.0, "cpu"))
        c, how = max(got)
        return d, max(c, 0.0), how

    excess = {r: parts(r) for r in ranks}
    slow = max(ranks, key=lambda r: (excess[r][0] + excess[r][1], wall[r]))
    d, c, how = excess[slow]
    total = d + c
    step = max(wall.values())
    waits = {r: v for r, v in (rq_us or {}).items() if r in series}
    cpu_wait = None
    if slow in waits and len(waits) >= 2:
        cpu_wait = min(max(waits[slow] - float(np.median([v for r, v in waits.items() if r != slow])), 0.0), c)

    def top(vals: dict[int, float]) -> dict[int, float]:
        return dict(sorted(((r, v) for r, v in vals.items() if not np.isnan(v)), key=lambda kv: -kv[1])[:10])

    note = f"medians per rank over the monitored steps; ranks {ranks}"
    if timed:
        note += "; own work = step - data wait - GC - time in collectives"
    return MonitorSlowRank(
        rank=slow,
        group=group,
        ranks_count=len(ranks),
        steps_count=min(len(series[r]) for r in ranks),
        synchronized=sync,
        per_rank_step_us=top(wall),
        per_rank_data_wait_us=top(dw),
        per_rank_cpu_us=top(cpu),
        per_rank_comm_us=top(comm) if timed else {},
        step_us=step,
        others_step_us=float(np.median([wall[o] for o in ranks if o != slow])),
        data_wait_excess_us=d,
        compute_excess_us=c,
        excess_us=total,
        excess_ratio=min(total / step, 1.0) if step > 0 else 0.0,
        cause="data_wait" if d >= c else "compute",
        data_share_ratio=d / total if total > 0 else 0.0,
        measure=how,
        cpu_wait_excess_us=cpu_wait,
        evidence=Evidence(note=note),
    )
