"""Facts from the always-on monitor's logs (a RUN_DIR of rank<R>.jsonl): the whole run, per rank
and across ranks. Formulas and thresholds: docs/analysis/monitor.md.

- ``monitor_steps``: per rank, step-time statistics and where the step goes (data wait, GC,
  the rest), after ``WARMUP`` steps;
- ``monitor_spikes``: per rank, spikes against a centred rolling median/MAD, their cost and
  period, and what they coincide with (GC, marked events, data wait);
- ``monitor_slow_rank``: per communication domain, the slowest rank and whether its excess is
  data wait or its own compute;
- ``monitor_cpu``: per rank, CPU use of the process, its workers, the other ranks and the
  other processes, run-queue wait, affinity and thread counts;
- ``monitor_env_setting``: per rank, environment settings known to cost performance.

The monitor's own notes (``rank<R>.monitor.jsonl``: the warm-up it detected, its triggers and
their reasons, the process groups it found, how it obtained the FLOPs) set the warm-up left out,
the steps it slowed itself (captures, the FLOP-counted step: left out), the domains, and the
lines ``notes_warnings`` adds to the report.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.breakdown import COMPONENTS
from hermes_kb.facts.monitor import (
    MonitorCpu, MonitorEnvSetting, MonitorPageFaults, MonitorSlowRank, MonitorSpikes, MonitorSteps,
)
from hermes_kb.monitor.reader import RankLog, RunLog

WARMUP = 2  # first steps left out (with at least MIN_STEPS_FOR_WARMUP steps)
MIN_STEPS_FOR_WARMUP = 10
ROLL = 33  # centred rolling window of the spike test, in steps
SPIKE_K = 5.0
MAD_SCALE = 1.4826
MIN_REL = 0.10  # a spike is at least 10% above its rolling median (MAD can be ~0 on regular loops)
ATTRIBUTE = 0.5  # a cause explains a spike when it accounts for half its excess
WITH = 0.25  # a spike "comes with" GC / data wait when that part is a quarter of its excess
REGULAR = 0.6  # spikes are periodic when 60% of the intervals are within max(1, 10%) of the median
SYNC_TOL = 0.05  # ranks whose median steps agree within 5% synchronise every step
PAGE_BYTES = 4096  # the log does not record the page size; 4 KiB on x86-64 and most arm64 Linux
CHECKPOINT_RE = re.compile(r"ckpt|checkpoint|save", re.IGNORECASE)
GC_DEFAULT_GEN0 = 700  # CPython 3.8-3.12 (3.13: 2000)
TRUE = {"1", "true", "yes", "on"}
NOTES = "rank{rank}.monitor.jsonl"
MAX_NOTES_BYTES = 64 << 20  # a notes file larger than this is damage: the monitor writes a few lines an hour
KEEP_AFTER_WARMUP = 0.5  # a detected warm-up is used when it leaves at least half of the steps
KIND_WORDS = {"slow_step": "slow step", "slow_rank": "slowest rank", "throughput_drop": "throughput drop"}
MAX_DOMAIN_LINES = 3


def read_notes(run: RunLog) -> dict[int, list[dict]]:
    """Per rank, the records of ``rank<R>.monitor.jsonl`` from its last start (a run directory
    reused by a second run keeps the second's); damaged lines are skipped."""
    out: dict[int, list[dict]] = {}
    d = Path(run.run_dir)
    for r in run.ranks:
        p = d / NOTES.format(rank=r)
        try:
            if not p.is_file():
                continue
            with open(p, "rb") as fh:
                data = fh.read(MAX_NOTES_BYTES)
        except OSError:
            continue
        recs: list[dict] = []
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                continue
            if rec["type"] == "start":
                recs = []
            recs.append(rec)
        out[r] = recs
    return out


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) else None


def _warmup_end(notes: list[dict]) -> int | None:
    for rec in notes:
        if rec.get("type") == "warmup" and rec.get("settled") is True and (e := _int(rec.get("end_step"))) is not None:
            return e
    return None


def run_warmup_end(notes: dict[int, list[dict]]) -> int | None:
    """The last step of the run's warm-up: the latest any rank detected (ranks compared with each
    other must be compared over the same steps)."""
    ends = [e for recs in notes.values() if (e := _warmup_end(recs)) is not None]
    return max(ends) if ends else None


def _perturbed(log: RankLog, notes: list[dict]) -> set[int]:
    """Steps the monitor slowed itself: each capture's profiled steps and the step after (it
    writes the trace), and the step whose FLOPs it counted."""
    out: set[int] = set()
    for c in log.captures:
        last, n = _int(c.get("step")), _int(c.get("steps"))
        if last is None or "first_step" not in c:  # an older monitor's record: its steps are not known
            continue
        first = _int(c.get("first_step"))
        if first is None or first > last or last - first > 10_000:
            continue
        out.update(range(first, last + 2))
    for rec in notes:
        if rec.get("type") == "mfu" and (s := _int(rec.get("counted_step"))) is not None:
            out.add(s)
    return out


