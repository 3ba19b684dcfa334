#!/usr/bin/env python3
"""Measure, from the raw files alone, what holds a training step in the real traces.

This script is deliberately independent of hermes: it imports nothing from the project
(standard library only: json, gzip, csv, sqlite3) so that the expectations written from its
output (benchmarks/real_traces/expectations.yaml) are not shaped by hermes' own parsing or rules.
Run it as::

    python benchmarks/real_traces/measure.py                 # every trace under /work/shared/data
    python benchmarks/real_traces/measure.py --json out.json # also dump all numbers
    python benchmarks/real_traces/measure.py kineto_2021     # only paths containing a word

Definitions (all times in microseconds; every interval is clipped to the step window)
===================================================================================

Kineto (PyTorch profiler JSON, plain or gzip)
---------------------------------------------
* Step windows: host-side ``ProfilerStep#N`` events. In the 2021 schema these are ``Operator``
  events (capitalised categories), otherwise ``user_annotation`` (``cpu_op`` in torch_npu
  trace_view.json). ``gpu_user_annotation`` copies are ignored. When a trace has no ProfilerStep,
  this is reported (``steps_source: whole-span``) and the whole span of the trace (first event
  start to last event end, all ``ph == 'X'`` events except the ``Trace`` marker) is one window.
* Main thread: the thread holding the ProfilerStep events; without steps, the host thread with
  the largest total ``cpu_op``/``Operator`` time. The host process is the main thread's pid.
* GPU activity: events of category kernel / gpu_memcpy / gpu_memset (2021: Kernel / Memcpy /
  Memset). ``gpu_busy`` = length of the union of all GPU activity intervals in the window.
* Communication kernels: kernels whose name contains ``nccl`` or ``rccl`` (case-insensitive).
  ``comm`` = union of their intervals; ``compute`` = union of all other GPU activity (kernels,
  memcpy, memset). ``comm_exposed`` = comm minus compute (communication with no other GPU activity
  at the same moment); ``overlap`` = comm intersect compute.
* ``gpu_idle`` = window length - gpu_busy.
* DataLoader: host events on the main thread whose name contains ``enumerate(DataLoader)``;
  ``dataloader`` = union of them in the window.
* Host coverage: union of host events on the main thread of category cpu_op / Operator
  (except ProfilerStep itself) / cuda_runtime / cuda_driver / Runtime. ``user_annotation`` ranges
  (record_function blocks such as ``## forward ##``) are not CPU ops and do not count.
  ``untraced_main`` = window - that union (Python and anything else the profiler did not record).
  ``python_function`` events (with_stack traces) are NOT counted as coverage, so traces with and
  without Python tracing are measured the same way.
* Step decomposition (these four add up to the window length):
    - ``compute``            : GPU busy with non-communication work;
    - ``comm_exposed``       : GPU busy only with communication kernels;
    - ``data_wait``          : GPU idle while the main thread is inside ``enumerate(DataLoader)``;
    - ``host_wait``          : GPU idle otherwise (the device waits for the host: kernel launch,
                               operator dispatch, Python, synchronisation round trips).
  ``host_wait`` is further split into the part where the main thread is inside a launch call,
  inside any other traced host event, or untraced (``host_wait_untraced``).
* Launch calls: cuda_runtime / cuda_driver / Runtime events of the host process whose name contains
  ``Launch`` (cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC, hipLaunchKernel,
  cudaGraphLaunch, hipExtModuleLaunchKernel ...): count and summed duration.
* Synchronisation calls: cudaDeviceSynchronize / cudaStreamSynchronize / cudaEventSynchronize
  (and the hip* equivalents) in the host process: count and summed duration.
* Kernels: count of kernels starting in the window and their median duration.
* A step's ``shares`` divide the four decomposition parts by the window length; a trace reports the
  mean over its steps (and the mean step time). The first profiled step is kept (all windows are
  profiled "active" steps, so there is no warm-up to drop).
* Suggested dominant component: the largest share among compute / communication (exposed) /
  data / host if it is > 0.40 of the step and at least 1.5x the next one, else ``unclear``.
  This is only a suggestion printed to help a human; expectations.yaml is written by hand.
* CPU-only traces (no GPU activity): main-thread op time (union of cpu_op / user_annotation other
  than ProfilerStep), gaps (window minus that) and DataLoader time.

* Steady state (supplement, only for traces without ProfilerStep): windows between the starts of
  consecutive ``enumerate(DataLoader)`` (else ``Optimizer.zero_grad``, else ``Optimizer.step``)
  events on the main thread, the first window dropped (it holds warm-up: CUDA context, cuDNN
  autotuning, DataLoader worker start). Same decomposition; reported beside the whole-span one.
* Where the host was during ``host_wait`` (``-v``): every host event of the main process (any
  thread) is intersected with the host-wait time and summed by name (nested events each counted).
* Kernel mix (``-v``): share of GEMM/conv kernel time whose names mark fp32 SIMT math
  (sgemm, scudnn, ``<float`` templates, rocBLAS ``_SB_``), and the top kernels by time.

Multi-rank Kineto jobs (a directory of per-rank traces): each rank is measured as above, then
per-rank means of the shares are reported, plus the spread of step time and of compute time
across ranks (max/min), which shows stragglers. Communication kernels are matched across ranks
(k-th kernel of the same name = one collective); the shortest duration over the ranks stands for
the transfer, each rank's excess over it for waiting on the last rank to arrive.

Ascend (torch_npu profiler output, ``*_ascend_pt`` directories)
--------------------------------------------------------------
* ``ASCEND_PROFILER_OUTPUT/step_trace_time.csv`` (text export) or the ``StepTraceTime`` table of
  ``analysis.db`` (db export; opened read-only with ``?mode=ro&immutable=1``) gives per rank and
  step: Computing, Communication(Not Overlapped), Overlapped, Communication, Free, Stage (the step
  length on the device), Bubble, Preparing. Shares are those columns divided by Stage; ``comm
  exposed`` is Communication(Not Overlapped). Preparing is reported but not part of Stage's split
  (Computing + Communication(Not Overlapped) + Free == Stage).
* Cross-check: in ``trace_view.json`` the ``Overlap Analysis`` process has rows Computing,
  Communication(Not Overlapped), Free; their summed durations must agree with the csv.
  For the db export the same comes from the ``OVERLAP_ANALYSIS`` table (type 0 computing,
  1 communication, 2 communication not overlapped, 3 free) when present.
* ``communication.json`` / ``CommAnalyzerTime``: per collective, elapse / transit / wait /
  synchronization / idle time (ms). Summed per rank: how much of the communication time is data
  transit, waiting for the peer ranks (wait = sync waiting = a straggler signal), or idle.
* Jobs: every rank of a job directory; per-rank means and the cross-rank spread
  (max - min of Computing, of Communication(Not Overlapped), of Free).
* msprof-analyze's own printed numbers (``../ascend_advisor_outputs/*_terminal.txt``) are parsed
  for the "Overall Summary" and "slow rank" lines and printed next to ours for comparison.
* A cluster ``cluster_step_trace_time.csv`` (msprof-analyze cluster output) is read the same way,
  one row per rank.
"""
from __future__ import annotations

