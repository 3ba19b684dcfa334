"""Facts from the always-on monitor's logs (a RUN_DIR of rank<R>.jsonl): the whole run, per rank
and across ranks (``monitor_facts``), the run's platform and its summary rows per rank
(``summary_of``). Formulas and thresholds: docs/analysis/monitor.md.

- ``monitor_steps``: per rank, step-time statistics and where the step goes (data wait, GC,
  the rest), after ``WARMUP`` steps (``series.py``); with ``monitor_page_faults`` and
  ``monitor_spikes``: per rank, spikes against a centred rolling median/MAD, their cost and
  period, and what they coincide with (GC, marked events, data wait) (``steps.py``);
- ``monitor_slow_rank``: per communication domain, the slowest rank and whether its excess is
  data wait or its own compute (``slow_rank.py``);
- ``monitor_cpu``: per rank, CPU use of the process, its workers, the other ranks and the
  other processes, run-queue wait, affinity and thread counts (``cpu.py``);
- ``monitor_env_setting``: per rank, environment settings known to cost performance
  (``env_settings.py``).

The monitor's own notes (``rank<R>.monitor.jsonl``: the warm-up it detected, its triggers and
their reasons, the process groups it found, how it obtained the FLOPs) set the warm-up left out,
the steps it slowed itself (captures, the FLOP-counted step: left out), the domains, and the
lines ``notes_warnings`` (``notes.py``) adds to the report.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hermes_kb.facts.base import Fact
from hermes_kb.facts.breakdown import COMPONENTS
from hermes_kb.monitor.reader import RunLog

from .cpu import cpu_fact
from .env_settings import env_facts, majority_versions
from .series import Series, device_of, read_notes, run_warmup_end, sample_median
from .slow_rank import domains_of, slow_rank_fact
from .steps import fault_fact, spike_facts, steps_fact


def monitor_facts(run: RunLog) -> list[Fact]:
    facts: list[Fact] = []
    series: dict[int, Series] = {}
    notes = read_notes(run)
    end = run_warmup_end(notes)
    waits: dict[int, float] = {}
    names = [(x.environment or {}).get("hostname") for x in run.ranks.values()]
    hosts = len(set(names)) if names and all(names) else None
    majority = majority_versions(run)
    for r in sorted(run.ranks):
        log = run.ranks[r]
        s = Series(log, notes.get(r), end)
        if len(s) == 0:
            continue
        series[r] = s
        facts.append(steps_fact(r, s, notes.get(r)))
        facts.extend(spike_facts(r, s))
        if (cpu := cpu_fact(r, log, s, run)) is not None:
            facts.append(cpu)
            if cpu.runqueue_wait_us is not None:
                waits[r] = cpu.runqueue_wait_us
        if (pf := fault_fact(r, s)) is not None:
            facts.append(pf)
        facts.extend(env_facts(r, log, s, device_of(log), hosts, majority))
    for group, ranks in domains_of(run, notes).items():
        f = slow_rank_fact(group, {r: series[r] for r in ranks if r in series}, waits)
        if f is not None:
            facts.append(f)
    return facts


def platform_of(run: RunLog) -> str:
    kinds = {device_of(log) for log in run.ranks.values()}
    return "npu" if "npu" in kinds else "gpu" if "gpu" in kinds else "cpu"


def summary_of(run: RunLog, captured: dict[int, Any] | None = None) -> list[dict[str, Any]]:
    """Per rank: steps, mean step and its breakdown over the whole run. The monitor measures the
    data wait and the GC pauses of every step, the main thread's wait for a CPU (run queue, its
    resource samples: not compute, counted as idle) and, on a rank without device times, the time
    blocked in the collectives it timed (communication); the rest of the step is split as the
    rank's capture splits its own (step_breakdown of the profiled steps, data and GC left out, the
    capture's own communication share kept), else it counts as compute (the monitor cannot see
    further)."""
    out = []
    notes = read_notes(run)
    end = run_warmup_end(notes)
    for r in sorted(run.ranks):
        log = run.ranks[r]
        s = Series(log, notes.get(r), end)
        if len(s) == 0:
            continue
        mean = float(s.wall.mean())
        data, gc = float(s.dw.mean()), float(s.gc.mean())
        bd = (captured or {}).get(r)
        rest = max(mean - data - gc, 0.0)
        rq = sample_median(log.samples, "runqueue_wait_ratio")
        cpu_wait = min(max(rq, 0.0) * mean, rest) if rq is not None else 0.0
        rest -= cpu_wait
        comm = 0.0
        if bd is None and not log.device_s and not np.isnan(s.comm).all():
            comm = min(float(np.nan_to_num(s.comm).mean()), rest)  # CPU collectives block: exposed
            rest -= comm
        parts = {k: 0.0 for k in COMPONENTS}
        measured_data = bool((s.dw > 0).any())  # a loop not wrapped in mon.wrap() records no data wait
        if bd is not None:
            w = {k: float(getattr(bd, f"{k}_us")) for k in COMPONENTS if k != "data" or not measured_data}
            w["host_python"] = max(w["host_python"] - float(bd.gc_us or 0.0), 0.0)
            tot = sum(w.values())
            for k, v in w.items():
                parts[k] = rest * v / tot if tot > 0 else 0.0
            if tot <= 0:
                parts["compute"] = rest
        else:
            parts["compute"] = rest
        parts["data"] += data
        parts["host_python"] += gc
        parts["idle"] += cpu_wait
        parts["communication"] += comm
        top = {"compute": parts["compute"], "communication": parts["communication"],
               "host": parts["host_launch"] + parts["host_dispatch"] + parts["host_python"],
               "data": parts["data"], "idle": parts["idle"]}  # fmt: skip
        crit = max(top, key=top.get)
        device = bd.device if bd is not None else None
        out.append({"rank": r, "steps_count": len(s), "mean_step_us": mean,
                    "breakdown_us": {f"{k}_us": round(v, 3) for k, v in parts.items()},
                    "critical_component": crit, "critical_ratio": round(top[crit] / mean, 4) if mean > 0 else None,
                    "device_kind": device})  # fmt: skip
    return out
