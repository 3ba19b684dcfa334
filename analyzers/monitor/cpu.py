"""``monitor_cpu``: per rank, CPU contention and threads from the monitor's resource samples: CPU
use of the process, its workers, the other ranks and the other processes, the main thread's
run-queue wait and who causes it, affinity and thread counts."""

from __future__ import annotations

from collections import defaultdict

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.monitor import MonitorCpu
from hermes_kb.monitor.reader import RankLog, RunLog

from .series import Series, sample_median


def _wait_from_others(rq_us: float | None, others: float | None, wanted: int | None,
                      usable: int | None) -> float | None:  # fmt: skip
    """Who makes the main thread wait for a CPU: cores demanded beyond the usable ones come from
    other processes (``others`` cores) and from the job's threads above its cores; the wait is
    split in that proportion. Without thread counts the job is taken to fit its cores."""
    if rq_us is None or others is None:
        return None
    own_excess = max(0.0, float(wanted - usable)) if wanted is not None and usable else 0.0
    total = others + own_excess
    if total <= 0.0:
        return 0.0
    return rq_us * others / total


def _top_others(scans: list[dict]) -> list[tuple[float, str]]:
    """The other processes that used the most cores (at least 0.05, at most 5), as (cores, name)."""
    per_proc: dict[int, list[float]] = defaultdict(list)
    names: dict[int, str] = {}
    for x in scans:
        for p in x["top_procs"]:
            if p.get("rel") == "other" and isinstance(p.get("pid"), int):
                per_proc[p["pid"]].append(float(p.get("cores", 0.0)))
                names[p["pid"]] = f"{p.get('name')} (pid {p['pid']})"
    # mean over every scan, a process outside a scan's top 5 counting 0 there
    tops = sorted(((sum(v) / len(scans), names[pid]) for pid, v in per_proc.items()), reverse=True)
    return [(c, k) for c, k in tops if c >= 0.05][:5]


def _threads(r: RankLog) -> int | None:
    """The threads a rank wants busy: its torch threads (else OMP_NUM_THREADS) and its workers."""
    t = sample_median(r.samples, "torch_threads") or (r.environment or {}).get("torch_threads")
    omp = ((r.environment or {}).get("env") or {}).get("OMP_NUM_THREADS", "")
    if t is None and str(omp).isdigit():
        t = int(omp)
    if t is None:
        return None
    return int(t) + int(sample_median(r.samples, "children_count") or 0)


def cpu_fact(rank: int, log: RankLog, s: Series, run: RunLog) -> MonitorCpu | None:
    samples = log.samples
    if not samples:
        return None
    env = log.environment or {}
    aff = env.get("affinity") if isinstance(env.get("affinity"), list) else None
    usable = len(aff) if aff else (int(u) if (u := sample_median(samples, "affinity_count")) else None)
    host = env.get("hostname")
    mates = [r for r in run.ranks.values() if (r.environment or {}).get("hostname") == host] if host else [log]
    union: set[int] = set()
    for r in mates:
        union.update((r.environment or {}).get("affinity") or [])
    proc = sample_median(samples, "process_cpu_cores")
    kids = sample_median(samples, "children_cores")
    kids_n = sample_median(samples, "children_count")
    scans = [x for x in samples if "top_procs" in x]
    tops = _top_others(scans)
    wanted = [_threads(r) for r in mates]
    wanted_sum = sum(w for w in wanted if w is not None) if all(w is not None for w in wanted) else None
    host_usable = len(union) if union else usable
    mean = float(s.wall.mean())
    rq = sample_median(samples, "runqueue_wait_ratio")
    rq = min(rq, 1.0) if rq is not None else None
    rq_us = rq * mean if rq is not None else None
    dw = float(s.dw.mean())
    sysr = sample_median(samples, "system_cpu_ratio")
    others = sample_median(scans, "others_cores")
    from_others = _wait_from_others(rq_us, others, wanted_sum, host_usable)
    own = rq_us - from_others if rq_us is not None and from_others is not None else None
    run = sample_median(samples, "main_run_ratio")
    sleep = max(mean * (1.0 - min(run, 1.0) - rq) - dw, 0.0) if run is not None and rq is not None else None
    own_stall = own
    per_core = wanted_sum / host_usable if wanted_sum is not None and host_usable else None
    mine = _threads(log)
    team = mine - int(kids_n or 0) if mine is not None else None  # torch threads: the OpenMP team
    # the sleeps are barrier waits only where there is an OpenMP team (more than one torch thread)
    # and the job's own threads outnumber its cores
    if (own is not None and sleep is not None and rq_us and not log.device_s and per_core and per_core > 1.0
            and team is not None and team > 1):
        own_stall = own + sleep * own / rq_us
    return MonitorCpu(
        rank=rank,
        samples_count=len(samples),
        machine_cores=env.get("cpu_count"),
        usable_cores=usable,
        host_usable_cores=host_usable,
        pinned=bool(usable and isinstance(env.get("cpu_count"), int) and usable < env["cpu_count"]),
        host=host,
        host_ranks_count=len(mates),
        process_cores=proc,
        children_cores=kids,
        children_count=int(kids_n) if kids_n is not None else None,
        own_busy_ratio=min(((proc or 0.0) + (kids or 0.0)) / usable, 1.0) if usable and proc is not None else None,
        system_busy_ratio=min(max(sysr, 0.0), 1.0) if sysr is not None else None,
        others_cores=others,
        siblings_cores=sample_median(scans, "siblings_cores"),
        top_other=tops[0][1] if tops else None,
        top_other_cores=tops[0][0] if tops else None,
        top_others=[f"{k}: {c:.2f} cores" for c, k in tops],
        runqueue_wait_ratio=rq,
        runqueue_wait_us=rq_us,
        data_wait_us=dw,
        wait_from_others_us=from_others,
        wait_from_own_us=own,
        main_run_ratio=min(run, 1.0) if run is not None else None,
        main_sleep_us=sleep,
        own_stall_us=own_stall,
        starved_us=(rq_us or 0.0) + dw,
        starved_ratio=min(((rq_us or 0.0) + dw) / mean, 1.0) if mean > 0 else 0.0,
        torch_threads=team,
        threads_wanted_count=wanted_sum,
        threads_per_core=per_core,
        mean_step_us=mean,
        evidence=Evidence(note=f"{len(samples)} samples, {len(scans)} process scans"),
    )