import argparse
import bisect
import csv
import glob
import gzip
import json
import os
import re
import sqlite3
import statistics
import sys

DATA_ROOT = "/work/shared/data"
VERBOSE = False

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
KERNEL_CATS = {"kernel"}
HOST_OP_CATS = {"cpu_op", "operator", "cuda_runtime", "cuda_driver", "runtime"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
SYNC_NAMES = {
    "cudadevicesynchronize", "cudastreamsynchronize", "cudaeventsynchronize",
    "hipdevicesynchronize", "hipstreamsynchronize", "hipeventsynchronize",
}


# ----------------------------------------------------------------------------- intervals
def union(iv):
    """Merge a list of (start, end) into sorted disjoint intervals."""
    out = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(iv):
    return sum(e - s for s, e in iv)


def intersect(a, b):
    """Intersection of two merged interval lists."""
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b):
    """a minus b, both merged."""
    out = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(iv, w0, w1):
    return [(max(s, w0), min(e, w1)) for s, e in iv if e > w0 and s < w1]


# ----------------------------------------------------------------------------- kineto
def load_json(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def measure_kineto(path):
    data = load_json(path)
    events = data.get("traceEvents") or []
    xs = []
    for e in events:
        if e.get("ph") != "X":
            continue
        ts, dur = _f(e.get("ts")), _f(e.get("dur"))
        if ts is None or dur is None:
            continue
        cat = str(e.get("cat") or "").lower()
        if cat == "trace":
            continue
        xs.append((cat, str(e.get("name") or ""), e.get("pid"), e.get("tid"), ts, ts + dur))
    res = {"path": path, "kind": "kineto", "events": len(xs)}
    dev = data.get("deviceProperties") or []
    if dev:
        res["device"] = dev[0].get("name")
    di = data.get("distributedInfo") or {}
    if di:
        res["rank"] = di.get("rank")
        res["world_size"] = di.get("world_size")
    if not xs:
        res["error"] = "no complete events"
        return res

    steps = [x for x in xs if x[1].startswith("ProfilerStep#") and x[0] in ("user_annotation", "operator", "cpu_op")]
    if steps:
        tid_count = {}
        for x in steps:
            tid_count[(x[2], x[3])] = tid_count.get((x[2], x[3]), 0) + 1
        main = max(tid_count, key=tid_count.get)
        steps = sorted([x for x in steps if (x[2], x[3]) == main], key=lambda x: x[4])
        windows = [(x[1], x[4], x[5]) for x in steps]
        res["steps_source"] = "ProfilerStep (%s)" % steps[0][0]
    else:
        tot = {}
        for x in xs:
            if x[0] in ("cpu_op", "operator"):
                tot[(x[2], x[3])] = tot.get((x[2], x[3]), 0.0) + (x[5] - x[4])
        main = max(tot, key=tot.get) if tot else None
        windows = [("whole-span", min(x[4] for x in xs), max(x[5] for x in xs))]
        res["steps_source"] = "whole-span (no ProfilerStep in the trace)"
    main_pid = main[0] if main else None
    res["main_thread"] = "%s/%s" % main if main else None

    gpu = [x for x in xs if x[0] in GPU_CATS]
    is_comm = lambda x: x[0] in KERNEL_CATS and ("nccl" in x[1].lower() or "rccl" in x[1].lower())
    comm_iv = union([(x[4], x[5]) for x in gpu if is_comm(x)])
    comp_iv = union([(x[4], x[5]) for x in gpu if not is_comm(x)])
    gpu_iv = union(comm_iv + comp_iv)
    kernels = [x for x in gpu if x[0] in KERNEL_CATS]
    host_main = [x for x in xs if main and (x[2], x[3]) == main]
    dl_iv = union([(x[4], x[5]) for x in host_main if "enumerate(DataLoader)" in x[1]])
    cover_iv = union([(x[4], x[5]) for x in host_main
                      if x[0] in HOST_OP_CATS and not x[1].startswith("ProfilerStep#")])
    runtime = [x for x in xs if x[0] in RUNTIME_CATS and x[2] == main_pid]
    launch = [x for x in runtime if "launch" in x[1].lower()]
    launch_main_iv = union([(x[4], x[5]) for x in launch if (x[2], x[3]) == main])
    sync = [x for x in runtime if x[1].lower() in SYNC_NAMES]
    res["python_tracing"] = any(x[0] == "python_function" for x in xs)
    res["gpu_present"] = bool(gpu)

    per_step = decompose(windows, gpu_iv, comm_iv, comp_iv, dl_iv, cover_iv, kernels, launch, launch_main_iv, sync)
    if not steps and main:
        # Supplement for traces without ProfilerStep: steady-state iteration windows between the
        # starts of consecutive occurrences of a repeating per-iteration marker on the main
        # thread; the first window (warm-up: CUDA context, cuDNN autotuning, worker start) and
        # everything before the second marker are dropped.
        for marker in ("enumerate(DataLoader)", "Optimizer.zero_grad", "Optimizer.step"):
            starts = sorted({x[4] for x in host_main if x[1].startswith(marker)})
            if len(starts) >= 4:
                iw = [("iter%d" % i, starts[i], starts[i + 1]) for i in range(1, len(starts) - 1)]
                ss = decompose(iw, gpu_iv, comm_iv, comp_iv, dl_iv, cover_iv, kernels, launch, launch_main_iv, sync)
                res["steady_state"] = {
                    "marker": marker, "n_iters": len(ss),
                    "mean_iter_us": statistics.mean(x["step_us"] for x in ss),
                    "shares": {k: statistics.mean(x["shares"][k] for x in ss) for k in ss[0]["shares"]},
                    "dataloader_share": sum(x["dataloader_us"] for x in ss) / sum(x["step_us"] for x in ss),
                    "kernels_per_iter": statistics.mean(x["kernels"] for x in ss),
                    "host_wait_by_event": host_wait_attribution(xs, main, per_step_windows(iw), gpu_iv, dl_iv),
                }
                res["steady_state"]["suggested_dominant"] = suggest(res["steady_state"]["shares"])
                break
    res["steps"] = per_step
    res["n_steps"] = len(per_step)
    if per_step:
        res["host_wait_by_event"] = host_wait_attribution(xs, main, per_step_windows(windows), gpu_iv, dl_iv)
        res["kernel_families"] = kernel_families(kernels, windows)
    if per_step:
        keys = [k for k in per_step[0] if k.endswith("_us") or k in ("kernels", "launch_calls", "sync_calls")]
        res["mean"] = {k: statistics.mean(s[k] for s in per_step) for k in keys}
        res["shares"] = {k: statistics.mean(s["shares"][k] for s in per_step) for k in per_step[0]["shares"]}
        m = res["mean"]
        W = m["step_us"]
        res["extra_shares"] = {
            "gpu_busy": m["gpu_busy_us"] / W,
            "comm_total": m["comm_us"] / W,
            "dataloader": m["dataloader_us"] / W,
            "untraced_main": m["untraced_main_us"] / W,
            "launch": m["launch_us"] / W,
            "sync": m["sync_us"] / W,
        }
        res["suggested_dominant"] = suggest(res["shares"]) if gpu else None
    return res


def decompose(windows, gpu_iv, comm_iv, comp_iv, dl_iv, cover_iv, kernels, launch, launch_main_iv, sync):
    """The per-window decomposition described in the module docstring."""
    per_step = []
    for name, w0, w1 in windows:
        W = w1 - w0
        if W <= 0:
            continue
        g = clip(gpu_iv, w0, w1)
        cm = clip(comm_iv, w0, w1)
        cp = clip(comp_iv, w0, w1)
        idle = subtract([(w0, w1)], g)
        dl = clip(dl_iv, w0, w1)
        cov = clip(cover_iv, w0, w1)
        data_wait = intersect(idle, dl)
        host_wait = subtract(idle, dl)
        ks = [x for x in kernels if w0 <= x[4] < w1]
        kd = sorted(x[5] - x[4] for x in ks)
        ls = [x for x in launch if w0 <= x[4] < w1]
        ss = [x for x in sync if w0 <= x[4] < w1]
        st = {
            "name": name,
            "step_us": W,
            "gpu_busy_us": length(g),
            "compute_us": length(cp),
            "comm_us": length(cm),
            "comm_exposed_us": length(subtract(cm, cp)),
            "overlap_us": length(intersect(cm, cp)),
            "gpu_idle_us": length(idle),
            "dataloader_us": length(dl),
            "data_wait_us": length(data_wait),
            "host_wait_us": length(host_wait),
            "host_wait_in_launch_us": length(intersect(host_wait, clip(launch_main_iv, w0, w1))),
            "host_wait_untraced_us": length(subtract(host_wait, cov)),
            "untraced_main_us": W - length(cov),
            "main_ops_us": length(cov),
            "kernels": len(ks),
            "kernel_median_us": statistics.median(kd) if kd else 0.0,
            "launch_calls": len(ls),
            "launch_us": sum(x[5] - x[4] for x in ls),
            "sync_calls": len(ss),
            "sync_us": sum(x[5] - x[4] for x in ss),
            "sync_max_us": max((x[5] - x[4] for x in ss), default=0.0),
        }
        st["shares"] = {
            "compute": st["compute_us"] / W,
            "communication": st["comm_exposed_us"] / W,
            "data": st["data_wait_us"] / W,
            "host": st["host_wait_us"] / W,
        }
        per_step.append(st)
    return per_step


def per_step_windows(windows):
    return [(w0, w1) for _, w0, w1 in windows if w1 > w0]


def host_wait_attribution(xs, main, wins, gpu_iv, dl_iv, top=8):
    """Where the host was while the GPU sat idle (outside DataLoader): for every host event of
    the main process (any thread, categories cpu_op/Operator/runtime/driver/user_annotation),
    the length of its intersection with the GPU-idle-not-DataLoader time, summed by
    (thread, name) and averaged per step. Nested events are each counted (an outer op and the
    runtime call inside it both show), so the list is an explanation, not a partition."""
    if not main:
        return []
    hw = []
    for w0, w1 in wins:
        idle = subtract([(w0, w1)], clip(gpu_iv, w0, w1))
        hw.extend(subtract(idle, clip(dl_iv, w0, w1)))
    hw = union(hw)
    if not hw:
        return []
    starts = [s for s, _ in hw]
    acc = {}
    for x in xs:
        if x[2] != main[0] or x[0] not in HOST_OP_CATS | {"user_annotation"}:
            continue
        if x[1].startswith("ProfilerStep#"):
            continue
        i = max(0, bisect.bisect_right(starts, x[4]) - 1)
        tot = 0.0
        while i < len(hw) and hw[i][0] < x[5]:
            s, e = max(hw[i][0], x[4]), min(hw[i][1], x[5])
            if e > s:
                tot += e - s
            i += 1
        if tot > 0:
            key = ("main" if x[3] == main[1] else "other", x[1][:70])
            acc[key] = acc.get(key, 0.0) + tot
    n = max(1, len(wins))
    return [(t, nm, v / n) for (t, nm), v in sorted(acc.items(), key=lambda kv: -kv[1])[:top]]


FP32_SIMT_MARKS = ("sgemm", "scudnn", "<float", "gemv2t_kernel_val<int, int, float", "_sb_")
GEMM_MARKS = ("gemm", "conv", "cudnn", "cutlass", "matmul", "mma", "cijk", "gemv", "wgrad", "dgrad")


def kernel_families(kernels, windows, top=5):
    """Kernel time in the step windows: total, top kernels by time, and the share of GEMM/conv
    kernel time whose name marks fp32 SIMT math (sgemm / scudnn / <float ...> templates,
    rocBLAS ``_SB_``): a measurable computation cause on tensor-core GPUs."""
    tot = {}
    gemm = fp32 = 0.0
    n = 0
    for x in kernels:
        d = 0.0
        for _, w0, w1 in windows:
            s, e = max(x[4], w0), min(x[5], w1)
            if e > s:
                d += e - s
        if d <= 0:
            continue
        n += 1
        tot[x[1]] = tot.get(x[1], 0.0) + d
        low = x[1].lower()
        if "nccl" in low or "rccl" in low:
            continue
        if any(m in low for m in GEMM_MARKS):
            gemm += d
            if any(m in low for m in FP32_SIMT_MARKS):
                fp32 += d
    allk = sum(tot.values())
    return {
        "kernel_us_total": allk,
        "gemm_conv_share_of_kernel_time": gemm / allk if allk else 0.0,
        "fp32_simt_share_of_gemm_conv": fp32 / gemm if gemm else 0.0,
        "top": [(nm[:90], v / allk) for nm, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]] if allk else [],
    }


