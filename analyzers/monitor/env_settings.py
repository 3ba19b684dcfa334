"""``monitor_env_setting``: per rank, the environment settings known to cost performance that
the monitor recorded (blocking launches, debug logging, NCCL / HCCL transports disabled or tuned
by hand, GPUDirect RDMA off, versions that differ from most ranks, OpenMP threads above the usable
cores, a lowered GC threshold), each with a bound on what it may cost."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hermes_kb.facts.monitor import MonitorEnvSetting
from hermes_kb.monitor.reader import RankLog

from .series import Series, nan_median

GC_DEFAULT_GEN0 = 700  # CPython 3.8-3.12 (3.13: 2000)
TRUE = {"1", "true", "yes", "on"}
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


def env_facts(rank: int, log: RankLog, s: Series, device: str, hosts: int | None = None,
               majority: dict[str, str] | None = None) -> list[MonitorEnvSetting]:  # fmt: skip
    """``hosts``: distinct hostnames of the run's ranks (None when not recorded); ``majority``:
    the versions most ranks of the run record (majority_versions)."""
    env = log.environment or {}
    var = {str(k): str(v) for k, v in (env.get("env") or {}).items()}
    step = float(s.wall.mean())
    cpu = nan_median(s.cpu)
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
