"""Joins inside one rank: collectives (kernel + recording CPU op), CPU→GPU links, steps."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ...core.dtypes import element_bytes
from ..args import decode
from ..bundle import TraceMeta
from ..names import collective_kind, is_collective_kernel
from .frames import GLOO_SPAN
from .schema import CollectiveArgs

C10D_PREFIX = "c10d::"


def _split_text(v) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else msgspec.json.encode(v).decode()


def collectives(cpu_ops: pd.DataFrame, cpu_args: dict, kernels: pd.DataFrame, kernel_args: dict,
                annotations: pd.DataFrame | None = None, gloo_types: dict | None = None,
                meta: TraceMeta | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per collective: its kernel (when on a device) joined with the CPU op that
    recorded its parameters (record_param_comms), or the CPU op alone on CPU-only traces. On a
    trace without device activity whose collectives ran on gloo's threads (``gloo:*`` spans),
    each span joined with the op that issued it (``host_collectives``)."""
    if not len(kernels) and annotations is not None and meta is not None:
        host = host_collectives(cpu_ops, cpu_args, annotations, gloo_types or {}, meta)
        if host is not None:
            return host
    coll_rows = sorted(cpu_args)
    param_set = set(coll_rows)
    cpu_ext = cpu_ops["ext_id"].to_numpy()
    parent = cpu_ops["parent"].to_numpy()
    with_ext = np.flatnonzero(cpu_ext >= 0)
    uniq, first = np.unique(cpu_ext[with_ext], return_index=True)  # the first op of each External id
    ext_index: dict[int, int] = dict(zip(uniq.tolist(), with_ext[first].tolist()))
    for i in coll_rows:  # the recording op wins over an enclosing op with the same External id
        ext_index[int(cpu_ext[i])] = i
    cpu_cols = {c: cpu_ops[c].to_numpy() for c in ("ts", "dur", "ext_id")}
    cpu_names = cpu_ops["name"]

    rows: list[dict[str, Any]] = []
    used: set[int] = set()
    if len(kernels):
        names = kernels["name"]
        by_cat = np.array([is_collective_kernel(str(c)) for c in names.cat.categories], dtype=bool)
        picked = by_cat[names.cat.codes.to_numpy()]
        picked[list(kernel_args)] = True
        k_ts, k_dur = kernels["ts"].to_numpy(), kernels["dur"].to_numpy()
        k_codes = names.cat.codes.to_numpy()
        kname_of = names.cat.categories
        k_dev, k_stream, k_ext = (kernels[c].to_numpy() for c in ("device", "stream", "ext_id"))
        for k in np.flatnonzero(picked).tolist():
            src = kernel_args.get(k)
            pidx = -1
            j = ext_index.get(int(k_ext[k]), -1) if k_ext[k] >= 0 else -1
            hops = 0
            while j >= 0 and j not in param_set and hops < 8:  # walk up to the recording op
                j = int(parent[j])
                hops += 1
            if j in param_set:
                pidx = j
                used.add(j)
                src = src or cpu_args[j]
            rows.append(_collective_row(src, str(kname_of[k_codes[k]]), "kernel", k, pidx, float(k_ts[k]),
                                        float(k_dur[k]), int(k_dev[k]), int(k_stream[k]), int(k_ext[k])))  # fmt: skip
    for i in coll_rows:
        if i not in used:
            rows.append(_collective_row(cpu_args[i], str(cpu_names.cat.categories[cpu_names.cat.codes.iat[i]]), "cpu", -1, i,
                                        float(cpu_cols["ts"][i]),
                                        float(cpu_cols["dur"][i]), -1, -1, int(cpu_cols["ext_id"][i])))  # fmt: skip
    return _frame(rows)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=_COLL_COLUMNS)
    for c in ("name", "kind", "source", "collective", "pg_name", "pg_desc", "pg_ranks", "dtype", "in_split",
              "out_split"):  # fmt: skip
        df[c] = pd.Categorical(df[c].astype(object))
    for c in ("kernel_idx", "cpu_idx", "device", "stream", "ext_id", "group_size", "in_nelems", "out_nelems",
              "in_bytes", "out_bytes", "seq"):  # fmt: skip
        df[c] = df[c].astype(np.int64)
    for c in ("ts", "dur", "end"):
        df[c] = df[c].astype(np.float64)
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def host_collectives(cpu_ops: pd.DataFrame, cpu_args: dict, annotations: pd.DataFrame, gloo_types: dict,
                     meta: TraceMeta) -> pd.DataFrame | None:  # fmt: skip
    """The collectives of a CPU-only trace whose backend ran them on its own threads (gloo: a
    ``gloo:<kind>`` span on a worker thread while the transfer runs, PyTorch 2.x), as rows of
    source ``host``: the span's time (the transfer, the wait for the peers included), joined with
    the op that issued it (``record_param_comms`` when recorded, else the ``c10d::<kind>_``
    dispatcher op on the caller's thread: DDP's reducer inside the backward, or
    ``dist.all_reduce``). Within each kind the n-th span belongs to the n-th issuing op that
    started before it (gloo runs one group's collectives in the order they were issued). Sizes:
    the issuing op's recorded sizes, else the elements of its first argument (``Input Dims``) x
    the span's element type. The group: the one the op recorded, else the trace's only process
    group. None when the trace has no gloo span (other readers then apply)."""
    if not len(annotations):
        return None
    names = annotations["name"].astype(str).to_numpy()
    span = np.flatnonzero(np.char.startswith(names.astype(str), GLOO_SPAN) & (annotations["dur"].to_numpy() > 0))
    if not len(span):
        return None
    op_names = cpu_ops["name"].astype(str).to_numpy() if len(cpu_ops) else np.zeros(0, dtype=str)
    if cpu_args:
        issuers = np.array(sorted(cpu_args), dtype=np.int64)
    else:
        issuers = np.flatnonzero(np.char.startswith(op_names.astype(str), C10D_PREFIX)) if len(op_names) else \
            np.zeros(0, np.int64)  # fmt: skip
    op_kind = {int(i): collective_kind(cpu_args[int(i)].collective or op_names[i]) if cpu_args else
               collective_kind(op_names[i]) for i in issuers.tolist()}  # fmt: skip
    pgs = meta.process_groups
    only = pgs[0] if len(pgs) == 1 and isinstance(pgs[0], dict) else {}
    op_ts = cpu_ops["ts"].to_numpy(float) if len(cpu_ops) else np.zeros(0)
    a_ts, a_dur = annotations["ts"].to_numpy(float), annotations["dur"].to_numpy(float)
    a_ext = annotations["ext_id"].to_numpy()
    queues: dict[str, list[int]] = {}
    for i in sorted(op_kind, key=lambda j: op_ts[j]):
        if op_kind[i] != "other":
            queues.setdefault(op_kind[i], []).append(i)
    taken = dict.fromkeys(queues, 0)
    rows: list[dict[str, Any]] = []
    for j in span[np.argsort(a_ts[span], kind="stable")].tolist():
        kind = collective_kind(names[j])
        q = queues.get(kind, [])
        k = taken.get(kind, 0)
        issuer = -1
        if k < len(q) and op_ts[q[k]] <= a_ts[j] + 1.0:  # issued before its span starts (1 µs of clock slack)
            issuer = q[k]
            taken[kind] = k + 1
        a = _host_args(cpu_ops, cpu_args, issuer, kind, gloo_types.get(j, ""), only)
        rows.append(_collective_row(a, names[j], "host", -1, issuer, float(a_ts[j]), float(a_dur[j]), -1, -1,
                                    int(a_ext[j])))  # fmt: skip
    return _frame(rows)