def suggest(shares):
    ranked = sorted(shares.items(), key=lambda kv: kv[1], reverse=True)
    (k1, v1), (k2, v2) = ranked[0], ranked[1]
    if v1 > 0.40 and v1 >= 1.5 * v2:
        return k1
    return "unclear"


def measure_kineto_job(paths):
    ranks = [measure_kineto(p) for p in paths]
    ok = [r for r in ranks if r.get("shares")]
    res = {"kind": "kineto-job", "ranks": ranks, "n_ranks": len(ranks)}
    if ok:
        res["shares"] = {k: statistics.mean(r["shares"][k] for r in ok) for k in ok[0]["shares"]}
        res["mean_step_us"] = statistics.mean(r["mean"]["step_us"] for r in ok)
        steps = [r["mean"]["step_us"] for r in ok]
        comp = [r["mean"]["compute_us"] for r in ok]
        res["step_spread"] = max(steps) / min(steps) if min(steps) else None
        res["compute_spread"] = max(comp) / min(comp) if min(comp) else None
        res["suggested_dominant"] = suggest(res["shares"])
    res["collective_wait"] = collective_wait(paths)
    return res


def collective_wait(paths):
    """Cross-rank alignment of the communication kernels of a job whose ranks share a clock (one
    host, or synchronised clocks): the k-th kernel of the same name on every rank is one
    collective. Its shortest duration over the ranks approximates the transfer; each rank's
    excess over that is time spent waiting for the last rank to arrive (the paper's
    synchronisation waste, R_wait = 1 - T_avg / T_max per collective, summed here as times)."""
    per_rank = []
    for p in paths:
        data = load_json(p)
        ks = sorted((float(e["ts"]), float(e["dur"]), str(e.get("name"))) for e in data.get("traceEvents", [])
                    if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
                    and ("nccl" in str(e.get("name", "")).lower() or "rccl" in str(e.get("name", "")).lower()))
        seq = {}
        for ts, dur, name in ks:
            seq.setdefault(name[:60], []).append((ts, dur))
        per_rank.append(seq)
    if len(per_rank) < 2:
        return None
    names = set(per_rank[0])
    for sq in per_rank[1:]:
        names &= set(sq)
    total = [0.0] * len(per_rank)
    excess = [0.0] * len(per_rank)
    transfer = 0.0
    start_spread = []
    for n in names:
        cnt = min(len(sq[n]) for sq in per_rank)
        for i in range(cnt):
            es = [sq[n][i] for sq in per_rank]
            mind = min(d for _, d in es)
            transfer += mind
            start_spread.append(max(t for t, _ in es) - min(t for t, _ in es))
            for r, (_, d) in enumerate(es):
                total[r] += d
                excess[r] += d - mind
    if not start_spread:
        return None
    return {
        "collectives": len(start_spread),
        "transfer_us_min_over_ranks": transfer,
        "comm_kernel_us_per_rank": total,
        "wait_us_per_rank": excess,
        "wait_share_of_comm": sum(excess) / sum(total) if sum(total) else 0.0,
        "max_start_spread_us": max(start_spread),
    }


