"""One rank of torch_npu profiler output (``*_ascend_pt``) into a RankTrace.

The mapping onto the Kineto-shaped frames (docs/trace_bundle.md, "Ascend"):

- ``cpu_ops`` / ``python`` / ``annotations``: the ``Python`` process of trace_view.json
  (``ProfilerStep#N``, ``Optimizer.step#...`` and ``enumerate(DataLoader)...`` are cpu_op
  events there; they go to ``annotations`` as in Kineto);
- ``runtime``: the ``CANN`` process (AscendCL / Node@launch / HCCL API calls), correlation =
  ``connection_id``;
- ``kernels``: device compute tasks (AI Core, AI Vector, AI CPU, MIX, DSA) from ``Ascend
  Hardware`` joined with kernel_details.csv (op type, core type, block dim, shapes, formats,
  dtypes, pipe utilisation), plus one row per HCCL collective (``Group N Communication``);
  from kernel_details.csv / communication.json alone when there is no trace_view.json;
- ``memcpy``: ``MEMCPY_ASYNC`` tasks (direction from the task-queue dequeue that issued them);
- ``collectives``: one per HCCL op with communication.json's transit / wait / sync / idle
  times and bytes and bandwidth per transport (RDMA, HCCS, PCIE, SDMA, SIO);
- ``links``: CANN call -> device task by connection_id; ``ext_id`` from the torch_to_npu flows
  (the host op that issued each device task);
- ``extras``: ``step_stats`` (step_trace_time.csv), ``comm_ops``, ``comm_packets``,
  ``comm_matrix``, ``op_statistic``, ``api_statistic``, ``aicore_freq``, ``task_queue``,
  ``npu_overlap`` (the profiler's own Computing / Communication / Free intervals).
HCCL transfer tasks and the notify / event tasks on HCCL streams are represented by their
collective, not as kernels, so communication is never counted as computation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from . import tables as at
from ..kineto import frames as kf
from .files import AscendFiles, read_meta
from .timeline import Timeline, read_timeline
from ..bundle import RankTrace, TraceMeta
from ..columns import call_tree
from ..kineto.joins import steps as steps_of_annotations
from ..names import annotation_kind, collective_kind, dtype_bytes

_SKIP_TASKS = {"EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "PLACE_HOLDER_SQE", "Notify Wait", "Write Value",
               "NOTIFY_WAIT_SQE", "NOTIFY_RECORD_SQE", "WRITE_VALUE_SQE"}  # fmt: skip
_SKIP_NAMES = {"EVENT_RECORD", "EVENT_WAIT", "PROFILING_ENABLE", "PROFILING_DISABLE", "NOTIFY_WAIT", "NOTIFY_RECORD"}
_SEQ_RE = re.compile(r"_(\d+)_\d+$")


def runtime_kind_npu(name: str) -> str:
    """The kind of a CANN API call (same vocabulary as the CUDA runtime frame)."""
    api = name.split("@", 1)[-1]
    low = api.lower()
    if name.startswith("Node@") and "launch" in low:
        return "launch"
    if "synchronize" in low:
        return "sync"
    if "streamwaitevent" in low:
        return "wait_event"
    if "memcpy" in low:
        return "memcpy"
    if "memset" in low:
        return "memset"
    if "malloc" in low or low in ("aclrtreservememaddress", "aclrtmapmem"):
        return "malloc"  # expandable segments: reserve virtual addresses, map physical memory
    if low.startswith("aclrtfree") or low in ("aclrtreleasememaddress", "aclrtunmapmem"):
        return "free"
    if "event" in low:
        return "event"
    return "other"


def _optional(reader, path: Path | None, warnings: list[str], *args):
    if path is None:
        return None
    try:
        return reader(path, *args, warnings=warnings)
    except BadTraceError as exc:
        warnings.append(f"skipped {exc}")
        return None


def _cat(df: pd.DataFrame, cols: tuple[str, ...]) -> pd.DataFrame:
    for c in cols:
        if c in df.columns:
            df[c] = pd.Categorical(df[c].astype(object).fillna("").astype(str))
    return df


def _conform(df: pd.DataFrame, template: pd.DataFrame) -> pd.DataFrame:
    """Give ``df`` every column of the Kineto frame (defaults -1 / NaN / "") in its dtypes;
    extra Ascend columns are kept after them."""
    n = len(df)
    out = {}
    for c, dt in template.dtypes.items():
        if c in df.columns:
            col = df[c]
        elif str(dt) == "category":
            col = pd.Series([""] * n, index=df.index)
        elif str(dt).startswith("float"):
            col = pd.Series(np.full(n, np.nan), index=df.index)
        else:
            col = pd.Series(np.full(n, -1), index=df.index)
        if str(dt) == "category":
            out[c] = pd.Categorical(col.astype(object).fillna("").astype(str))
        else:
            out[c] = col.to_numpy().astype(dt)
    res = pd.DataFrame(out, index=df.index)
    for c in df.columns:
        if c not in res.columns:
            res[c] = df[c].to_numpy()
    return res.reset_index(drop=True)


def _empty(builder) -> pd.DataFrame:
    return builder("").empty()


def parse_ascend(af: AscendFiles) -> tuple[RankTrace, float]:
    """Parse one rank directory. Returns the RankTrace (times relative to its first event) and
    the absolute time (µs) of that first event."""
    src = str(af.root)
    if not af.has_any():
        raise BadTraceError(
            "no torch_npu profiler output found (expected ASCEND_PROFILER_OUTPUT/trace_view.json, kernel_details.csv, "
            "communication.json, step_trace_time.csv or ascend_pytorch_profiler_*.db)", src)  # fmt: skip
    has_text = bool(af.files)
    if not has_text and (af.db is not None or af.analysis_db is not None):
        from .db import parse_ascend_db  # the sqlite export, when it is all there is

        return parse_ascend_db(af)
    warnings: list[str] = []
    meta_a = read_meta(af)
    warnings += meta_a.warnings
    tl = read_timeline(af.files["trace_view.json"]) if "trace_view.json" in af.files else None
    if tl is not None:
        warnings += tl.warnings
    kd_path = af.get("kernel_details.csv")
    kd = at.kernel_details(kd_path, warnings) if (kd_path is not None and tl is None) else _optional(at.kernel_details, kd_path, warnings)
    comm = _optional(at.communication, af.get("communication.json"), warnings)
    comm_ops, comm_packets = comm if comm is not None else (None, None)
    tables = {
        "step_stats": _optional(at.step_trace_time, af.get("step_trace_time.csv"), warnings),
        "comm_matrix": _optional(at.communication_matrix, af.get("communication_matrix.json"), warnings),
        "op_statistic": _optional(at.statistic, af.get("op_statistic.csv"), warnings, "op_type"),
        "api_statistic": _optional(at.statistic, af.get("api_statistic.csv"), warnings, "api_name"),
    }
    mem = _optional(at.memory_record, af.get("memory_record.csv"), warnings)
    if af.analysis_db is not None and (comm_ops is None or tables["step_stats"] is None or tables["comm_matrix"] is None):
        from .db import fill_from_analysis_db  # what the text files lack, from analysis.db

        comm_ops, comm_packets = fill_from_analysis_db(af.analysis_db, tables, comm_ops, comm_packets, warnings)
    if af.db is not None and has_text:
        warnings.append(f"{af.db.name} present too: the text export was read")
    return build_rank(af, meta_a, tl, kd, comm_ops, comm_packets, tables, mem, warnings, export="text")


def build_rank(af, meta_a, tl: Timeline | None, kd, comm_ops, comm_packets, tables, mem, warnings, export: str):
    """Assemble the RankTrace from the tables of either export (text or db)."""
    src = str(af.root)
    device_id = int(kd["device"].max()) if kd is not None and "device" in kd.columns and len(kd) and kd["device"].max() >= 0 else 0

    # host side
    if tl is not None and len(tl.host_ops):
        h = tl.host_ops
        kinds = {n: annotation_kind(n) for n in h["name"].unique()}
        is_ann = h["name"].map(lambda n: kinds[n][0] != "other").to_numpy(dtype=bool)
        ops = h[~is_ann].reset_index(drop=True).copy()
        ann = h[is_ann].reset_index(drop=True).copy()
        ann["kind"] = ann["name"].map(lambda n: kinds[n][0])
        ann["step"] = ann["name"].map(lambda n: kinds[n][1]).astype(np.int64)
        ann["ext_id"] = -1
    else:
        ops = pd.DataFrame({c: [] for c in ("name", "ts", "dur", "tid", "pid")})
        ann = pd.DataFrame({c: [] for c in ("name", "ts", "dur", "tid", "kind", "step")})
    ops["end"] = ops["ts"] + ops["dur"]
    ops["ext_id"] = np.arange(len(ops), dtype=np.int64)
    par, dep = call_tree(ops["tid"].to_numpy(np.int64), ops["ts"].to_numpy(np.float64), ops["end"].to_numpy(np.float64))
    ops["parent"], ops["depth"] = par, dep
    ann["end"] = ann["ts"] + ann["dur"]
    py = tl.python.copy() if tl is not None else pd.DataFrame({c: [] for c in ("name", "ts", "dur", "tid")})
    py["end"] = py["ts"] + py["dur"]

    # runtime (CANN API calls)
    rt = tl.cann.copy() if tl is not None else pd.DataFrame({c: [] for c in ("name", "ts", "dur", "tid", "connection_id", "level")})
    rt["end"] = rt["ts"] + rt["dur"]
    rt["correlation"] = rt["connection_id"].astype(np.int64) if len(rt) else np.zeros(0, np.int64)
    kinds_rt = {n: runtime_kind_npu(str(n)) for n in rt["name"].unique()}
    rt["kind"] = rt["name"].map(kinds_rt) if len(rt) else []
    rt["api"] = rt["level"] if len(rt) else []
    rt = rt.drop(columns=["connection_id", "level"])

    # device tasks
    kernels, memcpy = _device_frames(tl, kd, device_id, rt, warnings)
    hccl_k, coll = _collectives(tl, comm_ops, kd, tables.get("comm_matrix"), meta_a, device_id, len(kernels))
    if len(hccl_k):
        kernels = pd.concat([kernels, hccl_k], ignore_index=True, sort=False)

    # steps
    if len(ann):
        steps, w = steps_of_annotations(_cat(ann.copy(), ("kind",)))
        warnings += w
    else:
        steps = _steps_from_tasks(kernels)

    # times relative to the first event
    starts = [df["ts"].min() for df in (ops, py, kernels, rt, memcpy, ann) if len(df)]
    if not starts:
        raise BadTraceError("no host operators, device tasks or communication ops with times", src)
    first = float(min(starts))

    frames = {
        "cpu_ops": _conform(ops, _empty(kf.CpuOps)),
        "python": _conform(py, _empty(kf.PythonFunctions)),
        "annotations": _conform(ann, _empty(kf.Annotations)),
        "gpu_annotations": _empty(kf.GpuAnnotations),
        "kernels": _conform(kernels, _empty(kf.Kernels)),
        "runtime": _conform(rt, _empty(kf.Runtime)),
        "memcpy": _conform(memcpy, _empty(kf.Memcpy)),
        "syncs": _empty(kf.Syncs),
        "memory": _memory(mem, device_id),
        "steps": steps,
    }
    _cat(frames["kernels"], ("task_type", "op_type", "core_type", "op_state", "hf32_eligible", "input_shapes",
                             "input_dtypes", "input_formats", "output_shapes", "output_dtypes", "output_formats"))  # fmt: skip
    coll = _conform(coll, _COLL_TEMPLATE)
    _cat(coll, ("group", "link_type"))
    links = _links(frames["runtime"], frames["kernels"], frames["memcpy"])
    _ext_ids(tl, frames, links)

    extras = {k: v for k, v in tables.items() if v is not None}
    if comm_ops is not None and len(comm_ops):
        extras["comm_ops"] = comm_ops
    if comm_packets is not None and len(comm_packets):
        extras["comm_packets"] = comm_packets
    if tl is not None:
        for k, v in (("aicore_freq", tl.aicore_freq), ("task_queue", tl.task_queue), ("npu_overlap", tl.overlap),
                     ("hccl_tasks", tl.hccl_tasks)):
            if len(v):
                v = v.copy()
                if "dur" in v.columns:
                    v["end"] = v["ts"] + v["dur"]
                extras[k] = v
    for df in list(frames.values()) + [coll] + list(extras.values()):
        for c in ("ts", "end"):
            if c in df.columns:
                df[c] = df[c].astype(np.float64) - first

    meta = TraceMeta(
        source=os.path.abspath(src),
        rank=-1,
        rank_source="",
        world_size=meta_a.world_size,
        trace_name=af.root.name,
        display_time_unit="us",
        device_properties=[{"name": meta_a.device_name}] if meta_a.device_name else [],
        distributed_info={"rank": meta_a.rank, "world_size": meta_a.world_size, "backend": "hccl",
                          "pg_config": meta_a.parallel_groups, **({"args": meta_a.distributed_args} if meta_a.distributed_args else {})},  # fmt: skip
        versions=meta_a.versions,
        flags={"export": export, **({"profiler_level": meta_a.profiler_level} if meta_a.profiler_level else {}),
               **{k: str(v) for k, v in (meta_a.config.get("common_config") or {}).items()
                  if k in ("record_shapes", "profile_memory", "with_stack", "with_modules")}},  # fmt: skip
        process_names=tl.process_names if tl is not None else {},
        thread_names=tl.thread_names if tl is not None else {},
        format="ascend",
        env=meta_a.env,
    )
    trace = RankTrace(meta=meta, **frames, collectives=coll, links=links,
                      counts=tl.counts if tl is not None else {}, warnings=warnings, extras=extras)  # fmt: skip
    return trace, first


_COMPUTE_COLS = ("name", "ts", "dur", "stream", "task_type", "task_id", "connection_id")


def _device_frames(tl: Timeline | None, kd, device_id: int, rt: pd.DataFrame, warnings: list[str]):
    if tl is not None and len(tl.device):
        dev = tl.device
        hccl_streams = set(tl.hccl_tasks["stream"].tolist()) if len(tl.hccl_tasks) else set()
        # Level0 records no HCCL transfer tasks: their notify tasks still mark the HCCL streams
        hccl_streams |= set(dev.loc[dev["task_type"].isin(("Notify Wait", "Write Value")), "stream"].tolist())
        on_hccl = dev["stream"].isin(hccl_streams).to_numpy()
        skip = dev["task_type"].isin(_SKIP_TASKS).to_numpy() | dev["name"].isin(_SKIP_NAMES).to_numpy()
        is_copy = dev["name"].str.startswith("MEMCPY").to_numpy() & ~on_hccl
        comp = dev[~on_hccl & ~skip & ~is_copy].copy()
        mc = dev[is_copy].copy()
        if kd is not None and len(kd):
            comp = _join_details(comp, kd, warnings)
    elif kd is not None and len(kd):
        comp = kd[~_is_comm_row(kd)].copy()
        comp["task_type"] = comp["core_type"]
        comp["connection_id"] = -1
        mc = pd.DataFrame({c: [] for c in _COMPUTE_COLS})
    else:
        comp = pd.DataFrame({c: [] for c in _COMPUTE_COLS})
        mc = pd.DataFrame({c: [] for c in _COMPUTE_COLS})
    comp["end"] = comp["ts"] + comp["dur"]
    comp["device"] = device_id
    comp["correlation"] = comp["connection_id"].astype(np.int64) if len(comp) else np.zeros(0, np.int64)
    comp = comp.drop(columns=["connection_id"])
    mc = mc.copy()
    mc["end"] = mc["ts"] + mc["dur"]
    mc["device"] = device_id
    mc["op"] = "memcpy"
    mc["correlation"] = mc["connection_id"].astype(np.int64) if len(mc) else np.zeros(0, np.int64)
    mc["kind"] = _copy_direction(tl, mc, rt) if len(mc) else []
    mc["bytes"] = -1
    mc["bandwidth_gbps"] = np.nan
    mc = mc.drop(columns=["connection_id"])
    return comp.sort_values("ts", kind="stable").reset_index(drop=True), mc.sort_values("ts", kind="stable").reset_index(drop=True)


def _is_comm_row(kd: pd.DataFrame) -> np.ndarray:
    """kernel_details.csv also lists the HCCL ops (Accelerator Core HCCL, COMMUNICATION since CANN 8)."""
    return kd["core_type"].astype(str).str.upper().isin(["COMMUNICATION", "HCCL"]).to_numpy() | kd["name"].astype(str).str.startswith("hcom_").to_numpy()


def _join_details(comp: pd.DataFrame, kd: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Attach kernel_details.csv columns to the timeline's compute tasks (same name and start)."""
    extra = kd.drop(columns=[c for c in ("dur", "stream", "task_id") if c in kd.columns])
    extra = extra.drop_duplicates(subset=["name", "ts"])
    out = comp.merge(extra, on=["name", "ts"], how="left")
    matched = int(out["op_type"].notna().sum()) if "op_type" in out.columns else 0
    if len(comp) and matched < 0.9 * len(comp):
        warnings.append(f"kernel_details.csv matched {matched} of {len(comp)} device compute tasks by name and start time")
    return out


