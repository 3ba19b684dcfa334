"""The device side of torch_npu's profiler db: ``TASK`` with ``COMPUTE_TASK_INFO`` (+
``TASK_PMU_INFO`` pivoted) as device tasks and the kernel_details frame, ``COMMUNICATION_OP`` /
``COMMUNICATION_TASK_INFO`` as HCCL ops and their transfer tasks, the host op -> device task
flows, and ``STEP_TIME`` (the step of each task)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .db_file import SqliteFile, dur_us, empty_frame, int_ids, interned, note_unreadable, ns_to_us
from .tables import KERNEL_INTS, KERNEL_TEXT

_KERNEL_TASK_RE = re.compile(r"^(KERNEL_|AI_CORE|AI_CPU|AI_VECTOR|AIV|MIX_|FFTS)", re.IGNORECASE)
_NA_ID = 4294967295  # UINT32_MAX: "not applicable" in TASK.contextId / modelId and rank columns


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


_DEV_COLS = ["name", "ts", "dur", "stream", "task_type", "task_id", "connection_id"]
_HOP_COLS = ["name", "ts", "dur", "group", "connection_id", "data_type", "alg_type", "count"]
_HT_COLS = ["name", "ts", "dur", "plane", "stream", "task_type", "src_rank", "dst_rank", "transport", "size_bytes",
            "link_type", "bandwidth_gbps"]  # fmt: skip


def device_tasks(db: SqliteFile, st: dict[int, str], steps: pd.DataFrame | None, warnings: list[str], counts: dict[str, int]):
    """TASK (+ COMPUTE_TASK_INFO, TASK_PMU_INFO, COMMUNICATION_*) -> device tasks, kernel details,
    HCCL ops and HCCL tasks."""
    hops = _hccl_ops(db, st)
    t = _tasks(db, st, warnings)
    if t is None:
        return empty_frame(_DEV_COLS), None, hops if hops is not None else empty_frame(_HOP_COLS), empty_frame(_HT_COLS)
    comp = _compute_tasks(db, t, warnings)
    ht, comm_gids = _hccl_tasks(db, st, t)
    comp_name = interned(comp["ci_name"], st)
    comp_core = interned(comp["ci_type"], st)
    dev = _device_frame(t, comp, comp_name, comp_core, comm_gids, counts)
    kd = _kernel_details(db, st, comp, comp_name, comp_core, steps)
    return dev, kd, hops if hops is not None else empty_frame(_HOP_COLS), ht


def _tasks(db: SqliteFile, st: dict[int, str], warnings: list[str]) -> pd.DataFrame | None:
    """TASK's rows whose times are integers, with µs times, the task type's name and the global
    task id (``gid``); None without a TASK table."""
    if not db.has("TASK", "startNs", "endNs", "globalTaskId", "taskType", "streamId"):
        warnings.append(f"{db.path.name}: no TASK table: no device tasks")
        return None
    opt = {c: c if db.has("TASK", c) else "NULL" for c in ("deviceId", "connectionId", "contextId", "taskId", "modelId")}
    t = db.query("SELECT startNs, endNs, globalTaskId, taskType, streamId, "
                 + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM TASK", "TASK")  # fmt: skip
    t["ts"] = ns_to_us(t["startNs"])
    t["dur"] = dur_us(t["startNs"], t["endNs"])
    t["type_name"] = interned(t["taskType"], st)
    t["gid"] = int_ids(t["globalTaskId"])
    ok = ~np.isnan(t["ts"].to_numpy()) & ~np.isnan(t["dur"].to_numpy())
    note_unreadable(db, "TASK", int((~ok).sum()), warnings)
    return t[ok]


def _compute_tasks(db: SqliteFile, t: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """The tasks that have a COMPUTE_TASK_INFO row, with its columns (``ci_name``, ``ci_type`` ...)."""
    ci_cols = ("name", "globalTaskId", "blockDim", "mixBlockDim", "taskType", "opType", "inputFormats", "inputDataTypes",
               "inputShapes", "outputFormats", "outputDataTypes", "outputShapes")  # fmt: skip
    if db.has("COMPUTE_TASK_INFO", *ci_cols):
        wait = "waitNs" if db.has("COMPUTE_TASK_INFO", "waitNs") else "NULL"
        ci = db.query(f"SELECT {', '.join(ci_cols)}, {wait} AS waitNs FROM COMPUTE_TASK_INFO", "COMPUTE_TASK_INFO")
    else:
        warnings.append(f"{db.path.name}: no COMPUTE_TASK_INFO table: device compute tasks have no names or attributes")
        ci = pd.DataFrame({c: [] for c in (*ci_cols, "waitNs")})
    ci["gid"] = int_ids(ci["globalTaskId"])
    ci = ci.drop_duplicates("gid")
    return t.merge(ci.drop(columns=["globalTaskId"]).rename(columns={"taskType": "ci_type", "name": "ci_name"}),
                   on="gid", how="inner")  # fmt: skip


def _hccl_tasks(db: SqliteFile, st: dict[int, str], t: pd.DataFrame) -> tuple[pd.DataFrame, set[int]]:
    """The HCCL transfer tasks (COMMUNICATION_TASK_INFO) and the global ids of every HCCL task."""
    comm_gids: set[int] = set()
    ht = empty_frame(_HT_COLS)
    ct_cols = ("name", "globalTaskId", "taskType", "planeId", "srcRank", "dstRank", "transportType", "size", "linkType")
    if db.has("COMMUNICATION_TASK_INFO", *ct_cols):
        ct = db.query(f"SELECT {', '.join(ct_cols)} FROM COMMUNICATION_TASK_INFO", "COMMUNICATION_TASK_INFO")
        ct["gid"] = int_ids(ct["globalTaskId"])
        comm_gids = set(ct["gid"].tolist())
        m = t.merge(ct.drop(columns=["globalTaskId"]).rename(columns={"name": "op_name", "taskType": "ct_type"}), on="gid",
                    how="inner")
        transport = db.enum("ENUM_HCCL_TRANSPORT_TYPE")
        link = db.enum("ENUM_HCCL_LINK_TYPE")
        size = pd.to_numeric(m["size"], errors="coerce").to_numpy(np.float64)
        dur_ns = pd.to_numeric(m["endNs"], errors="coerce").to_numpy(np.float64) - pd.to_numeric(m["startNs"], errors="coerce").to_numpy(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            bw = np.where(dur_ns > 0, size / dur_ns, 0.0)  # bytes per ns = GB/s
        ttype = interned(m["ct_type"], st)
        ht = pd.DataFrame({
            "name": ttype.to_numpy(), "ts": m["ts"].to_numpy(), "dur": m["dur"].to_numpy(), "plane": int_ids(m["planeId"]),
            "stream": int_ids(m["streamId"]), "task_type": ttype.to_numpy(), "src_rank": int_ids(m["srcRank"]),
            "dst_rank": int_ids(m["dstRank"]), "transport": [transport.get(int(x), "") for x in int_ids(m["transportType"])],
            "size_bytes": size, "link_type": [link.get(int(x), "") for x in int_ids(m["linkType"])], "bandwidth_gbps": bw,
        }).sort_values("ts", kind="stable").reset_index(drop=True)  # fmt: skip
    return ht, comm_gids


def _dev_rows(df: pd.DataFrame, name: pd.Series, ttype: pd.Series) -> pd.DataFrame:
    return pd.DataFrame({"name": np.asarray(name, dtype=object), "ts": df["ts"].to_numpy(), "dur": df["dur"].to_numpy(),
                         "stream": int_ids(df["streamId"]), "task_type": np.asarray(ttype, dtype=object),
                         "task_id": int_ids(df["taskId"]), "connection_id": int_ids(df["connectionId"])})  # fmt: skip


def _device_frame(t: pd.DataFrame, comp: pd.DataFrame, comp_name: pd.Series, comp_core: pd.Series, comm_gids: set[int],
                  counts: dict[str, int]) -> pd.DataFrame:  # fmt: skip
    """The device frame: compute tasks (named by COMPUTE_TASK_INFO), then the rest except HCCL
    tasks and kernel launches that have no COMPUTE_TASK_INFO row (the text export does not show
    them either)."""
    comp_gids = set(comp["gid"].tolist())
    rest = t[~t["gid"].isin(comp_gids) & ~t["gid"].isin(comm_gids)]
    unnamed = rest["type_name"].str.match(_KERNEL_TASK_RE).to_numpy(dtype=bool)
    if unnamed.any():
        counts["db:TASK kernels without COMPUTE_TASK_INFO (left out)"] = int(unnamed.sum())
    rest = rest[~unnamed]
    comm_t = t[t["gid"].isin(comm_gids)]
    parts = [_dev_rows(comp, comp_name, comp_core.where(comp_core != "", comp["type_name"])),
             _dev_rows(rest, rest["type_name"], rest["type_name"]),
             _dev_rows(comm_t, comm_t["type_name"], comm_t["type_name"])]  # on HCCL streams: build_rank sets them aside
    return pd.concat(parts, ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)


def _kernel_details(db: SqliteFile, st: dict[int, str], comp: pd.DataFrame, comp_name: pd.Series, comp_core: pd.Series,
                    steps: pd.DataFrame | None) -> pd.DataFrame:  # fmt: skip
    """The kernel_details-like frame of the compute tasks (TASK_PMU_INFO's metrics pivoted to columns)."""
    n = len(comp)
    kd = pd.DataFrame(index=range(n))
    text = {"name": comp_name, "op_type": interned(comp["opType"], st), "core_type": comp_core,
            "input_shapes": interned(comp["inputShapes"], st), "input_dtypes": interned(comp["inputDataTypes"], st),
            "input_formats": interned(comp["inputFormats"], st), "output_shapes": interned(comp["outputShapes"], st),
            "output_dtypes": interned(comp["outputDataTypes"], st), "output_formats": interned(comp["outputFormats"], st)}  # fmt: skip
    for c in KERNEL_TEXT:  # op_state and hf32_eligible are not in the db
        kd[c] = text[c].to_numpy() if c in text else ""
    ctx = int_ids(comp["contextId"])
    ints = {"step": _steps_of(comp["ts"].to_numpy(), steps), "device": int_ids(comp["deviceId"], 0), "model_id": int_ids(comp["modelId"]),
            "task_id": int_ids(comp["taskId"]), "stream": int_ids(comp["streamId"]), "block_dim": int_ids(comp["blockDim"]),
            "mix_block_dim": int_ids(comp["mixBlockDim"]), "context_id": np.where(ctx == _NA_ID, -1, ctx)}  # fmt: skip
    for c in KERNEL_INTS:
        kd[c] = ints[c]
    kd["ts"] = comp["ts"].to_numpy()
    kd["dur"] = comp["dur"].to_numpy()
    kd["wait_us"] = pd.to_numeric(comp["waitNs"], errors="coerce").to_numpy(np.float64) / 1000.0
    if n and db.has("TASK_PMU_INFO", "globalTaskId", "name", "value"):
        pmu = db.query("SELECT globalTaskId, name, value FROM TASK_PMU_INFO", "TASK_PMU_INFO")
        if len(pmu):
            pmu["col"] = interned(pmu["name"], st).map(_pmu_column)
            pmu["value"] = pd.to_numeric(pmu["value"], errors="coerce")
            wide = pmu.pivot_table(index="globalTaskId", columns="col", values="value", aggfunc="first")
            got = wide.reindex(comp["gid"].to_numpy())
            for c in wide.columns:
                if c and c not in kd.columns:
                    kd[c] = got[c].to_numpy(np.float64)
    return kd.sort_values("ts", kind="stable").reset_index(drop=True)


def _hccl_ops(db: SqliteFile, st: dict[int, str]) -> pd.DataFrame | None:
    cols = ("opName", "startNs", "endNs", "connectionId", "groupName")
    if not db.has("COMMUNICATION_OP", *cols):
        return None
    opt = {c: c if db.has("COMMUNICATION_OP", c) else "NULL" for c in ("dataType", "algType", "count")}
    o = db.query(f"SELECT {', '.join(cols)}, " + ", ".join(f"{v} AS {k}" for k, v in opt.items()) + " FROM COMMUNICATION_OP",
                 "COMMUNICATION_OP")  # fmt: skip
    dtypes = db.enum("ENUM_HCCL_DATA_TYPE")
    ts = ns_to_us(o["startNs"])
    return pd.DataFrame({
        "name": interned(o["opName"], st).to_numpy(), "ts": ts, "dur": dur_us(o["startNs"], o["endNs"]), "group": interned(o["groupName"], st).to_numpy(),
        "connection_id": int_ids(o["connectionId"]), "data_type": [dtypes.get(int(x), "") for x in int_ids(o["dataType"])],
        "alg_type": interned(o["algType"], st).to_numpy(), "count": int_ids(o["count"]),
    }).sort_values("ts", kind="stable").reset_index(drop=True)  # fmt: skip


def op_flows(db: SqliteFile, links: pd.DataFrame, dev: pd.DataFrame, hops: pd.DataFrame) -> pd.DataFrame:
    """host op -> device task by connection id (the text export's async_npu flows): one row per
    (op, task start) for compute / copy tasks, and (op, HCCL op start) for collectives."""
    if not len(links):
        return empty_frame(["host_tid", "host_ts", "device_ts"])
    if db.has("connectionCats", "connectionId", "cat"):
        cats = db.query("SELECT connectionId, cat FROM connectionCats", "connectionCats")
        npu = set(int_ids(cats.loc[cats["cat"].astype(str) == "async_npu", "connectionId"]).tolist())
        if npu:
            links = links[links["connection_id"].isin(npu)]
    targets = pd.concat([dev[["connection_id", "ts"]], hops[["connection_id", "ts"]]], ignore_index=True)
    targets = targets[targets["connection_id"] >= 0].drop_duplicates()
    out = links.merge(targets.rename(columns={"ts": "device_ts"}), on="connection_id", how="inner")
    out = out.rename(columns={"tid": "host_tid", "ts": "host_ts"})[["host_tid", "host_ts", "device_ts"]]
    return out.sort_values("device_ts", kind="stable").reset_index(drop=True)


def step_time(db: SqliteFile) -> pd.DataFrame | None:
    if not db.has("STEP_TIME", "id", "startNs", "endNs"):
        return None
    s = db.query("SELECT id, startNs, endNs FROM STEP_TIME", "STEP_TIME")
    out = pd.DataFrame({"id": int_ids(s["id"]), "ts": ns_to_us(s["startNs"]), "end": ns_to_us(s["endNs"])})
    return out[~np.isnan(out["ts"].to_numpy())].sort_values("ts").reset_index(drop=True)