# ----------------------------------------------------------------------------- ascend
STEP_COLS = ["Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free",
             "Stage", "Bubble", "Preparing"]
DB_COLS = {"computing": "Computing", "communication_not_overlapped": "Communication(Not Overlapped)",
           "overlapped": "Overlapped", "communication": "Communication", "free": "Free",
           "stage": "Stage", "bubble": "Bubble", "preparing": "Preparing"}


def _ro(path):
    return sqlite3.connect("file:%s?mode=ro&immutable=1" % path, uri=True)


def read_step_trace(rank_dir):
    out_dir = os.path.join(rank_dir, "ASCEND_PROFILER_OUTPUT")
    csv_path = os.path.join(out_dir, "step_trace_time.csv")
    rows = []
    if os.path.exists(csv_path):
        with open(csv_path, newline="") as fh:
            for r in csv.DictReader(fh):
                rows.append({"step": r.get("Step"), **{c: _f(r.get(c)) for c in STEP_COLS}})
        return rows, "step_trace_time.csv"
    db = os.path.join(out_dir, "analysis.db")
    if os.path.exists(db):
        con = _ro(db)
        cur = con.execute("select * from StepTraceTime")
        names = [d[0] for d in cur.description]
        for t in cur.fetchall():
            r = dict(zip(names, t))
            rows.append({"step": r.get("step"), **{v: _f(r.get(k)) for k, v in DB_COLS.items()}})
        con.close()
        return rows, "analysis.db:StepTraceTime"
    return rows, None