def _host_args(cpu_ops: pd.DataFrame, cpu_args: dict, issuer: int, kind: str, dtype: str, pg: dict) -> CollectiveArgs:
    """What is known of one host collective: the issuing op's recorded parameters, else its size
    from ``Input Dims``, the span's element type and the trace's only process group."""
    if issuer >= 0 and issuer in cpu_args:
        return cpu_args[issuer]
    n = _elements(str(cpu_ops["input_dims"].iat[issuer]), str(cpu_ops["input_types"].iat[issuer])) \
        if issuer >= 0 else None  # fmt: skip
    ranks = pg.get("ranks")
    return CollectiveArgs(
        collective=kind, in_nelems=n, out_nelems=n, dtype=dtype or None,
        group_size=int(pg["pg_size"]) if isinstance(pg.get("pg_size"), int) else None,
        pg_name=str(pg["pg_name"]) if pg.get("pg_name") is not None else None,
        pg_desc=str(pg["pg_desc"]) if isinstance(pg.get("pg_desc"), str) else None,
        pg_ranks=ranks if isinstance(ranks, list) else None,
    )  # fmt: skip


def _elements(dims: str, types: str) -> int | None:
    """Elements of an op's first argument from its ``Input Dims`` text: a tensor's shape, or a
    list of shapes (``TensorList``, e.g. ``[[[265738]]]`` for one bucket); None when not recorded."""
    d, t = decode(dims), decode(types)
    if not isinstance(d, list) or not d:
        return None
    first = d[0]
    is_list = isinstance(t, list) and t and t[0] == "TensorList"
    shapes = first if is_list else [first]
    total = 0
    for sh in shapes if isinstance(shapes, list) else []:
        if not isinstance(sh, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sh):
            return None
        total += math.prod(sh)
    return total if shapes else None


