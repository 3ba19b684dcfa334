"""torch_npu's sqlite export (``export_type="db"``) into the same RankTrace as the text export.

``ascend_pytorch_profiler_<rank>.db`` holds what trace_view.json and kernel_details.csv hold,
as tables with interned strings (``STRING_IDS``) and ns integer times; ``analysis.db`` holds
what communication.json, communication_matrix.json and step_trace_time.csv hold. Each table is
turned into the intermediate frame the text readers produce (``Timeline``, the kernel_details
frame, ``comm_ops`` / ``comm_packets``, the summary tables, the memory record) and handed to
``build_rank``, so both exports give the same frames, columns and dtypes:

- ``PYTORCH_API``: ``type`` op -> host operators, queue -> task queue (Enqueue / Dequeue@...),
  trace -> Python functions, mstx -> host ranges; ``globalTid`` = pid << 32 | tid;
- ``CANN_API``: CANN calls, named ``<AscendCL|Node|Hccl|...>@<name>`` as in trace_view.json;
- ``TASK`` + ``COMPUTE_TASK_INFO`` (+ ``TASK_PMU_INFO`` pivoted): device compute tasks and the
  kernel_details columns; ``TASK`` without either info table: copies, events, markers;
- ``COMMUNICATION_OP`` / ``COMMUNICATION_TASK_INFO``: HCCL ops and their transfer tasks;
- host op -> device task (the text export's ``async_npu`` flows): ``PYTORCH_API.connectionId``
  -> ``CONNECTION_IDS`` -> ``TASK.connectionId`` / ``COMMUNICATION_OP.connectionId``;
- ``OVERLAP_ANALYSIS``, ``AICORE_FREQ``, ``MEMORY_RECORD`` (+ ``NPU_MEM`` as ``APP``),
  ``NPU_INFO``, ``META_DATA``, ``RANK_DEVICE_MAP``, ``STEP_TIME`` (step of each task).

Kernel tasks (``KERNEL_*``, ``AI_CORE``, ``MIX_*`` ...) without a COMPUTE_TASK_INFO row are left
out, as the profiler's own overlap analysis and the text export do (they are the HCCL ops'
launch entries and unnamed helper kernels); their number is in ``counts``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError, as_rank
from ...core import limits
from .files import AscendFiles, AscendMeta, read_meta
from .tables import KERNEL_INTS, KERNEL_TEXT
from .timeline import Timeline
from .timeline import validate as validate_timeline
from ..columns import call_tree

_API_TYPES = {5000: "runtime", 5500: "hccl", 10000: "node", 15000: "model", 20000: "acl",
              50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"}  # fmt: skip
_CANN_PREFIX = {"acl": "AscendCL", "node": "Node", "hccl": "Hccl", "runtime": "Runtime", "model": "Model"}
_OVERLAP = {0: "Computing", 1: "Communication", 2: "Communication(Not Overlapped)", 3: "Free"}
_TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")
_KERNEL_TASK_RE = re.compile(r"^(KERNEL_|AI_CORE|AI_CPU|AI_VECTOR|AIV|MIX_|FFTS)", re.IGNORECASE)
_NA_ID = 4294967295  # UINT32_MAX: "not applicable" in TASK.contextId / modelId and rank columns
_MASK32 = 0xFFFFFFFF
_STEP_COLS = {"computing": "computing_us", "communication_not_overlapped": "comm_not_overlapped_us",
              "overlapped": "overlapped_us", "communication": "comm_us", "free": "free_us", "stage": "stage_us",
              "bubble": "bubble_us", "communication_not_overlapped_and_exclude_receive": "comm_not_overlapped_excl_recv_us",
              "preparing": "preparing_us"}  # fmt: skip


class _Db:
    """A read-only sqlite file: its tables and columns, and queries that fail as BadTraceError."""

    def __init__(self, path: Path):
        self.path = path
        limits.check_size(path, what="a sqlite database")  # a FIFO or device is refused, never opened
        try:
            # read-only and immutable: sqlite never writes -shm / -wal files beside it (a WAL-mode
            # export in a read-only directory fails otherwise), never takes a lock
            self.con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
            self.tables = {r[0] for r in rows}
            self.columns = {t: {r[1] for r in self.con.execute(f'PRAGMA table_info("{t}")')} for t in self.tables}
        except sqlite3.Error as exc:
            raise BadTraceError(f"not a readable sqlite database ({_one_line(exc)})", str(path)) from None
        self._strings: dict[int, str] | None = None

    def close(self) -> None:
        self.con.close()

    def has(self, table: str, *cols: str) -> bool:
        return table in self.tables and all(c in self.columns[table] for c in cols)

    def query(self, sql: str, what: str) -> pd.DataFrame:
        try:
            return pd.read_sql_query(sql, self.con)
        except (sqlite3.Error, pd.errors.DatabaseError, ValueError) as exc:
            raise BadTraceError(f"cannot read {what} ({_one_line(exc)})", str(self.path)) from None

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            df = self.query("SELECT id, value FROM STRING_IDS", "STRING_IDS") if self.has("STRING_IDS", "id", "value") else None
            self._strings = {} if df is None else dict(zip(df["id"].astype(np.int64), df["value"].astype(object).fillna("").astype(str)))
        return self._strings

    def enum(self, table: str, default: dict[int, str] | None = None) -> dict[int, str]:
        out = dict(default or {})
        if self.has(table, "id", "name"):
            df = self.query(f'SELECT id, name FROM "{table}"', table)
            out.update(zip(df["id"].astype(np.int64), df["name"].astype(str)))
        return out


def _one_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:160]


def _s(ids: pd.Series, table: dict[int, str]) -> pd.Series:
    """Interned string ids -> their text ("" when missing)."""
    v = pd.to_numeric(ids, errors="coerce")
    return v.map(lambda i: table.get(int(i), "") if i == i else "").astype(object).astype(str)


def _i64(s: pd.Series, default: int = -1) -> np.ndarray:
    """An id column as int64 (exact for integer cells); any other cell is ``default``."""
    v, ok = _exact_ints(s)
    v = v.copy()
    v[~ok] = default
    return v


def _us(ns: pd.Series) -> np.ndarray:
    """ns integers -> µs floats (the same arithmetic for every table, so joins on time agree);
    a cell that is not an integer is NaN (dropped and counted by the timeline's checks)."""
    v, ok = _exact_ints(ns)
    out = v.astype(np.float64) / 1000.0
    out[~ok] = np.nan
    return out


def _exact_ints(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, which are numbers) of an ns column, exact even when some cells are garbage
    (a column with text in it comes back as objects; through floats its ns would lose precision)."""
    if pd.api.types.is_integer_dtype(s.dtype):
        return s.to_numpy(np.int64).copy(), np.ones(len(s), dtype=bool)
    if pd.api.types.is_float_dtype(s.dtype):
        v = s.to_numpy(np.float64)
        ok = np.isfinite(v) & (np.abs(v) < 9.2e18)
        out = np.zeros(len(v), dtype=np.int64)
        out[ok] = v[ok].astype(np.int64)
        return out, ok
    out = np.zeros(len(s), dtype=np.int64)
    ok = np.zeros(len(s), dtype=bool)
    for i, v in enumerate(s.to_numpy(object).tolist()):
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            v = int(v)
        elif isinstance(v, str) and v.strip().lstrip("+-").isdigit():
            v = int(v.strip())
        if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
            out[i], ok[i] = v, True
    return out, ok


def _dur(start: pd.Series, end: pd.Series) -> np.ndarray:
    """µs between two ns columns, subtracted as integers (µs floats near 1.7e15 resolve only 0.25 µs)."""
    a, ok_a = _exact_ints(start)
    b, ok_b = _exact_ints(end)
    ok = ok_a & ok_b
    out = np.full(len(a), np.nan)
    out[ok] = (b[ok] - a[ok]) / 1000.0
    return out


def _frame(cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in cols})


# ---- the profiler db -----------------------------------------------------------------------


def _meta(db: _Db, meta_a: AscendMeta, counts: dict[str, int]) -> None:
    if db.has("NPU_INFO", "name"):
        names = db.query("SELECT name FROM NPU_INFO", "NPU_INFO")["name"].dropna().astype(str)
        if len(names) and names.iloc[0]:
            meta_a.device_name = names.iloc[0]
    if db.has("META_DATA", "name", "value"):
        for name, value in db.query("SELECT name, value FROM META_DATA", "META_DATA").itertuples(index=False):
            name, value = str(name), "" if value is None else str(value)
            if name == "ENV_VARIABLES":
                try:
                    env = json.loads(value)
                except ValueError:
                    env = None
                if isinstance(env, dict):
                    for k, v in env.items():
                        meta_a.env.setdefault(str(k), "" if v is None else str(v))
            elif name == "SCHEMA_VERSION":
                meta_a.versions["db_schema_version"] = value
    if db.has("RANK_DEVICE_MAP", "rankId"):
        rm = db.query("SELECT * FROM RANK_DEVICE_MAP", "RANK_DEVICE_MAP")
        if len(rm) and meta_a.rank is None:
            r = int(pd.to_numeric(rm["rankId"], errors="coerce").fillna(-1).iloc[0])
            meta_a.rank = as_rank(r)
    for t in sorted(db.tables):
        try:
            counts[f"db:{t}"] = int(db.con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])
        except sqlite3.Error:
            pass


def _host(db: _Db, st: dict[int, str], warnings: list[str]):
    """PYTORCH_API -> host ops, Python functions, task queue; plus each row's connection ids."""
    cols = ["name", "ts", "dur", "tid", "pid", "seq", "fwd_tid", "input_dims", "input_types"]
    empty = (_frame(cols), _frame(["name", "ts", "dur", "tid", "py_id", "parent_id"]),
             _frame(["name", "ts", "dur", "tid", "kind", "correlation"]), _frame(["tid", "ts", "connection_id"]))  # fmt: skip
    if not db.has("PYTORCH_API", "startNs", "endNs", "globalTid", "name", "type"):
        warnings.append(f"{db.path.name}: no PYTORCH_API table: no host operators")
        return empty
    opt = {c: c if db.has("PYTORCH_API", c) else "NULL" for c in
           ("connectionId", "sequenceNumber", "fwdThreadId", "inputDtypes", "inputShapes")}  # fmt: skip
    p = db.query("SELECT CAST(startNs AS INTEGER) AS s, CAST(endNs AS INTEGER) AS e, globalTid, name, type, "
                 + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM PYTORCH_API", "PYTORCH_API")  # fmt: skip
    types = db.enum("ENUM_API_TYPE", _API_TYPES)
    kind = _i64(p["type"]).astype(object)
    kind = np.array([types.get(int(k), "") for k in kind], dtype=object)
    gtid = _i64(p["globalTid"], 0)
    base = pd.DataFrame({"name": _s(p["name"], st), "ts": _us(p["s"]), "tid": gtid & _MASK32, "pid": gtid >> 32})
    base["dur"] = _dur(p["s"], p["e"])
    base = base[["name", "ts", "dur", "tid", "pid"]]
    ok = ~np.isnan(base["ts"].to_numpy()) & ~np.isnan(base["dur"].to_numpy())
    _unreadable(db, "PYTORCH_API", int((~ok).sum()), warnings)

    is_op = ok & np.isin(kind, ("op", "mstx"))
    ops = base[is_op].copy()
    ops["seq"] = _i64(p.loc[is_op, "sequenceNumber"])
    ops["fwd_tid"] = _i64(p.loc[is_op, "fwdThreadId"])
    ops["input_dims"] = _s(p.loc[is_op, "inputShapes"], st).to_numpy()
    ops["input_types"] = _s(p.loc[is_op, "inputDtypes"], st).to_numpy()
    ops = ops.sort_values("ts", kind="stable").reset_index(drop=True)

    is_py = ok & (kind == "trace")
    py = base[is_py][["name", "ts", "dur", "tid"]].sort_values("ts", kind="stable").reset_index(drop=True)
    par, _ = call_tree(py["tid"].to_numpy(np.int64), py["ts"].to_numpy(np.float64), (py["ts"] + py["dur"]).to_numpy(np.float64))
    py["py_id"] = np.arange(len(py), dtype=np.int64)
    py["parent_id"] = np.asarray(par, dtype=np.int64)

    is_q = ok & (kind == "queue")
    q = base[is_q][["name", "ts", "dur", "tid"]].copy()
    q["kind"] = np.where(q["name"].str.startswith("Enqueue"), "enqueue", "dequeue")
    q["correlation"] = _i64(p.loc[is_q, "connectionId"])  # an index into CONNECTION_IDS; resolved below

    links = pd.DataFrame({"tid": base["tid"].to_numpy()[is_op], "ts": base["ts"].to_numpy()[is_op],
                          "connection_id": _i64(p.loc[is_op, "connectionId"])})  # fmt: skip
    links = links[links["connection_id"] >= 0]
    if db.has("CONNECTION_IDS", "id", "connectionId"):
        ci = db.query("SELECT id, connectionId FROM CONNECTION_IDS", "CONNECTION_IDS")
        ci = pd.DataFrame({"id": _i64(ci["id"]), "cid": _i64(ci["connectionId"])})
        links = links.merge(ci, left_on="connection_id", right_on="id", how="inner")[["tid", "ts", "cid"]]
        links = links.rename(columns={"cid": "connection_id"})
        first = ci.drop_duplicates("id").set_index("id")["cid"]
        q["correlation"] = first.reindex(q["correlation"].to_numpy()).fillna(-1).to_numpy(np.float64).astype(np.int64)
    elif len(links) or len(q):
        warnings.append(f"{db.path.name}: no CONNECTION_IDS table: host operators are not linked to device tasks")
        links = links.iloc[0:0]
    q = q.sort_values("ts", kind="stable").reset_index(drop=True)
    return ops, py, q, links.reset_index(drop=True)


def _cann(db: _Db, st: dict[int, str], warnings: list[str]) -> pd.DataFrame:
    cols = ["name", "ts", "dur", "tid", "connection_id", "level"]
    if not db.has("CANN_API", "startNs", "endNs", "type", "globalTid", "connectionId", "name"):
        warnings.append(f"{db.path.name}: no CANN_API table: no CANN calls (runtime frame empty)")
        return _frame(cols)
    c = db.query("SELECT startNs, endNs, type, globalTid, connectionId, name FROM CANN_API", "CANN_API")
    types = db.enum("ENUM_API_TYPE", _API_TYPES)
    level = [types.get(int(t), str(t)) for t in _i64(c["type"])]
    raw = _s(c["name"], st)
    name = [n if "@" in n else f"{_CANN_PREFIX.get(lv, lv.capitalize())}@{n}" for n, lv in zip(raw, level)]
    ts = _us(c["startNs"])
    out = pd.DataFrame({"name": name, "ts": ts, "dur": _dur(c["startNs"], c["endNs"]), "tid": _i64(c["globalTid"], 0) & _MASK32,
                        "connection_id": _i64(c["connectionId"]), "level": level})  # fmt: skip
    ok = ~np.isnan(out["ts"].to_numpy()) & ~np.isnan(out["dur"].to_numpy())
    _unreadable(db, "CANN_API", int((~ok).sum()), warnings)
    return out[ok].sort_values("ts", kind="stable").reset_index(drop=True)


def _unreadable(db: _Db, table: str, n: int, warnings: list[str]) -> None:
    """Rows whose times are not integers (garbage in the table) are left out, and named."""
    if n:
        warnings.append(f"{db.path}: {table}: skipped {n} row(s) whose startNs / endNs is not an integer")


def _steps_of(ts: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    out = np.full(len(ts), -1, dtype=np.int64)
    if steps is None:
        return out
    for sid, a, b in zip(steps["id"], steps["ts"], steps["end"]):
        out[(ts >= a) & (ts < b)] = int(sid)
    return out


def _pmu_column(name: str) -> str:
    """TASK_PMU_INFO metric -> the kernel_details.csv column (snake_case) the text export has."""
    n = re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_")
    if n in ("aic_total_time", "aicore_time"):
        return "aicore_time_us"
    if n in ("aiv_total_time", "aiv_time"):
        return "aiv_time_us"
    return f"{n}_us" if n.endswith("_time") else n


def _device(db: _Db, st: dict[int, str], steps: pd.DataFrame | None, warnings: list[str], counts: dict[str, int]):
    """TASK (+ COMPUTE_TASK_INFO, TASK_PMU_INFO, COMMUNICATION_*) -> device tasks, kernel details,
    HCCL ops and HCCL tasks."""
    dev_cols = ["name", "ts", "dur", "stream", "task_type", "task_id", "connection_id"]
    hop_cols = ["name", "ts", "dur", "group", "connection_id", "data_type", "alg_type", "count"]
    ht_cols = ["name", "ts", "dur", "plane", "stream", "task_type", "src_rank", "dst_rank", "transport", "size_bytes",
               "link_type", "bandwidth_gbps"]  # fmt: skip
    hops = _hccl_ops(db, st)
    if not db.has("TASK", "startNs", "endNs", "globalTaskId", "taskType", "streamId"):
        warnings.append(f"{db.path.name}: no TASK table: no device tasks")
        return _frame(dev_cols), None, hops if hops is not None else _frame(hop_cols), _frame(ht_cols)
    opt = {c: c if db.has("TASK", c) else "NULL" for c in ("deviceId", "connectionId", "contextId", "taskId", "modelId")}
    t = db.query("SELECT startNs, endNs, globalTaskId, taskType, streamId, "
                 + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM TASK", "TASK")  # fmt: skip
    t["ts"] = _us(t["startNs"])
    t["dur"] = _dur(t["startNs"], t["endNs"])
    t["type_name"] = _s(t["taskType"], st)
    t["gid"] = _i64(t["globalTaskId"])
    ok = ~np.isnan(t["ts"].to_numpy()) & ~np.isnan(t["dur"].to_numpy())
    _unreadable(db, "TASK", int((~ok).sum()), warnings)
    t = t[ok]

    ci_cols = ("name", "globalTaskId", "blockDim", "mixBlockDim", "taskType", "opType", "inputFormats", "inputDataTypes",
               "inputShapes", "outputFormats", "outputDataTypes", "outputShapes")  # fmt: skip
    if db.has("COMPUTE_TASK_INFO", *ci_cols):
        wait = "waitNs" if db.has("COMPUTE_TASK_INFO", "waitNs") else "NULL"
        ci = db.query(f"SELECT {', '.join(ci_cols)}, {wait} AS waitNs FROM COMPUTE_TASK_INFO", "COMPUTE_TASK_INFO")
    else:
        warnings.append(f"{db.path.name}: no COMPUTE_TASK_INFO table: device compute tasks have no names or attributes")
        ci = pd.DataFrame({c: [] for c in (*ci_cols, "waitNs")})
    ci["gid"] = _i64(ci["globalTaskId"])
    ci = ci.drop_duplicates("gid")
    comp = t.merge(ci.drop(columns=["globalTaskId"]).rename(columns={"taskType": "ci_type", "name": "ci_name"}),
                   on="gid", how="inner")  # fmt: skip

    comm_gids: set[int] = set()
    ht = _frame(ht_cols)
    ct_cols = ("name", "globalTaskId", "taskType", "planeId", "srcRank", "dstRank", "transportType", "size", "linkType")
    if db.has("COMMUNICATION_TASK_INFO", *ct_cols):
        ct = db.query(f"SELECT {', '.join(ct_cols)} FROM COMMUNICATION_TASK_INFO", "COMMUNICATION_TASK_INFO")
        ct["gid"] = _i64(ct["globalTaskId"])
        comm_gids = set(ct["gid"].tolist())
        m = t.merge(ct.drop(columns=["globalTaskId"]).rename(columns={"name": "op_name", "taskType": "ct_type"}), on="gid",
                    how="inner")
        transport = db.enum("ENUM_HCCL_TRANSPORT_TYPE")
        link = db.enum("ENUM_HCCL_LINK_TYPE")
        size = pd.to_numeric(m["size"], errors="coerce").to_numpy(np.float64)
        dur_ns = pd.to_numeric(m["endNs"], errors="coerce").to_numpy(np.float64) - pd.to_numeric(m["startNs"], errors="coerce").to_numpy(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            bw = np.where(dur_ns > 0, size / dur_ns, 0.0)  # bytes per ns = GB/s
        ttype = _s(m["ct_type"], st)
        ht = pd.DataFrame({
            "name": ttype.to_numpy(), "ts": m["ts"].to_numpy(), "dur": m["dur"].to_numpy(), "plane": _i64(m["planeId"]),
            "stream": _i64(m["streamId"]), "task_type": ttype.to_numpy(), "src_rank": _i64(m["srcRank"]),
            "dst_rank": _i64(m["dstRank"]), "transport": [transport.get(int(x), "") for x in _i64(m["transportType"])],
            "size_bytes": size, "link_type": [link.get(int(x), "") for x in _i64(m["linkType"])], "bandwidth_gbps": bw,
        }).sort_values("ts", kind="stable").reset_index(drop=True)  # fmt: skip

    # device frame: compute tasks (named by COMPUTE_TASK_INFO), then the rest except HCCL tasks and
    # kernel launches that have no COMPUTE_TASK_INFO row (the text export does not show them either)
    comp_gids = set(comp["gid"].tolist())
    rest = t[~t["gid"].isin(comp_gids) & ~t["gid"].isin(comm_gids)]
    unnamed = rest["type_name"].str.match(_KERNEL_TASK_RE).to_numpy(dtype=bool)
    if unnamed.any():
        counts["db:TASK kernels without COMPUTE_TASK_INFO (left out)"] = int(unnamed.sum())
    rest = rest[~unnamed]
    comm_t = t[t["gid"].isin(comm_gids)]

    def dev_rows(df: pd.DataFrame, name: pd.Series, ttype: pd.Series) -> pd.DataFrame:
        return pd.DataFrame({"name": np.asarray(name, dtype=object), "ts": df["ts"].to_numpy(), "dur": df["dur"].to_numpy(),
                             "stream": _i64(df["streamId"]), "task_type": np.asarray(ttype, dtype=object),
                             "task_id": _i64(df["taskId"]), "connection_id": _i64(df["connectionId"])})  # fmt: skip

    comp_name = _s(comp["ci_name"], st)
    comp_core = _s(comp["ci_type"], st)
    parts = [dev_rows(comp, comp_name, comp_core.where(comp_core != "", comp["type_name"])),
             dev_rows(rest, rest["type_name"], rest["type_name"]),
             dev_rows(comm_t, comm_t["type_name"], comm_t["type_name"])]  # on HCCL streams: build_rank sets them aside
    dev = pd.concat(parts, ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)

    # kernel_details-like frame
    n = len(comp)
    kd = pd.DataFrame(index=range(n))
    text = {"name": comp_name, "op_type": _s(comp["opType"], st), "core_type": comp_core,
            "input_shapes": _s(comp["inputShapes"], st), "input_dtypes": _s(comp["inputDataTypes"], st),
            "input_formats": _s(comp["inputFormats"], st), "output_shapes": _s(comp["outputShapes"], st),
            "output_dtypes": _s(comp["outputDataTypes"], st), "output_formats": _s(comp["outputFormats"], st)}  # fmt: skip
    for c in KERNEL_TEXT:  # op_state and hf32_eligible are not in the db
        kd[c] = text[c].to_numpy() if c in text else ""
    ctx = _i64(comp["contextId"])
    ints = {"step": _steps_of(comp["ts"].to_numpy(), steps), "device": _i64(comp["deviceId"], 0), "model_id": _i64(comp["modelId"]),
            "task_id": _i64(comp["taskId"]), "stream": _i64(comp["streamId"]), "block_dim": _i64(comp["blockDim"]),
            "mix_block_dim": _i64(comp["mixBlockDim"]), "context_id": np.where(ctx == _NA_ID, -1, ctx)}  # fmt: skip
    for c in KERNEL_INTS:
        kd[c] = ints[c]
    kd["ts"] = comp["ts"].to_numpy()
    kd["dur"] = comp["dur"].to_numpy()
    kd["wait_us"] = pd.to_numeric(comp["waitNs"], errors="coerce").to_numpy(np.float64) / 1000.0
    if n and db.has("TASK_PMU_INFO", "globalTaskId", "name", "value"):
        pmu = db.query("SELECT globalTaskId, name, value FROM TASK_PMU_INFO", "TASK_PMU_INFO")
        if len(pmu):
            pmu["col"] = _s(pmu["name"], st).map(_pmu_column)
            pmu["value"] = pd.to_numeric(pmu["value"], errors="coerce")
            wide = pmu.pivot_table(index="globalTaskId", columns="col", values="value", aggfunc="first")
            got = wide.reindex(comp["gid"].to_numpy())
            for c in wide.columns:
                if c and c not in kd.columns:
                    kd[c] = got[c].to_numpy(np.float64)
    kd = kd.sort_values("ts", kind="stable").reset_index(drop=True)
    return dev, kd, hops if hops is not None else _frame(hop_cols), ht


def _hccl_ops(db: _Db, st: dict[int, str]) -> pd.DataFrame | None:
    cols = ("opName", "startNs", "endNs", "connectionId", "groupName")
    if not db.has("COMMUNICATION_OP", *cols):
        return None
    opt = {c: c if db.has("COMMUNICATION_OP", c) else "NULL" for c in ("dataType", "algType", "count")}
    o = db.query(f"SELECT {', '.join(cols)}, " + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM COMMUNICATION_OP",
                 "COMMUNICATION_OP")  # fmt: skip
    dtypes = db.enum("ENUM_HCCL_DATA_TYPE")
    ts = _us(o["startNs"])
    return pd.DataFrame({
        "name": _s(o["opName"], st).to_numpy(), "ts": ts, "dur": _dur(o["startNs"], o["endNs"]), "group": _s(o["groupName"], st).to_numpy(),
        "connection_id": _i64(o["connectionId"]), "data_type": [dtypes.get(int(x), "") for x in _i64(o["dataType"])],
        "alg_type": _s(o["algType"], st).to_numpy(), "count": _i64(o["count"]),
    }).sort_values("ts", kind="stable").reset_index(drop=True)  # fmt: skip


def _op_flows(db: _Db, links: pd.DataFrame, dev: pd.DataFrame, hops: pd.DataFrame) -> pd.DataFrame:
    """host op -> device task by connection id (the text export's async_npu flows): one row per
    (op, task start) for compute / copy tasks, and (op, HCCL op start) for collectives."""
    if not len(links):
        return _frame(["host_tid", "host_ts", "device_ts"])
    if db.has("connectionCats", "connectionId", "cat"):
        cats = db.query("SELECT connectionId, cat FROM connectionCats", "connectionCats")
        npu = set(_i64(cats.loc[cats["cat"].astype(str) == "async_npu", "connectionId"]).tolist())
        if npu:
            links = links[links["connection_id"].isin(npu)]
    targets = pd.concat([dev[["connection_id", "ts"]], hops[["connection_id", "ts"]]], ignore_index=True)
    targets = targets[targets["connection_id"] >= 0].drop_duplicates()
    out = links.merge(targets.rename(columns={"ts": "device_ts"}), on="connection_id", how="inner")
    out = out.rename(columns={"tid": "host_tid", "ts": "host_ts"})[["host_tid", "host_ts", "device_ts"]]
    return out.sort_values("device_ts", kind="stable").reset_index(drop=True)


def _step_time(db: _Db) -> pd.DataFrame | None:
    if not db.has("STEP_TIME", "id", "startNs", "endNs"):
        return None
    s = db.query("SELECT id, startNs, endNs FROM STEP_TIME", "STEP_TIME")
    out = pd.DataFrame({"id": _i64(s["id"]), "ts": _us(s["startNs"]), "end": _us(s["endNs"])})
    return out[~np.isnan(out["ts"].to_numpy())].sort_values("ts").reset_index(drop=True)


def _aicore_freq(db: _Db) -> pd.DataFrame:
    if not db.has("AICORE_FREQ", "timestampNs", "freq"):
        return _frame(["ts", "mhz"])
    f = db.query("SELECT timestampNs, freq FROM AICORE_FREQ", "AICORE_FREQ")
    out = pd.DataFrame({"ts": _us(f["timestampNs"]), "mhz": pd.to_numeric(f["freq"], errors="coerce").to_numpy(np.float64)})
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def _overlap(db: _Db) -> pd.DataFrame:
    if not db.has("OVERLAP_ANALYSIS", "startNs", "endNs", "type"):
        return _frame(["name", "ts", "dur"])
    o = db.query("SELECT startNs, endNs, type FROM OVERLAP_ANALYSIS", "OVERLAP_ANALYSIS")
    ts = _us(o["startNs"])
    out = pd.DataFrame({"name": [_OVERLAP.get(int(x), str(x)) for x in _i64(o["type"])], "ts": ts, "dur": _dur(o["startNs"], o["endNs"])})
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def _memory(db: _Db, st: dict[int, str]) -> pd.DataFrame | None:
    """MEMORY_RECORD (PTA / GE / PTA+GE) and NPU_MEM (the process total, ``APP``) as memory_record.csv."""
    mb = float(1 << 20)
    parts = []
    if db.has("NPU_MEM", "type", "hbm", "timestampNs"):
        m = db.query(f"SELECT type, hbm, {'ddr' if db.has('NPU_MEM', 'ddr') else '0'} AS ddr, timestampNs, "
                     f"{'deviceId' if db.has('NPU_MEM', 'deviceId') else '0'} AS deviceId FROM NPU_MEM", "NPU_MEM")  # fmt: skip
        reserved = (pd.to_numeric(m["hbm"], errors="coerce").fillna(0) + pd.to_numeric(m["ddr"], errors="coerce").fillna(0)) / mb
        parts.append(pd.DataFrame({"name": _s(m["type"], st).replace("", "APP").to_numpy(), "ts": _us(m["timestampNs"]),
                                   "allocated_mb": np.nan, "reserved_mb": reserved.to_numpy(np.float64), "active_mb": np.nan,
                                   "device": [f"NPU:{d}" for d in _i64(m["deviceId"], 0)]}))  # fmt: skip
    if db.has("MEMORY_RECORD", "component", "timestamp", "totalAllocated", "totalReserved"):
        active = "totalActive" if db.has("MEMORY_RECORD", "totalActive") else "NULL"
        dev = "deviceId" if db.has("MEMORY_RECORD", "deviceId") else "0"
        m = db.query(f"SELECT component, timestamp, totalAllocated, totalReserved, {active} AS totalActive, {dev} AS deviceId "
                     "FROM MEMORY_RECORD", "MEMORY_RECORD")  # fmt: skip
        parts.append(pd.DataFrame({"name": _s(m["component"], st).to_numpy(), "ts": _us(m["timestamp"]),
                                   **{c: pd.to_numeric(m[k], errors="coerce").to_numpy(np.float64) / mb
                                      for c, k in (("allocated_mb", "totalAllocated"), ("reserved_mb", "totalReserved"),
                                                   ("active_mb", "totalActive"))},
                                   "device": [f"NPU:{d}" for d in _i64(m["deviceId"], 0)]}))  # fmt: skip
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    out = out[~np.isnan(out["ts"].to_numpy())]
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def _op_statistic(kd: pd.DataFrame | None) -> pd.DataFrame | None:
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


def _api_statistic(cann: pd.DataFrame) -> pd.DataFrame | None:
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


# ---- analysis.db -----------------------------------------------------------------------------


def _step_num(s: pd.Series) -> np.ndarray:
    return np.array([int("".join(ch for ch in str(v) if ch.isdigit()) or -1) for v in s], dtype=np.int64)


def _f(s: pd.Series, scale: float = 1.0) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(np.float64) * scale


def read_analysis_db(path: Path, warnings: list[str]) -> dict[str, pd.DataFrame | None]:
    """analysis.db -> ``step_stats``, ``comm_ops``, ``comm_packets``, ``comm_matrix`` (each None
    when its table is absent), in the shapes of the text export's readers."""
    db = _Db(path)
    try:
        return _analysis(db, warnings)
    finally:
        db.close()


def _analysis(db: _Db, warnings: list[str]) -> dict[str, pd.DataFrame | None]:
    out: dict[str, pd.DataFrame | None] = {"step_stats": None, "comm_ops": None, "comm_packets": None, "comm_matrix": None}
    if not db.tables & {"StepTraceTime", "CommAnalyzerTime", "CommAnalyzerBandwidth", "CommAnalyzerMatrix"}:
        warnings.append(f"{db.path.name}: none of StepTraceTime, CommAnalyzerTime, CommAnalyzerBandwidth, CommAnalyzerMatrix")
        return out
    if db.has("StepTraceTime", "computing", "free"):
        s = db.query("SELECT * FROM StepTraceTime", "StepTraceTime")
        st = pd.DataFrame({"step": _step_num(s["step"]) if "step" in s.columns else np.full(len(s), -1, np.int64)})
        if "type" in s.columns and "index" in s.columns:
            st["type"] = s["type"].astype(str).to_numpy()
            st["index"] = _i64(s["index"])
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
        pk = _frame(["step", "name", "group", "transport", "packet_bytes", "count", "time_us"])
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
            "group": m["group_name"].astype(str).to_numpy(), "src_rank": _i64(m["src_rank"]), "dst_rank": _i64(m["dst_rank"]),
            "transport": m["transport_type"].astype(str).to_numpy(), "bytes": _f(m["transit_size"], 1e6),
            "time_us": _f(m["transit_time"], 1000.0), "bandwidth_gbps": _f(m["bandwidth"]), "op_name": m["op_name"].astype(str).to_numpy(),
        })  # fmt: skip
    return out


# ---- the rank --------------------------------------------------------------------------------


def read_profiler_db(path: Path, meta_a: AscendMeta, warnings: list[str]):
    """ascend_pytorch_profiler_*.db -> (Timeline, kernel details, memory record, op_statistic,
    api_statistic); ``meta_a`` gains the db's device name, environment and rank."""
    db = _Db(path)
    try:
        if "STRING_IDS" not in db.tables:
            raise BadTraceError("not a torch_npu profiler db: no STRING_IDS table", str(path))
        if not db.tables & {"PYTORCH_API", "TASK", "CANN_API", "COMMUNICATION_OP"}:
            raise BadTraceError("not a torch_npu profiler db: none of PYTORCH_API, TASK, CANN_API, COMMUNICATION_OP", str(path))
        counts: dict[str, int] = {}
        _meta(db, meta_a, counts)
        st = db.strings()
        ops, py, queue, links = _host(db, st, warnings)
        cann = _cann(db, st, warnings)
        steps = _step_time(db)
        dev, kd, hops, ht = _device(db, st, steps, warnings, counts)
        flows = _op_flows(db, links, dev, hops)
        pids = sorted(set(ops["pid"].astype(np.int64).tolist())) if len(ops) else []
        tids = sorted(set(ops["tid"].astype(np.int64).tolist()) | set(py["tid"].astype(np.int64).tolist())) if len(ops) or len(py) else []
        tl = Timeline(host_ops=ops, python=py, task_queue=queue, cann=cann, device=dev, hccl_ops=hops, hccl_tasks=ht,
                      op_flows=flows, aicore_freq=_aicore_freq(db), overlap=_overlap(db), counts=dict(sorted(counts.items())),
                      process_names={str(p): "Python" for p in pids},
                      thread_names={f"{pids[0]}/{t}": f"Thread {t}" for t in tids} if pids else {})  # fmt: skip
        tl = validate_timeline(tl, str(path))  # rows whose times are garbage are dropped and named
        warnings += tl.warnings
        mem = _memory(db, st)
        return tl, kd, mem, _op_statistic(kd), _api_statistic(cann)
    except sqlite3.Error as exc:  # a damaged page met halfway through
        raise BadTraceError(f"not a readable sqlite database ({_one_line(exc)})", str(path)) from None
    finally:
        db.close()


def parse_ascend_db(af: AscendFiles):
    """One rank of the db export (``ascend_pytorch_profiler_*.db`` and / or ``analysis.db``)."""
    from .reader import build_rank  # ascend.py imports this module lazily

    warnings: list[str] = []
    meta_a = read_meta(af)
    warnings += meta_a.warnings
    tl = kd = mem = None
    tables: dict[str, pd.DataFrame | None] = {"step_stats": None, "comm_matrix": None, "op_statistic": None, "api_statistic": None}
    if af.db is not None:
        tl, kd, mem, tables["op_statistic"], tables["api_statistic"] = read_profiler_db(af.db, meta_a, warnings)
    comm_ops = comm_packets = None
    if af.analysis_db is not None:
        try:
            an = read_analysis_db(af.analysis_db, warnings)
        except BadTraceError as exc:
            if af.db is None:  # it is all there is
                raise
            warnings.append(f"skipped {exc}")
            an = {k: None for k in ("step_stats", "comm_matrix", "comm_ops", "comm_packets")}
        tables["step_stats"], tables["comm_matrix"] = an["step_stats"], an["comm_matrix"]
        comm_ops, comm_packets = an["comm_ops"], an["comm_packets"]
    elif af.db is not None:
        warnings.append(f"no analysis.db beside {af.db.name}: no step_stats, comm_ops or comm_matrix")
    return build_rank(af, meta_a, tl, kd, comm_ops, comm_packets, tables, mem, warnings, export="db")



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