def read_comm_time(rank_dir):
    """Summed Elapse / Transit / Wait / Synchronization / Idle (ms) over the collectives."""
    out_dir = os.path.join(rank_dir, "ASCEND_PROFILER_OUTPUT")
    tot = {"elapse": 0.0, "transit": 0.0, "wait": 0.0, "sync": 0.0, "idle": 0.0, "ops": 0}
    ops = []
    js = os.path.join(out_dir, "communication.json")
    db = os.path.join(out_dir, "analysis.db")
    if os.path.exists(js):
        with open(js) as fh:
            d = json.load(fh)
        for step, groups in d.items():
            for kind, coll in groups.items():
                for op, info in coll.items():
                    if op == "Total Op Info":
                        continue
                    ti = info.get("Communication Time Info", {})
                    ops.append((op, kind, ti.get("Elapse Time(ms)") or 0, ti.get("Transit Time(ms)") or 0,
                                ti.get("Wait Time(ms)") or 0, ti.get("Synchronization Time(ms)") or 0,
                                ti.get("Idle Time(ms)") or 0))
        src = "communication.json"
    elif os.path.exists(db):
        con = _ro(db)
        for r in con.execute("select hccl_op_name, type, elapse_time, transit_time, wait_time, "
                             "synchronization_time, idle_time from CommAnalyzerTime"):
            ops.append(tuple(r))
        con.close()
        src = "analysis.db:CommAnalyzerTime"
    else:
        return None
    for op in ops:
        tot["elapse"] += op[2]
        tot["transit"] += op[3]
        tot["wait"] += op[4]
        tot["sync"] += op[5]
        tot["idle"] += op[6]
        tot["ops"] += 1
    tot["source"] = src
    tot["longest_op"] = max(ops, key=lambda o: o[2])[:3] if ops else None
    return tot


