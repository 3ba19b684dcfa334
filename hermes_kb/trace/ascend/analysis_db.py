"""torch_npu's ``analysis.db``: what communication.json, communication_matrix.json and
step_trace_time.csv hold (``StepTraceTime``, ``CommAnalyzerTime``, ``CommAnalyzerBandwidth``,
``CommAnalyzerMatrix``), in the shapes of the text export's readers; beside a text export, the
tables its files lack (``fill_from_analysis_db``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from .db_file import SqliteFile, empty_frame, int_ids, refused_objects

_TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")
_STEP_COLS = {"computing": "computing_us", "communication_not_overlapped": "comm_not_overlapped_us",
              "overlapped": "overlapped_us", "communication": "comm_us", "free": "free_us", "stage": "stage_us",
              "bubble": "bubble_us", "communication_not_overlapped_and_exclude_receive": "comm_not_overlapped_excl_recv_us",
              "preparing": "preparing_us"}  # fmt: skip


def _step_num(s: pd.Series) -> np.ndarray:
    return np.array([int("".join(ch for ch in str(v) if ch.isdigit()) or -1) for v in s], dtype=np.int64)


def _f(s: pd.Series, scale: float = 1.0) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(np.float64) * scale


def read_analysis_db(path: Path, warnings: list[str]) -> dict[str, pd.DataFrame | None]:
    """analysis.db -> ``step_stats``, ``comm_ops``, ``comm_packets``, ``comm_matrix`` (each None
    when its table is absent), in the shapes of the text export's readers."""
    db = SqliteFile(path)
    try:
        warnings += refused_objects(db)
        return _analysis(db, warnings)
    finally:
        db.close()