def _copy_direction(tl: Timeline | None, mc: pd.DataFrame, rt: pd.DataFrame) -> list[str]:
    """HtoD / DtoH / DtoD from the task-queue dequeue that ran the copy's CANN call."""
    out = [""] * len(mc)
    if tl is None or not len(tl.task_queue) or not len(rt):
        return out
    deq = tl.task_queue[tl.task_queue["kind"] == "dequeue"]
    rt_by_corr = rt[rt["kind"] == "memcpy"].drop_duplicates("correlation").set_index("correlation")
    for i, corr in enumerate(mc["correlation"].tolist()):
        if corr not in rt_by_corr.index:
            continue
        r = rt_by_corr.loc[corr]
        d = deq[(deq["tid"] == r["tid"]) & (deq["ts"] <= r["ts"]) & (deq["ts"] + deq["dur"] >= r["ts"])]
        name = str(d["name"].iloc[0]).lower() if len(d) else ""
        out[i] = ("HtoD" if "host_to_device" in name else "DtoH" if "device_to_host" in name
                  else "DtoD" if "device_to_device" in name else "")  # fmt: skip
    return out


_COLL_TEMPLATE = pd.DataFrame({
    "name": pd.Categorical([]), "kind": pd.Categorical([]), "ts": pd.Series(dtype=np.float64),
    "dur": pd.Series(dtype=np.float64), "end": pd.Series(dtype=np.float64), "source": pd.Categorical([]),
    **{c: pd.Series(dtype=np.int64) for c in ("kernel_idx", "cpu_idx", "device", "stream", "ext_id")},
    **{c: pd.Categorical([]) for c in ("collective", "pg_name", "pg_desc", "pg_ranks")},
    "group_size": pd.Series(dtype=np.int64), "dtype": pd.Categorical([]),
    **{c: pd.Series(dtype=np.int64) for c in ("in_nelems", "out_nelems", "in_bytes", "out_bytes")},
    "in_split": pd.Categorical([]), "out_split": pd.Categorical([]), "seq": pd.Series(dtype=np.int64),
})  # fmt: skip