def trace_view_overlap(tv_path):
    """Sum of the Overlap Analysis rows of a torch_npu trace_view.json, plus ProfilerStep windows."""
    with open(tv_path) as fh:
        d = json.load(fh)
    ev = d if isinstance(d, list) else d.get("traceEvents", [])
    pname, tname = {}, {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e.get("pid")] = (e.get("args") or {}).get("name")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name")
    sums = {}
    steps = []
    for e in ev:
        if e.get("ph") != "X":
            continue
        if pname.get(e.get("pid")) == "Overlap Analysis":
            row = tname.get((e.get("pid"), e.get("tid")))
            sums[row] = sums.get(row, 0.0) + float(e.get("dur") or 0)
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.append((e["name"], float(e.get("dur") or 0)))
    return {"overlap_rows_us": sums, "profiler_steps": steps}


def db_overlap(db_path):
    con = _ro(db_path)
    names = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    if "OVERLAP_ANALYSIS" not in names:
        con.close()
        return None
    sums = {}
    for t, s in con.execute("select type, sum(endNs - startNs) from OVERLAP_ANALYSIS group by type"):
        sums[{0: "Computing", 1: "Communication", 2: "Communication(Not Overlapped)", 3: "Free"}.get(t, t)] = s / 1000.0
    con.close()
    return {"overlap_rows_us": sums}


def measure_ascend_rank(rank_dir):
    rows, src = read_step_trace(rank_dir)
    res = {"rank_dir": rank_dir, "step_source": src, "steps": rows}
    if rows:
        agg = {c: statistics.mean(x[c] for x in rows if x[c] is not None) for c in STEP_COLS
               if any(x[c] is not None for x in rows)}
        res["mean"] = agg
        S = agg.get("Stage") or (agg["Computing"] + agg["Communication(Not Overlapped)"] + agg["Free"])
        res["shares"] = {
            "compute": agg["Computing"] / S,
            "communication": agg["Communication(Not Overlapped)"] / S,
            "free": agg["Free"] / S,
        }
    res["comm"] = read_comm_time(rank_dir)
    tv = os.path.join(rank_dir, "ASCEND_PROFILER_OUTPUT", "trace_view.json")
    if os.path.exists(tv):
        res["crosscheck"] = {"source": "trace_view.json", **trace_view_overlap(tv)}
    else:
        dbs = glob.glob(os.path.join(rank_dir, "ASCEND_PROFILER_OUTPUT", "ascend_pytorch_profiler*.db"))
        if dbs:
            ov = db_overlap(dbs[0])
            if ov:
                res["crosscheck"] = {"source": os.path.basename(dbs[0]) + ":OVERLAP_ANALYSIS", **ov}
    return res


def measure_ascend_job(job_dir):
    rank_dirs = sorted(d for d in glob.glob(os.path.join(job_dir, "*_ascend_pt")) if os.path.isdir(d))
    ranks = [measure_ascend_rank(d) for d in rank_dirs]
    return summarise_ascend(ranks, {"kind": "ascend-job", "path": job_dir})


def summarise_ascend(ranks, res):
    res["ranks"] = ranks
    ok = [r for r in ranks if r.get("shares")]
    res["n_ranks"] = len(ranks)
    if ok:
        res["shares"] = {k: statistics.mean(r["shares"][k] for r in ok) for k in ok[0]["shares"]}
        res["mean_step_us"] = statistics.mean(r["mean"]["Stage"] for r in ok)
        for c in ("Computing", "Communication(Not Overlapped)", "Free"):
            vals = [r["mean"][c] for r in ok]
            res.setdefault("spread_us", {})[c] = max(vals) - min(vals)
        res["suggested_dominant"] = suggest(res["shares"])
    return res


def measure_cluster_csv(path):
    ranks = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if (r.get("Type") or "").strip() != "rank":
                continue
            agg = {c: _f(r.get(c)) for c in STEP_COLS if r.get(c) not in (None, "")}
            S = agg["Stage"]
            ranks.append({"rank_dir": "rank %s" % r.get("Index"), "mean": agg, "shares": {
                "compute": agg["Computing"] / S,
                "communication": agg["Communication(Not Overlapped)"] / S,
                "free": agg["Free"] / S}})
    return summarise_ascend(ranks, {"kind": "ascend-cluster-csv", "path": path})


def measure_ascend_trace_view(path):
    ov = trace_view_overlap(path)
    rows = ov["overlap_rows_us"]
    comp = rows.get("Computing", 0.0)
    comm = rows.get("Communication(Not Overlapped)", 0.0)
    free = rows.get("Free", 0.0)
    S = comp + comm + free
    res = {"kind": "ascend-trace-view", "path": path, "crosscheck": ov}
    if S:
        res["shares"] = {"compute": comp / S, "communication": comm / S, "free": free / S}
        res["mean_step_us"] = S
        res["suggested_dominant"] = suggest(res["shares"])
    return res


