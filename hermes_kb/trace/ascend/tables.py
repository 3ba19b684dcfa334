"""The summary files of a torch_npu export (csv and json beside trace_view.json) as tidy frames.

Header drift handled here: an optional leading ``Device_id`` column, ``Block Num`` for
``Block Dim``, ``N/A`` cells, start times with a trailing tab, extra or missing pipe-utilisation
columns (they depend on the ``aic_metrics`` setting).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from .files import ints, num, read_csv, read_json, require

KERNEL_ALIASES = {
    "block_num": "block_dim", "mix_block_num": "mix_block_dim", "step_id": "step", "task_id": "task_id",
    "stream_id": "stream", "type": "op_type", "accelerator_core": "core_type", "start_time_us": "ts",
    "duration_us": "dur", "wait_time_us": "wait_us", "input_data_types": "input_dtypes",
    "output_data_types": "output_dtypes", "device_id": "device",
}  # fmt: skip
KERNEL_TEXT = ("name", "op_type", "core_type", "op_state", "hf32_eligible", "input_shapes", "input_dtypes",
               "input_formats", "output_shapes", "output_dtypes", "output_formats")  # fmt: skip
KERNEL_INTS = ("step", "device", "model_id", "task_id", "stream", "block_dim", "mix_block_dim", "context_id")


def _note(warnings: list[str] | None, path: Path, text: str) -> None:
    if warnings is not None:
        warnings.append(f"{path}: {text}")


def kernel_details(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    """kernel_details.csv: one row per device compute task with its attributes and pipe metrics."""
    df = read_csv(path, KERNEL_ALIASES)
    require(df, ("name", "ts", "dur"), path)
    out = pd.DataFrame(index=df.index)
    for c in KERNEL_TEXT:
        out[c] = df[c].str.strip('"') if c in df.columns else ""
    for c in KERNEL_INTS:
        out[c] = ints(df[c]) if c in df.columns else -1
    out["ts"] = num(df["ts"])
    out["dur"] = num(df["dur"])
    out["wait_us"] = num(df["wait_us"]) if "wait_us" in df.columns else np.nan
    done = set(KERNEL_TEXT) | set(KERNEL_INTS) | {"ts", "dur", "wait_us"}
    for c in df.columns:  # pipe utilisation and the rest: numeric, names as written (snake_case)
        if c not in done:
            out[c] = num(df[c])
    ts, dur = out["ts"].to_numpy(), out["dur"].to_numpy()
    bad = ~(np.isfinite(ts) & np.isfinite(dur)) | (dur < 0)
    if bad.all() and len(out):
        raise BadTraceError("no row has a readable Start Time / Duration", str(path))
    if bad.any():
        _note(warnings, path, f"skipped {int(bad.sum())} of {len(out)} row(s) with an unreadable or impossible "
                              "Start Time / Duration")  # fmt: skip
    return out[~bad].reset_index(drop=True)


STEP_ALIASES = {
    "computing": "computing_us", "communication_not_overlapped": "comm_not_overlapped_us",
    "overlapped": "overlapped_us", "communication": "comm_us", "free": "free_us", "stage": "stage_us",
    "bubble": "bubble_us", "communication_not_overlapped_and_exclude_receive": "comm_not_overlapped_excl_recv_us",
    "preparing": "preparing_us", "device_id": "device",
}  # fmt: skip


def step_trace_time(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    """step_trace_time.csv: the profiler's own per-step split (µs), one row per step (and rank in
    the cluster variant)."""
    df = read_csv(path, STEP_ALIASES)
    require(df, ("computing_us", "free_us"), path)
    out = pd.DataFrame({"step": ints(df["step"]) if "step" in df.columns else -1})
    if "type" in df.columns and "index" in df.columns:  # cluster_step_trace_time.csv
        out["type"] = df["type"].to_numpy()
        out["index"] = ints(df["index"])
    for c in STEP_ALIASES.values():
        if c.endswith("_us"):
            out[c] = num(df[c]) if c in df.columns else np.nan
    return out


_TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")


def communication(path: Path, warnings: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """communication.json: one row per communication op (step, op, group, start, elapse, transit,
    wait, sync, idle, bytes/time/bandwidth per transport), and the packet-size distribution."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise BadTraceError("expected a JSON object keyed by step", str(path))
    rows, packets = [], []
    ignored: list[str] = []
    for step_key, by_kind in doc.items():
        step = _step_of(step_key)
        if not isinstance(by_kind, dict):
            ignored.append(str(step_key))
            continue
        for kind, ops in by_kind.items():
            if not isinstance(ops, dict):
                ignored.append(f"{step_key}.{kind}")
                continue
            for key, info in ops.items():
                if key == "Total Op Info":
                    continue
                if not isinstance(info, dict):
                    ignored.append(f"{step_key}.{kind}.{key}")
                    continue
                name, _, group = str(key).partition("@")
                t = info.get("Communication Time Info") or {}
                bw = info.get("Communication Bandwidth Info") or {}
                row = {
                    "step": step, "comm_type": str(kind), "name": name, "group": group,
                    "ts": _num(t.get("Start Timestamp(us)")), "dur": _num(t.get("Elapse Time(ms)")) * 1000.0,
                    "transit_us": _num(t.get("Transit Time(ms)")) * 1000.0,
                    "wait_us": _num(t.get("Wait Time(ms)")) * 1000.0,
                    "sync_us": _num(t.get("Synchronization Time(ms)")) * 1000.0,
                    "idle_us": _num(t.get("Idle Time(ms)")) * 1000.0,
                    "wait_ratio": _num(t.get("Wait Time Ratio")),
                    "sync_ratio": _num(t.get("Synchronization Time Ratio")),
                }  # fmt: skip
                for tr in _TRANSPORTS:
                    b = bw.get(tr) or {}
                    low = tr.lower()
                    row[f"{low}_bytes"] = _num(b.get("Transit Size(MB)"), 0.0) * 1e6
                    row[f"{low}_us"] = _num(b.get("Transit Time(ms)"), 0.0) * 1000.0
                    row[f"{low}_gbps"] = _num(b.get("Bandwidth(GB/s)"), 0.0)
                    row[f"{low}_large_packet_ratio"] = _num(b.get("Large Packet Ratio"), np.nan)
                    dist = b.get("Size Distribution") or {}
                    if isinstance(dist, dict):
                        for size_mb, v in dist.items():
                            if isinstance(v, list) and len(v) >= 2:
                                packets.append((step, name, group, tr, _num(size_mb) * 1e6, _num(v[0]), _num(v[1]) * 1000.0))
                if not (np.isfinite(row["ts"]) and np.isfinite(row["dur"]) and row["dur"] >= 0):
                    ignored.append(f"{step_key}.{kind}.{key}")
                    continue
                rows.append(row)
    if ignored:
        _note(warnings, path, f"ignored {len(ignored)} entr(y/ies) that are not communication ops with readable times "
                              f"(first: {ignored[0][:80]!r})")  # fmt: skip
    ops = pd.DataFrame(rows)
    pk = pd.DataFrame(packets, columns=["step", "name", "group", "transport", "packet_bytes", "count", "time_us"])
    return ops, pk