def _collectives(tl, comm_ops, kd, matrix, meta_a, device_id: int, k_offset: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """HCCL ops as kernel rows (appended after the compute kernels) and their collectives rows."""
    if tl is not None and len(tl.hccl_ops):
        h = tl.hccl_ops.copy()
        h["correlation"] = h["connection_id"].astype(np.int64)
        h["stream"] = _hccl_streams(tl, h)
    elif comm_ops is not None and len(comm_ops):
        h = comm_ops[["name", "ts", "dur", "group"]].copy()
        h["correlation"], h["stream"], h["data_type"], h["count"] = -1, -1, "", -1
    elif kd is not None and len(kd) and _is_comm_row(kd).any():
        h = kd.loc[_is_comm_row(kd), ["name", "ts", "dur"]].copy()
        h["group"], h["correlation"], h["stream"], h["data_type"], h["count"] = "", -1, -1, "", -1
    else:
        return pd.DataFrame({c: [] for c in ("name", "ts", "dur")}), _COLL_TEMPLATE.copy()
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
        size = dtype_bytes(str(getattr(r, "data_type", "") or "").strip())
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


def _steps_from_tasks(kernels: pd.DataFrame) -> pd.DataFrame:
    if not len(kernels) or "step" not in kernels.columns:
        return pd.DataFrame({"step": pd.Series(dtype=np.int64), "ts": pd.Series(dtype=np.float64),
                             "dur": pd.Series(dtype=np.float64), "end": pd.Series(dtype=np.float64)})  # fmt: skip
    k = kernels[kernels["step"].fillna(-1) >= 0]
    g = k.groupby("step").agg(ts=("ts", "min"), end=("end", "max")).reset_index()
    g["step"] = g["step"].astype(np.int64)
    g["dur"] = g["end"] - g["ts"]
    return g[["step", "ts", "dur", "end"]].sort_values("ts").reset_index(drop=True)


def _memory(mem, device_id: int) -> pd.DataFrame:
    tmpl = _empty(kf.Memory)
    if mem is None or not len(mem):
        return tmpl
    mb = float(1 << 20)
    df = pd.DataFrame({
        "name": mem["name"], "ts": mem["ts"], "dur": 0.0, "end": mem["ts"], "bytes": 0,
        "total_allocated": np.nan_to_num(mem["allocated_mb"].to_numpy() * mb, nan=-1).astype(np.int64),
        "total_reserved": np.nan_to_num(mem["reserved_mb"].to_numpy() * mb, nan=-1).astype(np.int64),
        "addr": -1, "device_type": 1, "device_id": device_id,
    })  # fmt: skip
    return _conform(df, tmpl)


def _links(rt: pd.DataFrame, kernels: pd.DataFrame, memcpy: pd.DataFrame) -> pd.DataFrame:
    cols = ["correlation", "gpu_kind", "gpu_idx", "gpu_ts", "gpu_ext_id", "runtime_idx", "launch_ts", "launch_tid",
            "runtime_ext_id", "ext_id"]  # fmt: skip
    if not len(rt):
        return _typed_links(pd.DataFrame({c: [] for c in cols}))
    prio = rt["kind"].astype(str).map({"launch": 0, "memcpy": 0}).fillna(1).to_numpy()
    r = pd.DataFrame({"correlation": rt["correlation"].to_numpy(), "runtime_idx": np.arange(len(rt)), "prio": prio,
                      "launch_ts": rt["ts"].to_numpy(), "launch_tid": rt["tid"].to_numpy(),
                      "runtime_ext_id": rt["ext_id"].to_numpy()})  # fmt: skip
    r = r[r["correlation"] >= 0].sort_values(["correlation", "prio"]).drop_duplicates("correlation")
    parts = []
    for kind, df in (("kernel", kernels), ("memcpy", memcpy)):
        if not len(df):
            continue
        g = pd.DataFrame({"correlation": df["correlation"].to_numpy(), "gpu_idx": np.arange(len(df)),
                          "gpu_ts": df["ts"].to_numpy(), "gpu_ext_id": df["ext_id"].to_numpy()})  # fmt: skip
        g = g[g["correlation"] >= 0].merge(r, on="correlation", how="inner")
        g["gpu_kind"] = kind
        parts.append(g)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in cols})
    out["ext_id"] = out["gpu_ext_id"] if len(out) else []
    return _typed_links(out[cols])


