"""torch_npu's ``trace_view.json`` (a Chrome trace written by the Ascend profiler) as tables.

Processes are told apart by their ``process_name`` metadata: ``Python`` (host operators, Python
functions, the task queue), ``CANN`` (AscendCL / Node / HCCL API calls), ``Ascend Hardware``
(device tasks, one thread per stream), ``HCCL`` (collectives on ``Group N Communication``
threads, their transfer tasks on ``Plane K`` threads), ``AI Core Freq`` (a counter), and
``Overlap Analysis`` (the profiler's own computing / communication / free intervals).
Timestamps are written as strings with fractional µs; all are returned as float µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from .. import validate as vd
from .files import read_json


@dataclass
class Timeline:
    host_ops: pd.DataFrame  # name ts dur tid pid seq fwd_tid input_dims input_types
    python: pd.DataFrame  # name ts dur tid py_id parent_id
    task_queue: pd.DataFrame  # name ts dur tid kind (enqueue/dequeue) correlation
    cann: pd.DataFrame  # name ts dur tid connection_id level
    device: pd.DataFrame  # name ts dur stream task_type task_id connection_id
    hccl_ops: pd.DataFrame  # name ts dur group connection_id data_type alg_type count
    hccl_tasks: pd.DataFrame  # name ts dur plane stream task_type src_rank dst_rank transport size_bytes link_type bandwidth_gbps
    op_flows: pd.DataFrame  # host_tid host_ts device_ts (torch_to_npu: the op that issued a device task)
    aicore_freq: pd.DataFrame  # ts mhz
    overlap: pd.DataFrame  # name ts dur (the profiler's Computing / Communication / Free intervals)
    counts: dict[str, int] = field(default_factory=dict)
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # events dropped as damaged, named by file


_TIMED = ("host_ops", "python", "task_queue", "cann", "device", "hccl_ops", "hccl_tasks", "overlap")
_WHAT = {"host_ops": "host op", "python": "python_function", "task_queue": "task-queue", "cann": "CANN API",
         "device": "device task", "hccl_ops": "HCCL op", "hccl_tasks": "HCCL task", "overlap": "overlap-analysis"}


def validate(tl: Timeline, source: str, unreadable: int = 0) -> Timeline:
    """The physical checks of validate.py on every timed table (shared with the db export):
    events with a non-finite time, a negative duration, outside the file's plausible time span,
    or exact duplicates are dropped; what was dropped (and ``unreadable`` events whose time was
    not a number) is named in ``tl.warnings``."""
    frames = {k: getattr(tl, k) for k in _TIMED}
    starts = [f["ts"].to_numpy(np.float64) for f in frames.values() if len(f)]
    window = vd.plausible_window(np.concatenate(starts)) if starts else None
    drops = vd.Drops()
    for k, df in frames.items():
        if not len(df):
            continue
        ts, dur = df["ts"].to_numpy(np.float64), df["dur"].to_numpy(np.float64)
        with np.errstate(invalid="ignore"):
            non_finite = ~(np.isfinite(ts) & np.isfinite(dur))
            negative = ~non_finite & (dur < 0)
        out = ~non_finite & ~negative & vd.outside(ts, dur, window)
        bad = non_finite | negative | out
        for mask, reason in ((non_finite, vd.NON_FINITE), (negative, vd.NEGATIVE), (out, vd.OUTSIDE)):
            if mask.any():
                i = int(np.flatnonzero(mask)[0])
                drops.add(_WHAT[k], reason, int(mask.sum()), vd.example(df["name"].iat[i], ts[i], dur[i]))
        dup = np.zeros(len(df), dtype=bool)
        keep_idx = np.flatnonzero(~bad)
        if len(keep_idx) > 1:
            d = df.iloc[keep_idx].astype(str).duplicated().to_numpy()
            dup[keep_idx[d]] = True
            if d.any():
                i = int(keep_idx[np.flatnonzero(d)[0]])
                drops.add(_WHAT[k], vd.DUPLICATE, int(d.sum()), vd.example(df["name"].iat[i], ts[i], dur[i]))
        if (bad | dup).any():
            setattr(tl, k, df[~(bad | dup)].reset_index(drop=True))
    if len(tl.aicore_freq):
        t = tl.aicore_freq["ts"].to_numpy(np.float64)
        ok = np.isfinite(t) & ~vd.outside(t, np.zeros(len(t)), window)
        if not ok.all():
            drops.add("AI Core Freq", vd.OUTSIDE, int((~ok).sum()), vd.example("MHz", t[int(np.flatnonzero(~ok)[0])]))
            tl.aicore_freq = tl.aicore_freq[ok].reset_index(drop=True)
    if len(tl.op_flows):
        h, d = tl.op_flows["host_ts"].to_numpy(np.float64), tl.op_flows["device_ts"].to_numpy(np.float64)
        ok = np.isfinite(h) & np.isfinite(d) & ~vd.outside(h, np.zeros(len(h)), window) & \
            ~vd.outside(d, np.zeros(len(d)), window)  # fmt: skip
        if not ok.all():
            drops.add("flow", vd.OUTSIDE, int((~ok).sum()), vd.example("torch_to_npu", h[int(np.flatnonzero(~ok)[0])]))
            tl.op_flows = tl.op_flows[ok].reset_index(drop=True)
    if unreadable:
        tl.warnings.append(f"{source}: skipped {unreadable} event(s) with an unreadable time (not a number) "
                           "or that are not JSON objects")  # fmt: skip
    if drops.total:
        tl.counts["dropped"] = drops.total
        tl.warnings.append(f"{source}: {drops.message()}")
    return tl


def _f(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v).strip())
    except ValueError:
        return float("nan")


def _i(v: Any, default: int = -1) -> int:
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return default


def _frame(rows: list[tuple], cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame.from_records(rows, columns=cols) if rows else pd.DataFrame({c: [] for c in cols})


def read_timeline(path: Path) -> Timeline:
    doc = read_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise BadTraceError("expected a JSON list of trace events (or an object with traceEvents)", str(path))
    pname: dict[Any, str] = {}
    tname: dict[str, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            a = e.get("args") or {}
            if e.get("name") == "process_name" and isinstance(a, dict):
                pname[e.get("pid")] = str(a.get("name", ""))
            elif e.get("name") == "thread_name" and isinstance(a, dict):
                tname[f"{e.get('pid')}/{e.get('tid')}"] = str(a.get("name", ""))

    host, py, queue, cann, dev, hops, htasks, flows_s, flows_f, freq, ov = ([] for _ in range(11))
    counts: dict[str, int] = {}
    bad = 0
    for e in events:
        if not isinstance(e, dict):
            bad += 1
            continue
        ph = e.get("ph")
        proc = pname.get(e.get("pid"), "")
        cat = e.get("cat")
        key = f"{proc or 'unknown'}:{cat or ph}"
        counts[key] = counts.get(key, 0) + 1
        if ph == "X":
            ts, dur = _f(e.get("ts")), _f(e.get("dur", 0.0))
            if not (ts == ts and dur == dur):  # NaN: unreadable time
                bad += 1
                continue
            name = str(e.get("name", ""))
            a = e.get("args") if isinstance(e.get("args"), dict) else {}
            tid = _i(e.get("tid"))
            if cat == "cpu_op":
                host.append((name, ts, dur, tid, _i(e.get("pid")), _i(a.get("Sequence number")),
                             _i(a.get("Fwd thread id")), str(a.get("Input Dims", "")), str(a.get("Input type", ""))))  # fmt: skip
            elif cat == "python_function":
                py.append((name, ts, dur, tid, _i(a.get("Python id")), _i(a.get("Python parent id"))))
            elif cat in ("enqueue", "dequeue"):
                queue.append((name, ts, dur, tid, cat, _i(a.get("correlation_id"))))
            elif proc == "CANN":
                cann.append((name, ts, dur, tid, _i(a.get("connection_id")), str(a.get("level", ""))))
            elif proc == "Ascend Hardware":
                dev.append((name, ts, dur, _i(a.get("Physic Stream Id"), tid), str(a.get("Task Type", "")),
                            _i(a.get("Task Id")), _i(a.get("connection_id"))))  # fmt: skip
            elif proc == "HCCL":
                thread = tname.get(f"{e.get('pid')}/{e.get('tid')}", "")
                if thread.startswith("Plane") or "task type" in a:
                    htasks.append((name, ts, dur, tid, _i(a.get("stream id")), str(a.get("task type", "")),
                                   _i(a.get("src rank")), _i(a.get("dst rank")), str(a.get("transport type", "")),
                                   _f(a.get("size(Byte)", np.nan)), str(a.get("link type", "")),
                                   _f(a.get("bandwidth(GB/s)", np.nan))))  # fmt: skip
                else:
                    hops.append((name, ts, dur, thread or f"group {tid}", _i(a.get("connection_id")),
                                 str(a.get("data_type", "")), str(a.get("alg_type", "")), _i(a.get("count"))))  # fmt: skip
            elif proc == "Overlap Analysis":
                ov.append((name, ts, dur))
        elif ph in ("s", "f") and cat == "async_npu":
            (flows_s if ph == "s" else flows_f).append((str(e.get("id")), _i(e.get("tid")), _f(e.get("ts"))))
        elif ph == "C" and proc == "AI Core Freq":
            a = e.get("args") or {}
            freq.append((_f(e.get("ts")), _f(a.get("MHz", np.nan)) if isinstance(a, dict) else np.nan))
    if bad and bad == len(events):
        raise BadTraceError("no readable trace events", str(path))

    s = _frame(flows_s, ["id", "host_tid", "host_ts"])
    f = _frame(flows_f, ["id", "device_tid", "device_ts"])
    op_flows = s.merge(f, on="id", how="inner")[["host_tid", "host_ts", "device_ts"]] if len(s) and len(f) else \
        pd.DataFrame({"host_tid": [], "host_ts": [], "device_ts": []})  # fmt: skip
    counts = dict(sorted(counts.items()))
    if bad:
        counts["unreadable"] = bad
    return validate(Timeline(
        host_ops=_frame(host, ["name", "ts", "dur", "tid", "pid", "seq", "fwd_tid", "input_dims", "input_types"]),
        python=_frame(py, ["name", "ts", "dur", "tid", "py_id", "parent_id"]),
        task_queue=_frame(queue, ["name", "ts", "dur", "tid", "kind", "correlation"]),
        cann=_frame(cann, ["name", "ts", "dur", "tid", "connection_id", "level"]),
        device=_frame(dev, ["name", "ts", "dur", "stream", "task_type", "task_id", "connection_id"]),
        hccl_ops=_frame(hops, ["name", "ts", "dur", "group", "connection_id", "data_type", "alg_type", "count"]),
        hccl_tasks=_frame(htasks, ["name", "ts", "dur", "plane", "stream", "task_type", "src_rank", "dst_rank",
                                   "transport", "size_bytes", "link_type", "bandwidth_gbps"]),  # fmt: skip
        op_flows=op_flows,
        aicore_freq=_frame(freq, ["ts", "mhz"]),
        overlap=_frame(ov, ["name", "ts", "dur"]),
        counts=counts,
        process_names={str(k): v for k, v in pname.items()},
        thread_names=tname,
    ), str(path), bad)