_COLL_COLUMNS = [
    "name", "kind", "ts", "dur", "end", "source", "kernel_idx", "cpu_idx", "device", "stream",
    "ext_id", "collective", "pg_name", "pg_desc", "pg_ranks", "group_size", "dtype",
    "in_nelems", "out_nelems", "in_bytes", "out_bytes", "in_split", "out_split", "seq",
]  # fmt: skip


def _collective_row(a, name, source, k, pidx, ts, dur, dev, stream, ext_id) -> dict[str, Any]:
    coll = a.collective if a is not None else None
    size = element_bytes(a.dtype) if a is not None and a.dtype else None
    in_n = a.in_nelems if a is not None and a.in_nelems is not None else -1
    out_n = a.out_nelems if a is not None and a.out_nelems is not None else -1
    return {
        "name": name,
        "kind": collective_kind(coll or name),
        "ts": ts,
        "dur": dur,
        "end": ts + dur,
        "source": source,
        "kernel_idx": k,
        "cpu_idx": pidx,
        "device": dev,
        "stream": stream,
        "ext_id": ext_id,
        "collective": coll or "",
        "pg_name": "" if a is None or a.pg_name is None else str(a.pg_name),
        "pg_desc": (a.pg_desc or "") if a is not None else "",
        "pg_ranks": _split_text(a.pg_ranks) if a is not None else "",
        "group_size": a.group_size if a is not None and a.group_size is not None else -1,
        "dtype": (a.dtype or "") if a is not None else "",
        "in_nelems": in_n,
        "out_nelems": out_n,
        "in_bytes": in_n * size if size and in_n >= 0 else -1,
        "out_bytes": out_n * size if size and out_n >= 0 else -1,
        "in_split": _split_text(a.in_split) if a is not None else "",
        "out_split": _split_text(a.out_split) if a is not None else "",
        "seq": a.seq if a is not None and a.seq is not None else -1,
    }