def _typed_links(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in ("correlation", "gpu_idx", "gpu_ext_id", "runtime_idx", "launch_tid", "runtime_ext_id", "ext_id"):
        df[c] = df[c].astype(np.int64)
    for c in ("gpu_ts", "launch_ts"):
        df[c] = df[c].astype(np.float64)
    df["gpu_kind"] = pd.Categorical(df["gpu_kind"].astype(object))
    return df.reset_index(drop=True)


def _ext_ids(tl: Timeline | None, frames: dict[str, pd.DataFrame], links: pd.DataFrame) -> None:
    """The host op that issued each device task (torch_to_npu flows: op start -> task start);
    the innermost op starting at the flow's start wins. Runtime calls take their task's id."""
    ops = frames["cpu_ops"]
    if tl is None or not len(tl.op_flows) or not len(ops):
        return
    # called before the frames are moved to the rank's origin: flows and frames share one time axis
    key = pd.DataFrame({"tid": ops["tid"].to_numpy(), "ts": np.round(ops["ts"].to_numpy(), 3),
                        "depth": ops["depth"].to_numpy(), "ext": ops["ext_id"].to_numpy()})  # fmt: skip
    key = key.sort_values("depth", ascending=False).drop_duplicates(["tid", "ts"]).set_index(["tid", "ts"])["ext"]
    fl = tl.op_flows
    ext = key.reindex(pd.MultiIndex.from_arrays([fl["host_tid"].to_numpy(), np.round(fl["host_ts"].to_numpy(), 3)])).to_numpy()
    dev_ts = np.round(fl["device_ts"].to_numpy(), 3)
    ok = ~np.isnan(ext.astype(np.float64))
    by_ts = pd.Series(ext[ok].astype(np.int64), index=dev_ts[ok])
    by_ts = by_ts[~by_ts.index.duplicated()]
    for name in ("kernels", "memcpy"):
        df = frames[name]
        if len(df):
            got = by_ts.reindex(np.round(df["ts"].to_numpy(), 3)).to_numpy()
            df["ext_id"] = np.where(np.isnan(got.astype(np.float64)), df["ext_id"].to_numpy(), np.nan_to_num(got, nan=-1)).astype(np.int64)
    if len(links):
        for kind, name in (("kernel", "kernels"), ("memcpy", "memcpy")):
            sel = (links["gpu_kind"] == kind).to_numpy()
            idx = links["gpu_idx"].to_numpy()[sel]
            e = frames[name]["ext_id"].to_numpy()[idx]
            links.loc[sel, "gpu_ext_id"] = e
            links.loc[sel, "ext_id"] = e
            rt_idx = links["runtime_idx"].to_numpy()[sel]
            rext = frames["runtime"]["ext_id"].to_numpy().copy()
            rext[rt_idx] = e
            frames["runtime"]["ext_id"] = rext
            links.loc[sel, "runtime_ext_id"] = e