def _median(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else float("nan")


def _opt(v: float) -> float | None:
    return None if v is None or np.isnan(v) else float(v)


class _Series:
    """One rank's step columns as numpy arrays, warm-up steps and the steps the monitor slowed
    itself (captures, the FLOP-counted step) dropped. The warm-up is the one the monitor
    detected from the step times (its notes; ``warmup_end``: the run's, the latest of its ranks)
    when it leaves at least half of the steps, else the first ``WARMUP`` steps (with at least
    ``MIN_STEPS_FOR_WARMUP``)."""

    def __init__(self, log: RankLog, notes: list[dict] | None = None, warmup_end: int | None = None):
        n = log.steps_count
        notes = notes or []
        steps = np.asarray(log.step, dtype=np.int64)
        w = WARMUP if n >= MIN_STEPS_FOR_WARMUP else 0
        end = warmup_end if warmup_end is not None else _warmup_end(notes)
        self.detected = False
        if end is not None:
            k = int(np.searchsorted(steps, end, side="right")) if n and np.all(np.diff(steps) > 0) else None
            if k is not None and n - k >= KEEP_AFTER_WARMUP * n:
                w, self.detected = k, True
        self.warmup = w
        keep = np.zeros(n, dtype=bool)
        keep[w:] = True
        skip = _perturbed(log, notes)
        if skip:
            keep &= ~np.isin(steps, np.fromiter(skip, dtype=np.int64))
        self.excluded = int(n - w - keep.sum())

        def col(a, dtype=np.float64):
            return np.asarray(a, dtype=dtype)[keep]

        self.step = steps[keep]
        self.wall = col(log.wall_s) * 1e6
        self.dw = np.nan_to_num(col(log.data_wait_s)) * 1e6
        self.gc = np.nan_to_num(col(log.gc_pause_s)) * 1e6
        self.gen2 = col(log.gc_gen2, np.int64)
        self.cpu = col(log.cpu_s) * 1e6
        dwc = getattr(log, "data_wait_cpu_s", None)  # absent from logs older than the field
        self.dwc = (col(dwc) * 1e6 if dwc is not None and len(dwc) == n
                    else np.full(len(self.wall), np.nan))  # fmt: skip
        self.sys = col(log.sys_s) * 1e6
        self.flt = col(log.minflt)
        self.opt = col(log.optimizer_s) * 1e6
        self.opt_sys = col(log.optimizer_sys_s) * 1e6
        self.opt_flt = col(log.optimizer_minflt)
        self.sps = col(log.samples_per_s)
        self.mfu = col(log.mfu)
        self.flags = col(log.fluctuation, np.int8)
        comm = getattr(log, "comm_s", None)  # absent from readers older than the monitor's comm timing
        self.comm = (col(comm) * 1e6 if comm is not None and len(comm) == n
                     else np.full(len(self.wall), np.nan))  # fmt: skip
        first = int(self.step[0]) if len(self.step) else 0
        kept = set(self.step.tolist())
        self.events = {s: e for s, e in log.events.items() if s in kept}
        self.device = np.array([v for s, v in log.device_s.items() if s >= first and s in kept], dtype=np.float64) * 1e6

    def __len__(self) -> int:
        return len(self.wall)

    @property
    def compute(self) -> np.ndarray:
        return self.wall - self.dw - self.gc


def _mfu_note(notes: list[dict]) -> dict | None:
    """The monitor's last FLOPs record that gave a count."""
    got = [r for r in notes if r.get("type") == "mfu" and r.get("counted") is True and _num(r.get("flops_per_step"))]
    return got[-1] if got else None


def _steps_fact(rank: int, s: _Series, notes: list[dict] | None = None) -> MonitorSteps:
    total = float(s.wall.sum())
    names = sorted({k for e in s.events.values() for k in e})
    comm_ok = ~np.isnan(s.comm)
    comm = float(np.median(s.comm[comm_ok])) if comm_ok.sum() >= max(3, len(s) // 2) else None
    mfu = _median(s.mfu)
    m = _mfu_note(notes or [])
    source = None
    if m is not None:
        source = f"FLOPs: {m.get('source')}; peak: {m.get('peak_source')}"
    elif not np.isnan(mfu):
        source = "FLOPs and peak given (Monitor(flops_per_step=..., peak_flops=...))"
    return MonitorSteps(
        rank=rank,
        steps_count=len(s),
        warmup_steps_count=s.warmup,
        warmup_detected=s.detected,
        excluded_steps_count=s.excluded,
        median_us=float(np.median(s.wall)),
        mean_us=float(s.wall.mean()),
        p95_us=float(np.percentile(s.wall, 95)),
        max_us=float(s.wall.max()),
        total_us=total,
        data_wait_us=float(s.dw.mean()),
        data_wait_ratio=min(float(s.dw.sum()) / total, 1.0) if total > 0 else 0.0,
        gc_us=float(s.gc.mean()),
        gc_ratio=min(float(s.gc.sum()) / total, 1.0) if total > 0 else 0.0,
        gc_gen2_count=int(s.gen2.sum()),
        compute_us=float(np.median(s.compute)),
        comm_us=comm,
        comm_ratio=min(float(s.comm[comm_ok].sum()) / float(s.wall[comm_ok].sum()), 1.0) if comm is not None else None,
        cpu_us=_opt(_median(s.cpu)),
        device_us=_opt(_median(s.device)) if len(s.device) else None,
        samples_per_s=_opt(_median(s.sps)),
        mfu_ratio=_opt(min(mfu, 1.0)) if not np.isnan(mfu) else None,
        step_flops=_num(m.get("flops_per_step")) if m else None,
        peak_flops_per_s=_num(m.get("peak_flops")) if m else None,
        mfu_source=source,
        events=names[:20],
        online_fluctuations_count=int(s.flags.sum()),
        evidence=Evidence(note=f"steps {int(s.step[0])}-{int(s.step[-1])} of the monitor log"
                          + (f" (warm-up detected: {s.warmup} steps)" if s.detected else "")
                          + (f"; {s.excluded} step(s) the monitor slowed left out" if s.excluded else "")),
    )


def _fault_fact(rank: int, s: _Series) -> MonitorPageFaults | None:
    """Means, not medians: an allocator that returns memory every few steps faults in bursts."""
    ok = ~np.isnan(s.sys) & ~np.isnan(s.flt)
    if ok.sum() < 3:
        return None
    wall, sys_us, flt = s.wall[ok], float(s.sys[ok].mean()), float(s.flt[ok].mean())
    step = float(wall.mean())
    hooked = not np.isnan(s.opt).all()  # NaN: no step() in that step (accumulation) or no hooks
    opt = float(np.nan_to_num(s.opt[ok]).mean()) if hooked else None
    opt_sys = float(np.nan_to_num(s.opt_sys[ok]).mean()) if hooked else None
    return MonitorPageFaults(
        rank=rank, steps_count=int(ok.sum()), mean_step_us=step, faults_per_step=flt,
        faulted_mb_per_step=flt * PAGE_BYTES / 1e6, sys_us=sys_us, sys_ratio=min(sys_us / step, 1.0) if step > 0 else 0.0,
        sys_us_per_fault=sys_us / flt if flt >= 1 else None,
        optimizer_us=opt, optimizer_ratio=min(opt / step, 1.0) if opt is not None and step > 0 else None,
        optimizer_sys_us=opt_sys,
        optimizer_faults_per_step=float(np.nan_to_num(s.opt_flt[ok]).mean()) if hooked else None,
        outside_optimizer_sys_us=max(sys_us - opt_sys, 0.0) if opt_sys is not None else None,
        evidence=Evidence(note=f"steps {int(s.step[ok][0])}-{int(s.step[ok][-1])} of the monitor log; getrusage per step"),
    )  # fmt: skip


def rolling_median_mad(x: np.ndarray, window: int = ROLL) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of a centred window of ``window`` steps (shifted inside at the edges)."""
    n = len(x)
    if n <= window:
        m = float(np.median(x))
        return np.full(n, m), np.full(n, float(np.median(np.abs(x - m))))
    win = np.lib.stride_tricks.sliding_window_view(x, window)
    med = np.median(win, axis=1)
    mad = np.median(np.abs(win - med[:, None]), axis=1)
    idx = np.clip(np.arange(n) - window // 2, 0, n - window)
    return med[idx], mad[idx]


def _period(steps: np.ndarray) -> tuple[float | None, float | None]:
    if len(steps) < 3:
        return None, None
    gaps = np.diff(steps).astype(np.float64)
    p = float(np.median(gaps))
    regular = float(np.mean(np.abs(gaps - p) <= max(1.0, 0.1 * p)))
    return (p if regular >= REGULAR else None), regular


def _spike_facts(rank: int, s: _Series) -> list[MonitorSpikes]:
    n = len(s)
    if n < 3:
        return []
    med, mad = rolling_median_mad(s.wall)
    spike = s.wall > med + np.maximum(SPIKE_K * MAD_SCALE * mad, MIN_REL * med)
    excess = np.where(spike, s.wall - med, 0.0)
    idx = np.flatnonzero(spike)
    dw_med = float(np.median(s.dw))
    parts: dict[str, np.ndarray] = {
        "gc": np.minimum(s.gc, excess),
        "checkpoint": np.zeros(n),
        "marked_event": np.zeros(n),
        "data_wait": np.minimum(np.maximum(s.dw - dw_med, 0.0), excess),
    }
    pos = {int(st): i for i, st in enumerate(s.step)}
    for st, evs in s.events.items():
        i = pos.get(st)
        if i is None:
            continue
        for name, sec in evs.items():
            key = "checkpoint" if CHECKPOINT_RE.search(name) else "marked_event"
            parts[key][i] += (sec if not np.isnan(sec) else 0.0) * 1e6
    names = list(parts)
    stack = np.vstack([np.minimum(parts[k], excess) for k in names])
    best = np.argmax(stack, axis=0)
    best_val = stack[best, np.arange(n)]
    cause = np.where(best_val >= ATTRIBUTE * excess, best, len(names))  # len(names): unexplained
    total = float(s.wall.sum())
    mean = float(s.wall.mean())

    def fact(label: str, sel: np.ndarray) -> MonitorSpikes:
        ex = excess[sel]
        steps = s.step[sel]
        evs = sorted({k for st in steps for k in s.events.get(int(st), {})})
        cnt = len(sel)
        period, regular = _period(steps)
        order = sel[np.argsort(-excess[sel])][:5]
        return MonitorSpikes(
            rank=rank,
            cause=label,
            steps_count=n,
            spikes_count=cnt,
            spike_steps=[int(x) for x in steps[:10]],
            excess_us=float(ex.sum()),
            excess_per_step_us=float(ex.sum()) / n,
            excess_ratio=min(float(ex.sum()) / total, 1.0) if total > 0 else 0.0,
            mean_step_us=mean,
            largest_excess_us=float(ex.max()) if cnt else 0.0,
            period_steps=period,
            period_regularity_ratio=regular,
            with_gc_ratio=float(np.mean(s.gc[sel] >= WITH * ex)) if cnt else 0.0,
            with_gen2_ratio=float(np.mean(s.gen2[sel] > 0)) if cnt else 0.0,
            with_event_ratio=float(np.mean([int(st) in s.events for st in steps])) if cnt else 0.0,
            with_data_wait_ratio=float(np.mean(parts["data_wait"][sel] >= WITH * ex)) if cnt else 0.0,
            events=evs[:10],
            evidence=Evidence(note="largest spikes: " + ", ".join(
                f"step {int(s.step[i])} {s.wall[i] / 1e3:.1f} ms vs median {med[i] / 1e3:.1f} ms" for i in order)),
        )  # fmt: skip

    out = [fact("all", idx)]
    for c, label in enumerate([*names, "unexplained"]):
        sel = idx[cause[idx] == c]
        if len(sel):
            out.append(fact(label, sel))
    return out


SPIN_SHARE = 0.9  # process CPU time over this share of the step: the host never sleeps in it

# NCCL variables that override its own choice of algorithm, protocol, channels and buffers; NCCL's
# documentation advises leaving them unset outside debugging or a measured workaround
NCCL_TUNING = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
               "NCCL_MAX_CTAS", "NCCL_NTHREADS", "NCCL_BUFFSIZE")  # fmt: skip
# the software versions compared across the ranks of a run
VERSION_KEYS = ("torch", "cuda", "nccl", "torch_npu", "cann", "python")


def majority_versions(run) -> dict[str, str]:
    """The most common value of each VERSION_KEYS entry over the run's ranks (ties: the smallest
    string), for the keys at least two ranks record."""
    seen: dict[str, list[str]] = defaultdict(list)
    for x in run.ranks.values():
        for k, v in ((x.environment or {}).get("versions") or {}).items():
            if k in VERSION_KEYS and v not in (None, ""):
                seen[k].append(str(v))
    out = {}
    for k, vals in seen.items():
        if len(vals) >= 2:
            counts: dict[str, int] = defaultdict(int)
            for v in vals:
                counts[v] += 1
            out[k] = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return out


def _env_facts(rank: int, log: RankLog, s: _Series, device: str, hosts: int | None = None,
               majority: dict[str, str] | None = None) -> list[MonitorEnvSetting]:  # fmt: skip
    """``hosts``: distinct hostnames of the run's ranks (None when not recorded); ``majority``:
    the versions most ranks of the run record (majority_versions)."""
    env = log.environment or {}
    var = {str(k): str(v) for k, v in (env.get("env") or {}).items()}
    step = float(s.wall.mean())
    cpu = _median(s.cpu)
    cpu_ok = not np.isnan(cpu)
    host = min(cpu, float(np.median(s.wall))) if cpu_ok else 0.0
    found: list[tuple[str, str, str, float]] = []  # issue, variable, value, bound
    for name in ("CUDA_LAUNCH_BLOCKING", "ASCEND_LAUNCH_BLOCKING"):
        if var.get(name, "").strip().lower() in TRUE:
            busy = float(np.median(s.wall - s.dw))
            rest = busy - host
            bound = max(min(host, rest), 0.0)
            if cpu_ok and host >= SPIN_SHARE * busy:
                # the driver spin-waits inside each blocking launch (CUDA's default with one busy
                # context), so the CPU time holds the device's time too and cannot split the step
                # into host and device work: min(host, device) is then only known to be at most
                # half of their sum (a recorded H200 run: CPU 99% of the step)
                bound = busy / 2.0
            found.append(("launch_blocking", name, var[name], bound))
    debug = {
        "NCCL_DEBUG": lambda v: v.upper() in ("INFO", "TRACE"),
        "TORCH_LOGS": lambda v: bool(v.strip()),
        "TORCH_DISTRIBUTED_DEBUG": lambda v: v.upper() in ("INFO", "DETAIL"),
        "TORCH_CPP_LOG_LEVEL": lambda v: v.upper() in ("INFO", "0"),
        "ASCEND_GLOBAL_LOG_LEVEL": lambda v: v.strip() in ("0", "1", "2"),
        "HCCL_DEBUG": lambda v: v.upper() in ("INFO", "TRACE", "1"),
    }
    for name, bad in debug.items():
        if name in var and bad(var[name]):
            found.append(("debug_logging", name, var[name], host))
    # the collectives' time per step bounds what a faster transport can give back: peer-to-peer
    # matters inside a node, InfiniBand only between nodes (a run on one host never uses it)
    comm_ok = ~np.isnan(s.comm)
    comm = float(np.median(s.comm[comm_ok])) if comm_ok.sum() >= max(3, len(s) // 2) else 0.0
    multi = hosts is not None and hosts > 1
    bounds = {"p2p_disabled": comm, "ib_disabled": comm if multi else 0.0}
    for name, issue in (("NCCL_P2P_DISABLE", "p2p_disabled"), ("NCCL_IB_DISABLE", "ib_disabled"),
                        ("HCCL_INTRA_ROCE_ENABLE", "hccl_intra_link_forced"),
                        ("HCCL_INTRA_PCIE_ENABLE", "hccl_intra_link_forced")):  # fmt: skip
        if var.get(name, "").strip().lower() in TRUE:
            found.append((issue, name, var[name], bounds.get(issue, 0.0)))
    tuned = [n for n in NCCL_TUNING if var.get(n, "").strip()]
    if tuned:
        found.append(("nccl_tuning_overridden", ",".join(tuned), ",".join(f"{n}={var[n].strip()}" for n in tuned), comm))
    for name in ("NCCL_NET_GDR_LEVEL", "NCCL_IB_GDR_LEVEL"):  # LOC (0): never GPUDirect RDMA
        if var.get(name, "").strip().upper() in ("LOC", "0"):
            found.append(("gdr_disabled", name, var[name], comm if multi else 0.0))
            break
    mine = {k: str(v) for k, v in ((env.get("versions") or {}).items()) if k in VERSION_KEYS and v not in (None, "")}
    differ = sorted(k for k, v in (majority or {}).items() if k in mine and mine[k] != v)
    if differ:
        found.append(("versions_differ", ",".join(differ),
                      "; ".join(f"{k} {mine[k]} (most ranks {majority[k]})" for k in differ), 0.0))  # fmt: skip
    omp = var.get("OMP_NUM_THREADS", "")
    usable = len(env["affinity"]) if isinstance(env.get("affinity"), list) else env.get("cpu_count")
    if omp.isdigit() and isinstance(usable, int) and int(omp) > usable:
        found.append(("omp_threads_too_high", "OMP_NUM_THREADS", omp, 0.0))
    th = env.get("gc_thresholds")
    if (isinstance(th, list) and th and isinstance(th[0], int) and 0 < th[0] < GC_DEFAULT_GEN0):
        found.append(("gc_threshold_lowered", "gc.set_threshold", ",".join(map(str, th)), float(s.gc.mean())))
    return [
        MonitorEnvSetting(rank=rank, issue=i, variable=v, value=val, device=device, step_us=step,
                          cpu_us=cpu if cpu_ok else None, hidden_bound_us=b,
                          share_ratio=min(b / step, 1.0) if step > 0 else 0.0)  # fmt: skip
        for i, v, val, b in found
    ]


def _device(log: RankLog) -> str:
    versions = (log.environment or {}).get("versions") or {}
    if "torch_npu" in versions:
        return "npu"
    if log.device_s or "nccl" in versions:
        return "gpu"
    return "cpu"


def _sample_median(samples: list[dict], key: str) -> float | None:
    vals = [float(x[key]) for x in samples if isinstance(x.get(key), (int, float)) and not isinstance(x.get(key), bool)]
    return float(np.median(vals)) if vals else None


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


def _cpu_fact(rank: int, log: RankLog, s: _Series, run: RunLog) -> MonitorCpu | None:
    samples = log.samples
    if not samples:
        return None
    env = log.environment or {}
    aff = env.get("affinity") if isinstance(env.get("affinity"), list) else None
    usable = len(aff) if aff else (int(u) if (u := _sample_median(samples, "affinity_count")) else None)
    host = env.get("hostname")
    mates = [r for r in run.ranks.values() if (r.environment or {}).get("hostname") == host] if host else [log]
    union: set[int] = set()
    for r in mates:
        union.update((r.environment or {}).get("affinity") or [])
    proc = _sample_median(samples, "process_cpu_cores")
    kids = _sample_median(samples, "children_cores")
    kids_n = _sample_median(samples, "children_count")
    scans = [x for x in samples if "top_procs" in x]
    per_proc: dict[int, list[float]] = defaultdict(list)
    names: dict[int, str] = {}
    for x in scans:
        for p in x["top_procs"]:
            if p.get("rel") == "other" and isinstance(p.get("pid"), int):
                per_proc[p["pid"]].append(float(p.get("cores", 0.0)))
                names[p["pid"]] = f"{p.get('name')} (pid {p['pid']})"
    # mean over every scan, a process outside a scan's top 5 counting 0 there
    tops = sorted(((sum(v) / len(scans), names[pid]) for pid, v in per_proc.items()), reverse=True)
    tops = [(c, k) for c, k in tops if c >= 0.05][:5]

    def threads(r: RankLog) -> int | None:
        t = _sample_median(r.samples, "torch_threads") or (r.environment or {}).get("torch_threads")
        omp = ((r.environment or {}).get("env") or {}).get("OMP_NUM_THREADS", "")
        if t is None and str(omp).isdigit():
            t = int(omp)
        if t is None:
            return None
        return int(t) + int(_sample_median(r.samples, "children_count") or 0)

    wanted = [threads(r) for r in mates]
    wanted_sum = sum(w for w in wanted if w is not None) if all(w is not None for w in wanted) else None
    host_usable = len(union) if union else usable
    mean = float(s.wall.mean())
    rq = _sample_median(samples, "runqueue_wait_ratio")
    rq = min(rq, 1.0) if rq is not None else None
    rq_us = rq * mean if rq is not None else None
    dw = float(s.dw.mean())
    sysr = _sample_median(samples, "system_cpu_ratio")
    others = _sample_median(scans, "others_cores")
    from_others = _wait_from_others(rq_us, others, wanted_sum, host_usable)
    own = rq_us - from_others if rq_us is not None and from_others is not None else None
    run = _sample_median(samples, "main_run_ratio")
    sleep = max(mean * (1.0 - min(run, 1.0) - rq) - dw, 0.0) if run is not None and rq is not None else None
    own_stall = own
    per_core = wanted_sum / host_usable if wanted_sum is not None and host_usable else None
    mine = threads(log)
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
        siblings_cores=_sample_median(scans, "siblings_cores"),
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


def _domains(run: RunLog, notes: dict[int, list[dict]] | None = None) -> dict[str, list[int]]:
    """Communication domains: the process groups the monitor found in torch.distributed (its
    notes: every member, the ranks without a log left out), the names given with
    ``Monitor(domains=...)``, else every rank of the run (``all``)."""
    groups: dict[str, set[int]] = defaultdict(set)
    for r, log in run.ranks.items():
        for d in (log.environment or {}).get("domains") or []:
            groups[str(d)].add(r)
    for r, recs in (notes or {}).items():
        found = [x for x in recs if x.get("type") == "domains" and isinstance(x.get("domains"), list)]
        for d in found[-1]["domains"] if found else []:
            if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                continue
            ranks = [x for x in d.get("ranks") or [] if isinstance(x, int) and x in run.ranks]
            groups[d["name"]].update(ranks or [r])
    if not groups:
        groups["all"] = set(run.ranks)
    return {g: sorted(rs) for g, rs in groups.items()}


def _slow_rank(group: str, series: dict[int, _Series], rq_us: dict[int, float] | None = None) -> MonitorSlowRank | None:
    ranks = sorted(series)
    if len(ranks) < 2:
        return None
    wall = {r: float(np.median(series[r].wall)) for r in ranks}
    dw = {r: float(np.median(series[r].dw)) for r in ranks}
    comp = {r: float(np.median(series[r].compute)) for r in ranks}
    cpu = {r: _median(series[r].cpu) for r in ranks}
    # a loader without workers prepares the batch in the process: the CPU time of the data wait
    # is in the step's CPU time too, and the data wait is counted apart (d below), so the
    # compute comparison takes it out when every rank recorded it (monitor.wrap)
    dwc = {r: _median(series[r].dwc) for r in ranks}
    if all(not np.isnan(v) for v in dwc.values()):
        cpu = {r: cpu[r] - min(dwc[r], cpu[r]) if not np.isnan(cpu[r]) else cpu[r] for r in ranks}
    comm = {r: _median(series[r].comm) for r in ranks}
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
            co = _median(np.array([cpu[o] for o in others]))
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


def monitor_facts(run: RunLog) -> list[Fact]:
    facts: list[Fact] = []
    series: dict[int, _Series] = {}
    notes = read_notes(run)
    end = run_warmup_end(notes)
    waits: dict[int, float] = {}
    names = [(x.environment or {}).get("hostname") for x in run.ranks.values()]
    hosts = len(set(names)) if names and all(names) else None
    majority = majority_versions(run)
    for r in sorted(run.ranks):
        log = run.ranks[r]
        s = _Series(log, notes.get(r), end)
        if len(s) == 0:
            continue
        series[r] = s
        facts.append(_steps_fact(r, s, notes.get(r)))
        facts.extend(_spike_facts(r, s))
        if (cpu := _cpu_fact(r, log, s, run)) is not None:
            facts.append(cpu)
            if cpu.runqueue_wait_us is not None:
                waits[r] = cpu.runqueue_wait_us
        if (pf := _fault_fact(r, s)) is not None:
            facts.append(pf)
        facts.extend(_env_facts(r, log, s, _device(log), hosts, majority))
    for group, ranks in _domains(run, notes).items():
        f = _slow_rank(group, {r: series[r] for r in ranks if r in series}, waits)
        if f is not None:
            facts.append(f)
    return facts


def platform_of(run: RunLog) -> str:
    kinds = {_device(log) for log in run.ranks.values()}
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
    names = [(x.environment or {}).get("hostname") for x in run.ranks.values()]
    hosts = len(set(names)) if names and all(names) else None
    majority = majority_versions(run)
    for r in sorted(run.ranks):
        log = run.ranks[r]
        s = _Series(log, notes.get(r), end)
        if len(s) == 0:
            continue
        mean = float(s.wall.mean())
        data, gc = float(s.dw.mean()), float(s.gc.mean())
        bd = (captured or {}).get(r)
        rest = max(mean - data - gc, 0.0)
        rq = _sample_median(log.samples, "runqueue_wait_ratio")
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


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def notes_warnings(run: RunLog, notes: dict[int, list[dict]] | None = None) -> list[str]:
    """What the monitor decided by itself, for the report's warnings: each automatic capture with
    its reason and what it held; triggers that asked for a capture and did not get one (one line
    per rank and kind); a warm-up that never settled; how the FLOPs and the peak behind MFU were
    obtained and the domains found (one line for all ranks that share it)."""
    notes = read_notes(run) if notes is None else notes
    out: list[str] = []
    shared: dict[str, list[int]] = defaultdict(list)
    for r in sorted(notes):
        recs = notes[r]
        got = {x.get("id"): x for x in recs if x.get("type") == "captured"}
        taken: set[str] = set()
        for t in recs:
            if t.get("type") != "trigger" or t.get("captured") is not True:
                continue
            kind = str(t.get("kind"))
            c = got.get(t.get("id"))
            line = f"monitor: rank {r}: automatic capture ({KIND_WORDS.get(kind, kind)}): {t.get('reason')}"
            if c is None:
                line += "; the capture did not run (the run ended first)"
            elif c.get("error"):
                line += f"; the capture failed: {c['error']}"
            else:
                a, b = _int(c.get("first_step")), _int(c.get("last_step"))
                line += f"; captured steps {a}-{b}" if a is not None and b is not None else "; captured"
                sl, w, ref = _int(c.get("slowest_step")), _num(c.get("slowest_s")), _num(c.get("others_median_s"))
                if kind == "slow_step" and sl is not None and w and ref:
                    held = "held" if c.get("caught") else "missed the slow step: its slowest was"
                    line += f", which {held} step {sl} ({w * 1e3:,.1f} ms against {ref * 1e3:,.1f} ms for the others)"
                if c.get("trace"):
                    line += f" ({Path(str(c['trace'])).name})"
            out.append(line)
            taken.add(kind)
        refused: dict[str, list[dict]] = defaultdict(list)
        for t in recs:
            if t.get("type") == "trigger" and t.get("captured") is False and (t.get("kind") != "slow_step" or t.get("plan")):
                refused[str(t.get("kind"))].append(t)
        for kind, ts in refused.items():
            if kind in taken:
                continue
            more = f" ({len(ts) - 1} more like it)" if len(ts) > 1 else ""
            out.append(f"monitor: rank {r}: {KIND_WORDS.get(kind, kind)} not captured ({ts[0].get('why_not')}): "
                       f"{ts[0].get('reason')}{more}")  # fmt: skip
        for w in recs:
            if w.get("type") == "warmup" and w.get("settled") is False:
                out.append(f"monitor: rank {r}: {w.get('reason')} (end at step {w.get('end_step')})")
        m = _mfu_note(recs)
        if m is not None:
            shared[f"monitor: MFU from FLOPs: {m.get('source')}, {_num(m.get('flops_per_step')) or 0:,.4g} per step; "
                   f"peak: {m.get('peak_source')}"].append(r)  # fmt: skip
        else:
            why = [x for x in recs if x.get("type") == "mfu" and x.get("counted") is False]
            if why:
                shared[f"monitor: no MFU: {why[-1].get('reason')}"].append(r)
        doms = [x for x in recs if x.get("type") == "domains"]
        if doms and isinstance(doms[-1].get("domains"), list):
            ds = [d for d in doms[-1]["domains"] if isinstance(d, dict)]
            text = "; ".join(f"{d.get('name')} ({_ranks_text([x for x in d.get('ranks') or [] if isinstance(x, int)])}, "
                             f"{d.get('backend')})" for d in ds)  # fmt: skip
            comm = "; ".join(str(x) for x in doms[-1].get("comm") or [])
            shared[f"monitor: domains found in torch.distributed: {text or 'none of 2 ranks or more'}"
                   + (f"; time in collectives measured by {comm}" if comm else "")].append(r)
    doms = 0
    for text, ranks in shared.items():
        if "domains found" in text:
            doms += 1
            if doms > MAX_DOMAIN_LINES:  # a large job has one layout per group of ranks: a few are enough
                continue
        out.append(text.replace("monitor: ", f"monitor: {_ranks_text(ranks)}: ", 1))
    if doms > MAX_DOMAIN_LINES:
        out.append(f"monitor: {doms - MAX_DOMAIN_LINES} more layouts of process groups on the other ranks "
                   f"(`hermes analyze RUN_DIR -k monitor_slow_rank` lists every domain)")  # fmt: skip
    return list(dict.fromkeys(out))


def step_series(log) -> list[tuple[int, float, str | None, float | None]]:
    """A rank log's steps after warm-up as (step, µs, spike cause or None, excess µs or None):
    spikes by this analyzer's own test and attribution (rolling median and MAD, the largest of
    GC, checkpoint, marked events, data wait explaining half the excess). The HTML report's
    step chart."""
    s = _Series(log)
    n = len(s)
    if n == 0:
        return []
    spike = np.zeros(n, dtype=bool)
    excess = np.zeros(n)
    cause = np.full(n, None, dtype=object)
    if n >= 3:
        med, mad = rolling_median_mad(s.wall)
        spike = s.wall > med + np.maximum(SPIKE_K * MAD_SCALE * mad, MIN_REL * med)
        excess = np.where(spike, s.wall - med, 0.0)
        dw_med = float(np.median(s.dw))
        parts = {"gc": np.minimum(s.gc, excess), "checkpoint": np.zeros(n), "marked_event": np.zeros(n),
                 "data_wait": np.minimum(np.maximum(s.dw - dw_med, 0.0), excess)}  # fmt: skip
        pos = {int(st): i for i, st in enumerate(s.step)}
        for st, evs in s.events.items():
            i = pos.get(st)
            if i is None:
                continue
            for name, sec in evs.items():
                key = "checkpoint" if CHECKPOINT_RE.search(name) else "marked_event"
                parts[key][i] += (sec if not np.isnan(sec) else 0.0) * 1e6
        names = list(parts)
        stack = np.vstack([np.minimum(parts[k], excess) for k in names])
        best = np.argmax(stack, axis=0)
        best_val = stack[best, np.arange(n)]
        for i in np.flatnonzero(spike):
            cause[i] = names[best[i]] if best_val[i] >= ATTRIBUTE * excess[i] else "unexplained"
    return [(int(s.step[i]), float(s.wall[i]), cause[i], float(excess[i]) if spike[i] else None) for i in range(n)]