def _analysis(db: SqliteFile, warnings: list[str]) -> dict[str, pd.DataFrame | None]:
    out: dict[str, pd.DataFrame | None] = {"step_stats": None, "comm_ops": None, "comm_packets": None, "comm_matrix": None}
    if not db.tables & {"StepTraceTime", "CommAnalyzerTime", "CommAnalyzerBandwidth", "CommAnalyzerMatrix"}:
        warnings.append(f"{db.path.name}: none of StepTraceTime, CommAnalyzerTime, CommAnalyzerBandwidth, CommAnalyzerMatrix")
        return out
    if db.has("StepTraceTime", "computing", "free"):
        s = db.query("SELECT * FROM StepTraceTime", "StepTraceTime")
        st = pd.DataFrame({"step": _step_num(s["step"]) if "step" in s.columns else np.full(len(s), -1, np.int64)})
        if "type" in s.columns and "index" in s.columns:
            st["type"] = s["type"].astype(str).to_numpy()
            st["index"] = int_ids(s["index"])
        for k, c in _STEP_COLS.items():
            st[c] = _f(s[k]) if k in s.columns else np.nan
        out["step_stats"] = st
    t_cols = ("hccl_op_name", "group_name", "start_timestamp", "elapse_time", "transit_time", "wait_time",
              "synchronization_time", "idle_time", "step", "type")  # fmt: skip
    if db.has("CommAnalyzerTime", *t_cols):
        t = db.query(f"SELECT {', '.join(t_cols)} FROM CommAnalyzerTime", "CommAnalyzerTime")
        transit, wait, sync = _f(t["transit_time"], 1000.0), _f(t["wait_time"], 1000.0), _f(t["synchronization_time"], 1000.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            wr = np.where(wait + transit > 0, np.round(wait / (wait + transit), 4), 0.0)
            sr = np.where(sync + transit > 0, np.round(sync / (sync + transit), 4), 0.0)
        ops = pd.DataFrame({"step": _step_num(t["step"]), "comm_type": t["type"].astype(str).to_numpy(),
                            "name": t["hccl_op_name"].astype(str).to_numpy(), "group": t["group_name"].astype(str).to_numpy(),
                            "ts": _f(t["start_timestamp"]), "dur": _f(t["elapse_time"], 1000.0), "transit_us": transit,
                            "wait_us": wait, "sync_us": sync, "idle_us": _f(t["idle_time"], 1000.0), "wait_ratio": wr,
                            "sync_ratio": sr})  # fmt: skip
        bw_cols = ("hccl_op_name", "group_name", "transport_type", "transit_size", "transit_time", "bandwidth",
                   "large_packet_ratio", "package_size", "count", "total_duration", "step")  # fmt: skip
        bw = db.query(f"SELECT {', '.join(bw_cols)} FROM CommAnalyzerBandwidth", "CommAnalyzerBandwidth") \
            if db.has("CommAnalyzerBandwidth", *bw_cols) else None  # fmt: skip
        if bw is None:
            warnings.append(f"{db.path.name}: no CommAnalyzerBandwidth table: no bytes or bandwidth per communication op")
        key = bw.groupby(["hccl_op_name", "group_name", "transport_type"]).first() if bw is not None and len(bw) else None
        for tr in _TRANSPORTS:
            low = tr.lower()
            cols = {f"{low}_bytes": ("transit_size", 1e6), f"{low}_us": ("transit_time", 1000.0), f"{low}_gbps": ("bandwidth", 1.0),
                    f"{low}_large_packet_ratio": ("large_packet_ratio", 1.0)}  # fmt: skip
            for c, (src, scale) in cols.items():
                vals = np.zeros(len(ops))
                if key is not None:
                    idx = pd.MultiIndex.from_arrays([ops["name"], ops["group"], np.full(len(ops), tr)])
                    got = key[src].reindex(idx)
                    vals = np.nan_to_num(pd.to_numeric(got, errors="coerce").to_numpy(np.float64) * scale, nan=0.0)
                ops[c] = vals
        out["comm_ops"] = ops
        pk = empty_frame(["step", "name", "group", "transport", "packet_bytes", "count", "time_us"])
        if bw is not None and len(bw):
            b = bw[pd.to_numeric(bw["count"], errors="coerce").fillna(0) > 0]
            pk = pd.DataFrame({"step": _step_num(b["step"]), "name": b["hccl_op_name"].astype(str).to_numpy(),
                               "group": b["group_name"].astype(str).to_numpy(), "transport": b["transport_type"].astype(str).to_numpy(),
                               "packet_bytes": _f(b["package_size"], 1e6), "count": _f(b["count"]),
                               "time_us": _f(b["total_duration"], 1000.0)})  # fmt: skip
        out["comm_packets"] = pk
    m_cols = ("hccl_op_name", "group_name", "src_rank", "dst_rank", "transport_type", "transit_size", "transit_time",
              "bandwidth", "step", "type", "op_name")  # fmt: skip
    if db.has("CommAnalyzerMatrix", *m_cols):
        m = db.query(f"SELECT {', '.join(m_cols)} FROM CommAnalyzerMatrix", "CommAnalyzerMatrix")
        out["comm_matrix"] = pd.DataFrame({
            "step": _step_num(m["step"]), "comm_type": m["type"].astype(str).to_numpy(), "op": m["hccl_op_name"].astype(str).to_numpy(),
            "group": m["group_name"].astype(str).to_numpy(), "src_rank": int_ids(m["src_rank"]), "dst_rank": int_ids(m["dst_rank"]),
            "transport": m["transport_type"].astype(str).to_numpy(), "bytes": _f(m["transit_size"], 1e6),
            "time_us": _f(m["transit_time"], 1000.0), "bandwidth_gbps": _f(m["bandwidth"]), "op_name": m["op_name"].astype(str).to_numpy(),
        })  # fmt: skip
    return out


def fill_from_analysis_db(path: Path, tables: dict, comm_ops, comm_packets, warnings: list[str]):
    """Beside a text export: the tables its files lack (step_stats, comm_matrix, comm_ops), from
    analysis.db; a damaged analysis.db is then only a warning."""
    try:
        an = read_analysis_db(path, warnings)
    except BadTraceError as exc:
        warnings.append(f"skipped {exc}")
        return comm_ops, comm_packets
    for k in ("step_stats", "comm_matrix"):
        if tables.get(k) is None and an[k] is not None:
            tables[k] = an[k]
    if comm_ops is None and an["comm_ops"] is not None:
        comm_ops, comm_packets = an["comm_ops"], an["comm_packets"]
    return comm_ops, comm_packets