def advisor_outputs(root):
    """The numbers msprof-analyze 26.2.0 printed (terminal tables) for comparison."""
    out = {}
    for p in sorted(glob.glob(os.path.join(root, "ascend_advisor_outputs", "*_terminal.txt"))):
        txt = open(p, encoding="utf-8", errors="replace").read()
        nums = {}
        for key, pat in (("e2e_ms", r"E2E Time is ([\d.]+)ms"), ("computing_ms", r"Computing Time is ([\d.]+)ms"),
                         ("uncovered_comm_ms", r"Uncovered Communication Time is ([\d.]+)ms"),
                         ("free_ms", r"Free Time is ([\d.]+)ms")):
            m = re.search(pat, txt)
            if m:
                nums[key] = float(m.group(1))
        cats = re.findall(r"^\|\s*\d+\s*\|\s*([^|]+?)\s*\|", txt, flags=re.M)
        nums["categories"] = cats
        for m in re.finditer(r"max difference of (\w+) time\s*\|?[^\n]*\n[^\n]*has reached ([\d.]+)ms", txt):
            nums.setdefault("slow_rank_max_diff_ms", {})[m.group(1)] = float(m.group(2))
        out[os.path.basename(p)] = nums
    return out


# ----------------------------------------------------------------------------- discovery
def discover(root):
    """Yield (relative path, measuring function, argument)."""
    items = []
    jobs_kineto = {"param/dlrm_kineto_8rank", "hta/trace_filter"}
    skip = {"hta/critical_path/end_to_end/simple_add/output"}  # HTA's own overlaid output, not a recording
    for p in sorted(glob.glob(os.path.join(root, "**", "*.json.gz"), recursive=True)):
        rel = os.path.relpath(p, root)
        d = os.path.dirname(rel)
        if d in jobs_kineto or d in skip:
            continue
        items.append((rel, measure_kineto, p))
    for d in sorted(jobs_kineto):
        ps = sorted(glob.glob(os.path.join(root, d, "*.json.gz")))
        if ps:
            items.append((d, measure_kineto_job, ps))
    for d in sorted(glob.glob(os.path.join(root, "ascend", "*"))):
        if glob.glob(os.path.join(d, "*_ascend_pt")):
            items.append((os.path.relpath(d, root), measure_ascend_job, d))
    for p in sorted(glob.glob(os.path.join(root, "ascend", "**", "cluster_step_trace_time.csv"), recursive=True)):
        items.append((os.path.relpath(os.path.dirname(p), root), measure_cluster_csv, p))
    for p in sorted(glob.glob(os.path.join(root, "ascend", "msprof_analyze_ut", "**", "trace_view.json"), recursive=True)):
        items.append((os.path.relpath(p, root), measure_ascend_trace_view, p))
    return items


# ----------------------------------------------------------------------------- report
def pct(x):
    return "%5.1f%%" % (100 * x) if x is not None else "  n/a"


def print_kineto(rel, r):
    if "shares" not in r:
        print("%-78s  %s" % (rel, r.get("error", "no steps")))
        return
    m, s, x = r["mean"], r["shares"], r["extra_shares"]
    print("%-78s steps=%d (%s) step=%.1fms dev=%s" % (rel, r["n_steps"], r["steps_source"], m["step_us"] / 1e3,
                                                       r.get("device")))
    if not r["gpu_present"]:
        print("    CPU-only: main-thread ops %s, gaps %s, DataLoader %s" % (
            pct(m["main_ops_us"] / m["step_us"]), pct(m["untraced_main_us"] / m["step_us"]), pct(x["dataloader"])))
        return
    print("    compute %s | comm exposed %s (comm total %s, overlap %.1fms) | data wait %s (DataLoader %s) | "
          "host wait %s -> suggested %s" % (pct(s["compute"]), pct(s["communication"]), pct(x["comm_total"]),
                                            m["overlap_us"] / 1e3, pct(s["data"]), pct(x["dataloader"]),
                                            pct(s["host"]), r["suggested_dominant"]))
    print("    gpu busy %s, untraced main %s, host wait untraced %.1fms, in launch %.1fms | kernels/step %.0f "
          "median %.1fus | launch %d calls %.1fms | sync %d calls %.1fms (max %.1fms) | python tracing %s" % (
              pct(x["gpu_busy"]), pct(x["untraced_main"]), m["host_wait_untraced_us"] / 1e3,
              m["host_wait_in_launch_us"] / 1e3, m["kernels"], m["kernel_median_us"], m["launch_calls"],
              m["launch_us"] / 1e3, m["sync_calls"], m["sync_us"] / 1e3, m["sync_max_us"] / 1e3, r["python_tracing"]))
    ss = r.get("steady_state")
    if ss:
        print("    steady state (%d iterations between '%s' starts, first dropped): iter %.1fms | compute %s | "
              "comm exposed %s | data wait %s (DataLoader %s) | host wait %s -> suggested %s" % (
                  ss["n_iters"], ss["marker"], ss["mean_iter_us"] / 1e3, pct(ss["shares"]["compute"]),
                  pct(ss["shares"]["communication"]), pct(ss["shares"]["data"]), pct(ss["dataloader_share"]),
                  pct(ss["shares"]["host"]), ss["suggested_dominant"]))
        if VERBOSE and ss.get("host_wait_by_event"):
            print("      steady-state host wait spent in: " + "; ".join(
                "%s:%s %.1fms" % (t, nm, v / 1e3) for t, nm, v in ss["host_wait_by_event"][:6]))
    if VERBOSE:
        hw = r.get("host_wait_by_event") or []
        if hw:
            print("    host wait spent in (per step, nested events each counted): " + "; ".join(
                "%s:%s %.1fms" % (t, nm, v / 1e3) for t, nm, v in hw))
        kf = r.get("kernel_families") or {}
        if kf.get("top"):
            print("    kernels: gemm/conv %s of kernel time, fp32-SIMT %s of gemm/conv; top: %s" % (
                pct(kf["gemm_conv_share_of_kernel_time"]), pct(kf["fp32_simt_share_of_gemm_conv"]),
                "; ".join("%s %s" % (nm[:60], pct(v)) for nm, v in kf["top"][:3])))