def _step_of(key) -> int:
    digits = "".join(ch for ch in str(key) if ch.isdigit())[:9]
    return int(digits) if digits else -1


def _num(v, default: float = np.nan) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def communication_matrix(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    """communication_matrix.json: bytes, time and bandwidth per (op group, src rank, dst rank)."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise BadTraceError("expected a JSON object keyed by step", str(path))
    rows = []
    ignored = 0
    for step_key, by_kind in doc.items():
        step = _step_of(step_key)
        ignored += not isinstance(by_kind, dict)
        for kind, ops in (by_kind or {}).items() if isinstance(by_kind, dict) else ():
            for key, links in (ops or {}).items() if isinstance(ops, dict) else ():
                op, _, group = str(key).partition("@")
                for pair, v in (links or {}).items() if isinstance(links, dict) else ():
                    src, _, dst = str(pair).partition("-")
                    if not isinstance(v, dict):
                        ignored += 1
                        continue
                    rows.append((step, str(kind), op, group, int(src) if src.isdigit() else -1,
                                 int(dst) if dst.isdigit() else -1, str(v.get("Transport Type", "")),
                                 _num(v.get("Transit Size(MB)"), 0.0) * 1e6, _num(v.get("Transit Time(ms)"), 0.0) * 1000.0,
                                 _num(v.get("Bandwidth(GB/s)"), 0.0), str(v.get("Op Name", ""))))  # fmt: skip
    if ignored:
        _note(warnings, path, f"ignored {ignored} entr(y/ies) that are not link records")
    return pd.DataFrame(rows, columns=["step", "comm_type", "op", "group", "src_rank", "dst_rank", "transport", "bytes",
                                       "time_us", "bandwidth_gbps", "op_name"])  # fmt: skip


def statistic(path: Path, key: str, warnings: list[str] | None = None) -> pd.DataFrame:
    """op_statistic.csv (key op_type) or api_statistic.csv (key api_name): counts and times (µs)."""
    df = read_csv(path, {"op_type": "op_type", "api_name": "api_name", "device_id": "device"})
    require(df, (key, "count"), path)
    out = pd.DataFrame({key: df[key].to_numpy()})
    for c in df.columns:
        if c == key:
            continue
        out[c] = df[c].to_numpy() if c in ("core_type", "level") else num(df[c])
    return out


def memory_record(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    df = read_csv(path, {"timestamp_us": "ts", "total_allocated_mb": "allocated_mb", "total_reserved_mb": "reserved_mb",
                         "total_active_mb": "active_mb"})  # fmt: skip
    require(df, ("ts",), path)
    out = pd.DataFrame({"name": df["component"] if "component" in df.columns else "", "ts": num(df["ts"])})
    for c in ("allocated_mb", "reserved_mb", "active_mb"):
        out[c] = num(df[c]) if c in df.columns else np.nan
    out["device"] = df["device_type"].to_numpy() if "device_type" in df.columns else ""
    bad = ~np.isfinite(out["ts"].to_numpy())
    if bad.any():
        _note(warnings, path, f"skipped {int(bad.sum())} of {len(out)} row(s) with an unreadable timestamp")
    return out[~bad].reset_index(drop=True)
