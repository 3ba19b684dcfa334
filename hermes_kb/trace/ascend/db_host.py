"""The host side of torch_npu's profiler db: the device name, environment and rank
(``NPU_INFO``, ``META_DATA``, ``RANK_DEVICE_MAP``), host operators, Python functions and the task
queue (``PYTORCH_API``, linked to device tasks through ``CONNECTION_IDS``) and the CANN calls
(``CANN_API``)."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pandas as pd

from ...core.errors import as_rank
from ..columns import call_tree
from .db_file import SqliteFile, dur_us, empty_frame, int_ids, interned, note_unreadable, ns_to_us
from .files import AscendMeta

_API_TYPES = {5000: "runtime", 5500: "hccl", 10000: "node", 15000: "model", 20000: "acl",
              50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"}  # fmt: skip
_CANN_PREFIX = {"acl": "AscendCL", "node": "Node", "hccl": "Hccl", "runtime": "Runtime", "model": "Model"}
_MASK32 = 0xFFFFFFFF


def read_db_meta(db: SqliteFile, meta_a: AscendMeta, counts: dict[str, int]) -> None:
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


def host_frames(db: SqliteFile, st: dict[int, str], warnings: list[str]):
    """PYTORCH_API -> host ops, Python functions, task queue; plus each row's connection ids."""
    cols = ["name", "ts", "dur", "tid", "pid", "seq", "fwd_tid", "input_dims", "input_types"]
    empty = (empty_frame(cols), empty_frame(["name", "ts", "dur", "tid", "py_id", "parent_id"]),
             empty_frame(["name", "ts", "dur", "tid", "kind", "correlation"]), empty_frame(["tid", "ts", "connection_id"]))  # fmt: skip
    if not db.has("PYTORCH_API", "startNs", "endNs", "globalTid", "name", "type"):
        warnings.append(f"{db.path.name}: no PYTORCH_API table: no host operators")
        return empty
    opt = {c: c if db.has("PYTORCH_API", c) else "NULL" for c in
           ("connectionId", "sequenceNumber", "fwdThreadId", "inputDtypes", "inputShapes")}  # fmt: skip
    p = db.query("SELECT CAST(startNs AS INTEGER) AS s, CAST(endNs AS INTEGER) AS e, globalTid, name, type, "
                 + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM PYTORCH_API", "PYTORCH_API")  # fmt: skip
    types = db.enum("ENUM_API_TYPE", _API_TYPES)
    kind = int_ids(p["type"]).astype(object)
    kind = np.array([types.get(int(k), "") for k in kind], dtype=object)
    gtid = int_ids(p["globalTid"], 0)
    base = pd.DataFrame({"name": interned(p["name"], st), "ts": ns_to_us(p["s"]), "tid": gtid & _MASK32, "pid": gtid >> 32})
    base["dur"] = dur_us(p["s"], p["e"])
    base = base[["name", "ts", "dur", "tid", "pid"]]
    ok = ~np.isnan(base["ts"].to_numpy()) & ~np.isnan(base["dur"].to_numpy())
    note_unreadable(db, "PYTORCH_API", int((~ok).sum()), warnings)

    is_op = ok & np.isin(kind, ("op", "mstx"))
    ops = base[is_op].copy()
    ops["seq"] = int_ids(p.loc[is_op, "sequenceNumber"])
    ops["fwd_tid"] = int_ids(p.loc[is_op, "fwdThreadId"])
    ops["input_dims"] = interned(p.loc[is_op, "inputShapes"], st).to_numpy()
    ops["input_types"] = interned(p.loc[is_op, "inputDtypes"], st).to_numpy()
    ops = ops.sort_values("ts", kind="stable").reset_index(drop=True)

    is_py = ok & (kind == "trace")
    py = base[is_py][["name", "ts", "dur", "tid"]].sort_values("ts", kind="stable").reset_index(drop=True)
    par, _ = call_tree(py["tid"].to_numpy(np.int64), py["ts"].to_numpy(np.float64), (py["ts"] + py["dur"]).to_numpy(np.float64))
    py["py_id"] = np.arange(len(py), dtype=np.int64)
    py["parent_id"] = np.asarray(par, dtype=np.int64)

    is_q = ok & (kind == "queue")
    q = base[is_q][["name", "ts", "dur", "tid"]].copy()
    q["kind"] = np.where(q["name"].str.startswith("Enqueue"), "enqueue", "dequeue")
    q["correlation"] = int_ids(p.loc[is_q, "connectionId"])  # an index into CONNECTION_IDS; resolved below

    links = pd.DataFrame({"tid": base["tid"].to_numpy()[is_op], "ts": base["ts"].to_numpy()[is_op],
                          "connection_id": int_ids(p.loc[is_op, "connectionId"])})  # fmt: skip
    links = links[links["connection_id"] >= 0]
    if db.has("CONNECTION_IDS", "id", "connectionId"):
        ci = db.query("SELECT id, connectionId FROM CONNECTION_IDS", "CONNECTION_IDS")
        ci = pd.DataFrame({"id": int_ids(ci["id"]), "cid": int_ids(ci["connectionId"])})
        links = links.merge(ci, left_on="connection_id", right_on="id", how="inner")[["tid", "ts", "cid"]]
        links = links.rename(columns={"cid": "connection_id"})
        first = ci.drop_duplicates("id").set_index("id")["cid"]
        q["correlation"] = first.reindex(q["correlation"].to_numpy()).fillna(-1).to_numpy(np.float64).astype(np.int64)
    elif len(links) or len(q):
        warnings.append(f"{db.path.name}: no CONNECTION_IDS table: host operators are not linked to device tasks")
        links = links.iloc[0:0]
    q = q.sort_values("ts", kind="stable").reset_index(drop=True)
    return ops, py, q, links.reset_index(drop=True)


def cann_calls(db: SqliteFile, st: dict[int, str], warnings: list[str]) -> pd.DataFrame:
    cols = ["name", "ts", "dur", "tid", "connection_id", "level"]
    if not db.has("CANN_API", "startNs", "endNs", "type", "globalTid", "connectionId", "name"):
        warnings.append(f"{db.path.name}: no CANN_API table: no CANN calls (runtime frame empty)")
        return empty_frame(cols)
    c = db.query("SELECT startNs, endNs, type, globalTid, connectionId, name FROM CANN_API", "CANN_API")
    types = db.enum("ENUM_API_TYPE", _API_TYPES)
    level = [types.get(int(t), str(t)) for t in int_ids(c["type"])]
    raw = interned(c["name"], st)
    name = [n if "@" in n else f"{_CANN_PREFIX.get(lv, lv.capitalize())}@{n}" for n, lv in zip(raw, level)]
    ts = ns_to_us(c["startNs"])
    out = pd.DataFrame({"name": name, "ts": ts, "dur": dur_us(c["startNs"], c["endNs"]), "tid": int_ids(c["globalTid"], 0) & _MASK32,
                        "connection_id": int_ids(c["connectionId"]), "level": level})  # fmt: skip
    ok = ~np.isnan(out["ts"].to_numpy()) & ~np.isnan(out["dur"].to_numpy())
    note_unreadable(db, "CANN_API", int((~ok).sum()), warnings)
    return out[ok].sort_values("ts", kind="stable").reset_index(drop=True)