def print_item(rel, r):
    k = r.get("kind")
    if k == "kineto":
        print_kineto(rel, r)
    elif k == "kineto-job":
        print("%-78s JOB %d ranks: mean step %.1fms, step max/min %.2f, compute max/min %.2f -> suggested %s" % (
            rel, r["n_ranks"], r.get("mean_step_us", 0) / 1e3, r.get("step_spread") or 0,
            r.get("compute_spread") or 0, r.get("suggested_dominant")))
        if r.get("shares"):
            print("    rank-mean shares: " + ", ".join("%s %s" % (a, pct(b)) for a, b in r["shares"].items()))
        cw = r.get("collective_wait")
        if cw:
            print("    collectives matched across ranks: %d; transfer (shortest rank) %.2fms; waiting for the last "
                  "rank = %s of communication-kernel time; max arrival spread %.2fms; wait per rank ms: %s" % (
                      cw["collectives"], cw["transfer_us_min_over_ranks"] / 1e3, pct(cw["wait_share_of_comm"]),
                      cw["max_start_spread_us"] / 1e3, [round(w / 1e3, 2) for w in cw["wait_us_per_rank"]]))
        for rr in r["ranks"]:
            print_kineto("  " + os.path.basename(rr["path"]), rr)
    elif k and k.startswith("ascend"):
        print("%-78s %s %s ranks/rows: mean step %.1fms -> suggested %s" % (
            rel, k, r.get("n_ranks", 1), r.get("mean_step_us", 0) / 1e3, r.get("suggested_dominant")))
        if r.get("shares"):
            print("    rank-mean shares: " + ", ".join("%s %s" % (a, pct(b)) for a, b in r["shares"].items()))
        if r.get("spread_us"):
            print("    cross-rank spread (max-min): " + ", ".join("%s %.1fms" % (a, b / 1e3) for a, b in r["spread_us"].items()))
        for rr in r.get("ranks", []):
            if not rr.get("mean"):
                continue
            mm = rr["mean"]
            line = "    %-28s stage %.1fms computing %.1f comm-not-ovl %.1f overlapped %.1f free %.1f preparing %s" % (
                os.path.basename(rr["rank_dir"]), mm["Stage"] / 1e3, mm["Computing"] / 1e3,
                mm["Communication(Not Overlapped)"] / 1e3, mm["Overlapped"] / 1e3, mm["Free"] / 1e3,
                "%.1f" % (mm["Preparing"] / 1e3) if mm.get("Preparing") is not None else "n/a")
            print(line)
            c = rr.get("comm")
            if c:
                print("        comm ops %d (%s): elapse %.1fms transit %.1f wait %.1f sync %.1f idle %.1f; longest %s" % (
                    c["ops"], c["source"], c["elapse"], c["transit"], c["wait"], c["sync"], c["idle"], c["longest_op"]))
            cc = rr.get("crosscheck")
            if cc:
                rows = cc["overlap_rows_us"]
                print("        cross-check %s: %s" % (cc["source"], ", ".join(
                    "%s %.1fms" % (a, b / 1e3) for a, b in sorted(rows.items(), key=lambda kv: str(kv[0])))))
        if k == "ascend-trace-view":
            print("    overlap rows: %s; ProfilerStep %s" % (
                {a: round(b / 1e3, 2) for a, b in r["crosscheck"]["overlap_rows_us"].items()},
                r["crosscheck"]["profiler_steps"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("filters", nargs="*", help="only paths containing one of these words")
    ap.add_argument("--root", default=DATA_ROOT)
    ap.add_argument("--json", help="write every measured number to this file")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="also print where the host was during GPU idle and the kernel mix")
    a = ap.parse_args(argv)
    global VERBOSE
    VERBOSE = a.verbose
    if not os.path.isdir(a.root):
        print("no data at %s" % a.root)
        return 0
    out = {}
    for rel, fn, arg in discover(a.root):
        if a.filters and not any(f in rel for f in a.filters):
            continue
        try:
            r = fn(arg)
        except Exception as exc:  # a reader failing on one file must not hide the others
            r = {"kind": "error", "error": "%s: %s" % (type(exc).__name__, exc)}
            print("%-78s ERROR %s" % (rel, r["error"]))
            out[rel] = r
            continue
        out[rel] = r
        print_item(rel, r)
    adv = advisor_outputs(a.root)
    if adv and not a.filters:
        print("\nmsprof-analyze 26.2.0 printed (ascend_advisor_outputs):")
        for k, v in adv.items():
            print("   %s: %s" % (k, v))
    out["_msprof_analyze_printed"] = adv
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