def links(runtime: pd.DataFrame, gpu: dict[str, pd.DataFrame], flows: pd.DataFrame) -> pd.DataFrame:
    """CPU→GPU links: each runtime call joined to the device activity it caused, by correlation
    id; when the trace's device activities carry no correlation, by the flow (ac2g) pairs."""
    rt = pd.DataFrame(
        {
            "correlation": runtime["correlation"].to_numpy(),
            "runtime_idx": np.arange(len(runtime), dtype=np.int64),
            "launch_ts": runtime["ts"].to_numpy(),
            "launch_tid": runtime["tid"].to_numpy(),
            "runtime_ext_id": runtime["ext_id"].to_numpy(),
        }
    )
    rt = rt[rt["correlation"] >= 0].drop_duplicates("correlation")
    parts = []
    for kind, df in gpu.items():
        if not len(df):
            continue
        g = pd.DataFrame(
            {
                "correlation": df["correlation"].to_numpy(),
                "gpu_kind": kind,
                "gpu_idx": np.arange(len(df), dtype=np.int64),
                "gpu_ts": df["ts"].to_numpy(),
                "gpu_ext_id": df["ext_id"].to_numpy(),
            }
        )
        if (g["correlation"] < 0).all() and len(flows):
            g = _correlate_by_flow(g, df, flows)
        parts.append(g[g["correlation"] >= 0].merge(rt, on="correlation", how="inner"))
    cols = ["correlation", "gpu_kind", "gpu_idx", "gpu_ts", "gpu_ext_id", "runtime_idx", "launch_ts",
            "launch_tid", "runtime_ext_id"]  # fmt: skip
    if not parts:
        out = pd.DataFrame({c: np.zeros(0, dtype=np.float64 if "ts" in c else np.int64) for c in cols})
    else:
        out = pd.concat(parts, ignore_index=True)[cols]
    out["gpu_kind"] = pd.Categorical(out["gpu_kind"].astype(object))
    out["ext_id"] = np.where(out["gpu_ext_id"] >= 0, out["gpu_ext_id"], out["runtime_ext_id"]).astype(np.int64)
    return out.sort_values("launch_ts", kind="stable").reset_index(drop=True)


def _correlate_by_flow(g: pd.DataFrame, df: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """A flow's finish half sits on the device activity (same ts); its id is the correlation."""
    by_ts = pd.Series(flows["id"].to_numpy(), index=flows["ts"].round(3).to_numpy())
    by_ts = by_ts[~by_ts.index.duplicated()]
    g = g.copy()
    g["correlation"] = by_ts.reindex(df["ts"].round(3).to_numpy()).fillna(-1).to_numpy(np.int64)
    return g


MIN_STEP_US = 1.0


def steps(annotations: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    warnings: list[str] = []
    st = annotations[annotations["kind"] == "step"]
    if not len(st):
        return pd.DataFrame({"step": pd.Series(dtype=np.int64), "ts": pd.Series(dtype=np.float64),
                             "dur": pd.Series(dtype=np.float64), "end": pd.Series(dtype=np.float64)}), warnings  # fmt: skip
    st = st[["step", "ts", "dur", "end"]]
    # a step shorter than a microsecond holds nothing to analyse (and no real training step is)
    empty = ~(st["dur"] >= MIN_STEP_US)
    if empty.any():
        warnings.append(f"ProfilerStep(s) {sorted(set(st.loc[empty, 'step'].tolist()))[:8]} last under "
                        f"{MIN_STEP_US:g} µs: left out")  # fmt: skip
        st = st[~empty]
    st = st.sort_values(["step", "dur"], ascending=[True, False])
    dup = st["step"].duplicated()
    if dup.any():
        warnings.append(
            f"ProfilerStep recorded more than once for step(s) {sorted(set(st.loc[dup, 'step'].tolist()))[:8]}: "
            "kept the longest record of each"
        )
    st = st[~dup].sort_values("ts").reset_index(drop=True)
    # a ProfilerStep that holds the next one whole is not a step of the loop (one annotation
    # spanning the others, written by hand or merged from two traces): it would double the mean
    end = st["end"].to_numpy()
    holds = np.zeros(len(st), dtype=bool)
    holds[:-1] = end[:-1] >= end[1:]
    if holds.any():
        warnings.append(f"ProfilerStep(s) {st.loc[holds, 'step'].tolist()[:8]} span the step(s) after them (nested "
                        "step annotations): left out")  # fmt: skip
        st = st[~holds].reset_index(drop=True)
    return st, warnings


