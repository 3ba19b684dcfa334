"""The profiler db's tables besides the timeline: AI Core frequency (``AICORE_FREQ``), the
profiler's own overlap analysis (``OVERLAP_ANALYSIS``), the memory record (``MEMORY_RECORD`` +
``NPU_MEM``), and op_statistic / api_statistic computed from the tasks and calls as the text
export writes them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .db_file import SqliteFile, dur_us, empty_frame, int_ids, interned, ns_to_us

_OVERLAP = {0: "Computing", 1: "Communication", 2: "Communication(Not Overlapped)", 3: "Free"}


def aicore_freq(db: SqliteFile) -> pd.DataFrame:
    if not db.has("AICORE_FREQ", "timestampNs", "freq"):
        return empty_frame(["ts", "mhz"])
    f = db.query("SELECT timestampNs, freq FROM AICORE_FREQ", "AICORE_FREQ")
    out = pd.DataFrame({"ts": ns_to_us(f["timestampNs"]), "mhz": pd.to_numeric(f["freq"], errors="coerce").to_numpy(np.float64)})
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def overlap_intervals(db: SqliteFile) -> pd.DataFrame:
    if not db.has("OVERLAP_ANALYSIS", "startNs", "endNs", "type"):
        return empty_frame(["name", "ts", "dur"])
    o = db.query("SELECT startNs, endNs, type FROM OVERLAP_ANALYSIS", "OVERLAP_ANALYSIS")
    ts = ns_to_us(o["startNs"])
    out = pd.DataFrame({"name": [_OVERLAP.get(int(x), str(x)) for x in int_ids(o["type"])], "ts": ts, "dur": dur_us(o["startNs"], o["endNs"])})
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def memory_record(db: SqliteFile, st: dict[int, str]) -> pd.DataFrame | None:
    """MEMORY_RECORD (PTA / GE / PTA+GE) and NPU_MEM (the process total, ``APP``) as memory_record.csv."""
    mb = float(1 << 20)
    parts = []
    if db.has("NPU_MEM", "type", "hbm", "timestampNs"):
        m = db.query(f"SELECT type, hbm, {'ddr' if db.has('NPU_MEM', 'ddr') else '0'} AS ddr, timestampNs, "
                     f"{'deviceId' if db.has('NPU_MEM', 'deviceId') else '0'} AS deviceId FROM NPU_MEM", "NPU_MEM")  # fmt: skip
        reserved = (pd.to_numeric(m["hbm"], errors="coerce").fillna(0) + pd.to_numeric(m["ddr"], errors="coerce").fillna(0)) / mb
        parts.append(pd.DataFrame({"name": interned(m["type"], st).replace("", "APP").to_numpy(), "ts": ns_to_us(m["timestampNs"]),
                                   "allocated_mb": np.nan, "reserved_mb": reserved.to_numpy(np.float64), "active_mb": np.nan,
                                   "device": [f"NPU:{d}" for d in int_ids(m["deviceId"], 0)]}))  # fmt: skip
    if db.has("MEMORY_RECORD", "component", "timestamp", "totalAllocated", "totalReserved"):
        active = "totalActive" if db.has("MEMORY_RECORD", "totalActive") else "NULL"
        dev = "deviceId" if db.has("MEMORY_RECORD", "deviceId") else "0"
        m = db.query(f"SELECT component, timestamp, totalAllocated, totalReserved, {active} AS totalActive, {dev} AS deviceId "
                     "FROM MEMORY_RECORD", "MEMORY_RECORD")  # fmt: skip
        parts.append(pd.DataFrame({"name": interned(m["component"], st).to_numpy(), "ts": ns_to_us(m["timestamp"]),
                                   **{c: pd.to_numeric(m[k], errors="coerce").to_numpy(np.float64) / mb
                                      for c, k in (("allocated_mb", "totalAllocated"), ("reserved_mb", "totalReserved"),
                                                   ("active_mb", "totalActive"))},
                                   "device": [f"NPU:{d}" for d in int_ids(m["deviceId"], 0)]}))  # fmt: skip
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    out = out[~np.isnan(out["ts"].to_numpy())]
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def op_statistic(kd: pd.DataFrame | None) -> pd.DataFrame | None:
    """op_statistic.csv from the compute tasks: per (op type, core type) count and times (µs)."""
    if kd is None or not len(kd):
        return None
    g = kd.groupby(["op_type", "core_type"], sort=False)["dur"]
    out = g.agg(count="count", total_time_us="sum", min_time_us="min", avg_time_us="mean", max_time_us="max").reset_index()
    out["count"] = out["count"].astype(np.float64)
    total = float(out["total_time_us"].sum())
    out["ratio_pct"] = out["total_time_us"] / total * 100.0 if total > 0 else 0.0
    out = out.sort_values("total_time_us", ascending=False, kind="stable").reset_index(drop=True)
    return out[["op_type", "core_type", "count", "total_time_us", "min_time_us", "avg_time_us", "max_time_us", "ratio_pct"]]


def api_statistic(cann: pd.DataFrame) -> pd.DataFrame | None:
    """api_statistic.csv from the CANN calls: per (level, API) time, count, avg, min, max, variance."""
    if not len(cann):
        return None
    c = pd.DataFrame({"api_name": cann["name"].str.split("@", n=1).str[-1], "level": cann["level"].astype(str),
                      "dur": cann["dur"]})  # fmt: skip
    g = c.groupby(["api_name", "level"], sort=False)["dur"]
    out = g.agg(time_us="sum", count="count", avg_us="mean", min_us="min", max_us="max",
                variance=lambda s: float(np.var(s.to_numpy()))).reset_index()  # fmt: skip
    out["count"] = out["count"].astype(np.float64)
    out = out.sort_values("time_us", ascending=False, kind="stable").reset_index(drop=True)
    return out[["api_name", "level", "time_us", "count", "avg_us", "min_us", "max_us", "variance"]]
