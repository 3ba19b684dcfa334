"""One rank of torch_npu profiler output (``*_ascend_pt``) into a RankTrace: ``build_rank``, from the
intermediate tables of either export (the text files: reader.py; the sqlite export: db.py).

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

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from ..bundle import RankTrace, TraceMeta
from ..columns import call_tree
from ..kineto import frames as kf
from ..kineto.joins import steps as steps_of_annotations
from ..names import annotation_kind
from .collectives import COLL_TEMPLATE, hccl_collectives, is_comm_row
from .links import assign_ext_ids, device_links
from .timeline import Timeline

_SKIP_TASKS = {"EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "PLACE_HOLDER_SQE", "Notify Wait", "Write Value",
               "NOTIFY_WAIT_SQE", "NOTIFY_RECORD_SQE", "WRITE_VALUE_SQE"}  # fmt: skip
_SKIP_NAMES = {"EVENT_RECORD", "EVENT_WAIT", "PROFILING_ENABLE", "PROFILING_DISABLE", "NOTIFY_WAIT", "NOTIFY_RECORD"}


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


def build_rank(af, meta_a, tl: Timeline | None, kd, comm_ops, comm_packets, tables, mem, warnings, export: str):
    """Assemble the RankTrace from the tables of either export (text or db)."""
    src = str(af.root)
    device_id = int(kd["device"].max()) if kd is not None and "device" in kd.columns and len(kd) and kd["device"].max() >= 0 else 0

    ops, ann, py = _host_frames(tl)
    rt = _runtime_frame(tl)

    # device tasks
    kernels, memcpy = _device_frames(tl, kd, device_id, rt, warnings)
    hccl_k, coll = hccl_collectives(tl, comm_ops, kd, tables.get("comm_matrix"), meta_a, device_id, len(kernels))
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
    coll = _conform(coll, COLL_TEMPLATE)
    _cat(coll, ("group", "link_type"))
    links = device_links(frames["runtime"], frames["kernels"], frames["memcpy"])
    assign_ext_ids(tl, frames, links)

    extras = _extras(tl, tables, comm_ops, comm_packets)
    for df in list(frames.values()) + [coll] + list(extras.values()):
        for c in ("ts", "end"):
            if c in df.columns:
                df[c] = df[c].astype(np.float64) - first

    meta = _trace_meta(af, meta_a, tl, export)
    trace = RankTrace(meta=meta, **frames, collectives=coll, links=links,
                      counts=tl.counts if tl is not None else {}, warnings=warnings, extras=extras)  # fmt: skip
    return trace, first


def _host_frames(tl: Timeline | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The host side: operators (with their call tree), annotations (ProfilerStep#N ...) and
    Python functions."""
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
    return ops, ann, py


def _runtime_frame(tl: Timeline | None) -> pd.DataFrame:
    """The runtime frame: CANN API calls."""
    rt = tl.cann.copy() if tl is not None else pd.DataFrame({c: [] for c in ("name", "ts", "dur", "tid", "connection_id", "level")})
    rt["end"] = rt["ts"] + rt["dur"]
    rt["correlation"] = rt["connection_id"].astype(np.int64) if len(rt) else np.zeros(0, np.int64)
    kinds_rt = {n: runtime_kind_npu(str(n)) for n in rt["name"].unique()}
    rt["kind"] = rt["name"].map(kinds_rt) if len(rt) else []
    rt["api"] = rt["level"] if len(rt) else []
    return rt.drop(columns=["connection_id", "level"])


def _extras(tl: Timeline | None, tables: dict, comm_ops, comm_packets) -> dict[str, pd.DataFrame]:
    """The rank's extra tables (summary tables, communication ops and packets, timeline tables)."""
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
    return extras


def _trace_meta(af, meta_a, tl: Timeline | None, export: str) -> TraceMeta:
    return TraceMeta(
        source=os.path.abspath(str(af.root)),
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
        comp = kd[~is_comm_row(kd)].copy()
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
