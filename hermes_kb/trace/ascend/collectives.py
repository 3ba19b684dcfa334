"""The HCCL collectives of an Ascend rank: one kernel row per HCCL op (on its device stream) and
one ``collectives`` row with communication.json's times, bytes and bandwidth per transport, its
group's ranks (communication_matrix.json) and parallel group (dp / tp / pp ...)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...core.dtypes import element_bytes
from ..names import collective_kind
from .timeline import Timeline

_SEQ_RE = re.compile(r"_(\d+)_\d+$")


def is_comm_row(kd: pd.DataFrame) -> np.ndarray:
    """kernel_details.csv also lists the HCCL ops (Accelerator Core HCCL, COMMUNICATION since CANN 8)."""
    return kd["core_type"].astype(str).str.upper().isin(["COMMUNICATION", "HCCL"]).to_numpy() | kd["name"].astype(str).str.startswith("hcom_").to_numpy()


COLL_TEMPLATE = pd.DataFrame({
    "name": pd.Categorical([]), "kind": pd.Categorical([]), "ts": pd.Series(dtype=np.float64),
    "dur": pd.Series(dtype=np.float64), "end": pd.Series(dtype=np.float64), "source": pd.Categorical([]),
    **{c: pd.Series(dtype=np.int64) for c in ("kernel_idx", "cpu_idx", "device", "stream", "ext_id")},
    **{c: pd.Categorical([]) for c in ("collective", "pg_name", "pg_desc", "pg_ranks")},
    "group_size": pd.Series(dtype=np.int64), "dtype": pd.Categorical([]),
    **{c: pd.Series(dtype=np.int64) for c in ("in_nelems", "out_nelems", "in_bytes", "out_bytes")},
    "in_split": pd.Categorical([]), "out_split": pd.Categorical([]), "seq": pd.Series(dtype=np.int64),
})  # fmt: skip


def hccl_collectives(tl, comm_ops, kd, matrix, meta_a, device_id: int, k_offset: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """HCCL ops as kernel rows (appended after the compute kernels) and their collectives rows."""
    if tl is not None and len(tl.hccl_ops):
        h = tl.hccl_ops.copy()
        h["correlation"] = h["connection_id"].astype(np.int64)
        h["stream"] = _hccl_streams(tl, h)
    elif comm_ops is not None and len(comm_ops):
        h = comm_ops[["name", "ts", "dur", "group"]].copy()
        h["correlation"], h["stream"], h["data_type"], h["count"] = -1, -1, "", -1
    elif kd is not None and len(kd) and is_comm_row(kd).any():
        h = kd.loc[is_comm_row(kd), ["name", "ts", "dur"]].copy()
        h["group"], h["correlation"], h["stream"], h["data_type"], h["count"] = "", -1, -1, "", -1
    else:
        return pd.DataFrame({c: [] for c in ("name", "ts", "dur")}), COLL_TEMPLATE.copy()
    h = h.sort_values("ts", kind="stable").reset_index(drop=True)
    h["end"] = h["ts"] + h["dur"]
    kern = pd.DataFrame({"name": h["name"], "ts": h["ts"], "dur": h["dur"], "end": h["end"], "device": device_id,
                         "stream": h["stream"], "correlation": h["correlation"], "task_type": "HCCL",
                         "op_type": "hcom", "core_type": "HCCL"})  # fmt: skip
    info = None
    if comm_ops is not None and len(comm_ops):
        info = comm_ops.drop(columns=["ts", "dur"]).drop_duplicates("name").set_index("name")
    group_ranks = _group_ranks(matrix)
    rows = []
    for i, r in enumerate(h.itertuples(index=False)):
        name = str(r.name)
        extra = info.loc[name].to_dict() if info is not None and name in info.index else {}
        group = str(extra.get("group") or getattr(r, "group", "") or "")
        ranks = group_ranks.get(group, [])
        size = element_bytes(str(getattr(r, "data_type", "") or "").strip())
        count = int(getattr(r, "count", -1))
        m = _SEQ_RE.search(name)
        row = {
            "name": name, "kind": collective_kind(name), "ts": r.ts, "dur": r.dur, "end": r.end,
            "source": "kernel", "kernel_idx": k_offset + i, "cpu_idx": -1, "device": device_id, "stream": int(r.stream),
            "ext_id": -1, "collective": name.split("__")[0].removeprefix("hcom_"), "pg_name": group,
            "pg_desc": _group_desc(ranks, meta_a), "pg_ranks": str(ranks) if ranks else "",
            "group_size": len(ranks) if ranks else -1, "dtype": str(getattr(r, "data_type", "") or ""),
            "in_nelems": count, "out_nelems": -1, "in_bytes": count * size if size and count >= 0 else -1,
            "out_bytes": -1, "in_split": "", "out_split": "", "seq": int(m.group(1)) if m else -1,
        }  # fmt: skip
        for k, v in extra.items():
            if k not in row and k not in ("step", "comm_type"):
                row[k] = v
        if extra:
            row["comm_type"] = extra.get("comm_type", "")
            by_tr = {t: float(extra.get(f"{t}_bytes") or 0.0) for t in ("rdma", "hccs", "pcie", "sio")}
            best = max(by_tr, key=by_tr.get)
            row["link_type"] = best.upper() if by_tr[best] > 0 else ("SDMA" if float(extra.get("sdma_bytes") or 0) > 0 else "")
            row["transit_bytes"] = by_tr[best] if by_tr[best] > 0 else float(extra.get("sdma_bytes") or 0.0)
            row["bandwidth_gbps"] = float(extra.get(f"{best}_gbps") or 0.0) if by_tr[best] > 0 else float(extra.get("sdma_gbps") or 0.0)
            if row["in_bytes"] < 0 and row["transit_bytes"] > 0:
                row["in_bytes"] = int(row["transit_bytes"])
        rows.append(row)
    return kern, pd.DataFrame(rows)


def _hccl_streams(tl: Timeline, h: pd.DataFrame) -> np.ndarray:
    """The device stream of each HCCL op: that of its transfer tasks (first one inside it)."""
    out = np.full(len(h), -1, dtype=np.int64)
    t = tl.hccl_tasks
    if not len(t):
        return out
    t = t.sort_values("ts")
    ts = t["ts"].to_numpy()
    st = t["stream"].to_numpy()
    for i, (a, b) in enumerate(zip(h["ts"].to_numpy(), (h["ts"] + h["dur"]).to_numpy())):
        j = np.searchsorted(ts, a)
        if j < len(ts) and ts[j] <= b:
            out[i] = int(st[j])
    return out


def _group_ranks(matrix) -> dict[str, list[int]]:
    if matrix is None or not len(matrix):
        return {}
    out: dict[str, set[int]] = {}
    for g, s, d in zip(matrix["group"], matrix["src_rank"], matrix["dst_rank"]):
        out.setdefault(str(g), set()).update(x for x in (int(s), int(d)) if x >= 0)
    return {g: sorted(v) for g, v in out.items()}


def _group_desc(ranks: list[int], meta_a) -> str:
    """The parallel group (dp / tp / pp ...) whose global ranks are exactly these, if unique."""
    if not ranks:
        return ""
    names = [g["pg_desc"] for g in meta_a.parallel_groups if sorted(g["ranks"]) == ranks]
    return "/".join(sorted(set(names)))
