"""One table of every device activity with a stream (kernels, memcpy, memset, cuda_sync), with
HTA 0.5.0's kernel type and hermes's communication flag of each (analyzers/timeline/overlap.py,
docs/analysis/overlap.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace

# HTA 0.5.0 kernel types (utils.get_kernel_type; Python re.match, i.e. anchored at the start)
HTA_COMM_RE = r"nccl.*Kernel"
HTA_MEMORY_RE = r"Memcpy|Memset|dma"
HTA_NOT_COMPUTE_RE = r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)"
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3

# hermes: communication kernels are the collectives frame's kernels plus anything named nccl/rccl
COMM_NAME_RE = r"(?i)^(?:void\s+)?(?:nccl|rccl)"

# event sources in the device-event table
SRC_KERNEL, SRC_MEMCPY, SRC_MEMSET, SRC_SYNC = 0, 1, 2, 3

EVENT_COLUMNS = ("ts", "end", "stream", "device", "correlation", "src", "hta", "comm", "launch_ts", "row")


def per_name(names: pd.Series, fn) -> np.ndarray:
    """Apply a vectorised classifier (Series of str -> array) once per distinct name."""
    if not len(names):
        return np.zeros(0)
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes = names.cat.codes.to_numpy()
        cats = pd.Series(np.append(names.cat.categories.astype(str).to_numpy(), ""))
    else:
        codes, uniq = pd.factorize(names.astype(str))
        cats = pd.Series(np.append(np.asarray(uniq, dtype=object), ""))
    vals = np.asarray(fn(cats))
    return vals[np.where(codes < 0, len(cats) - 1, codes)]


def _hta_type_of(cats: pd.Series) -> np.ndarray:
    comm = cats.str.match(HTA_COMM_RE).to_numpy(dtype=bool)
    mem = cats.str.match(HTA_MEMORY_RE).to_numpy(dtype=bool)
    not_comp = cats.str.match(HTA_NOT_COMPUTE_RE).to_numpy(dtype=bool)
    return np.where(comm, COMMUNICATION, np.where(mem, MEMORY, np.where(~not_comp, COMPUTATION, OTHER)))


def hta_kernel_type(names: pd.Series) -> np.ndarray:
    """HTA 0.5.0's kernel type of each name: COMPUTATION 0, COMMUNICATION 1, MEMORY 2, OTHER 3."""
    return per_name(names, _hta_type_of).astype(np.int8)


def _launch_ts(trace: RankTrace, kind: str, n: int) -> np.ndarray:
    """Start of the runtime call that launched each row of the frame (NaN when not linked)."""
    out = np.full(n, np.nan)
    links = trace.links
    if n and len(links):
        sel = links[links["gpu_kind"] == kind]
        if len(sel):
            idx = sel["gpu_idx"].to_numpy()
            ok = (idx >= 0) & (idx < n)
            # read the launch time from the runtime frame (links.launch_ts is not moved when the
            # bundle puts ranks on a common origin)
            rt_idx = sel["runtime_idx"].to_numpy()
            rt_ts = trace.runtime["ts"].to_numpy(dtype=np.float64)
            ok &= (rt_idx >= 0) & (rt_idx < len(rt_ts))
            out[idx[ok]] = rt_ts[rt_idx[ok]]
    return out


def device_events(trace: RankTrace) -> pd.DataFrame:
    """Every device activity with a stream (kernels, memcpy, memset, cuda_sync) in one table:
    ts, end, stream, device, correlation, src, hta (HTA kernel type), comm (hermes), launch_ts,
    row (row index in the source frame)."""
    parts = []
    k = trace.kernels
    if len(k):
        comm = np.zeros(len(k), dtype=bool)
        coll = trace.collectives
        if len(coll):
            idx = coll.loc[coll["source"] == "kernel", "kernel_idx"].to_numpy()
            idx = idx[(idx >= 0) & (idx < len(k))]
            comm[idx] = True
        comm |= per_name(k["name"], lambda c: c.str.contains(COMM_NAME_RE).to_numpy(dtype=bool)).astype(bool)
        parts.append((k, np.full(len(k), SRC_KERNEL), comm, _launch_ts(trace, "kernel", len(k))))
    m = trace.memcpy
    if len(m):
        src = np.where(m["op"].astype(str).to_numpy() == "memset", SRC_MEMSET, SRC_MEMCPY)
        parts.append((m, src, np.zeros(len(m), dtype=bool), _launch_ts(trace, "memcpy", len(m))))
    s = trace.syncs
    if len(s):
        no_comm = np.zeros(len(s), dtype=bool)
        parts.append((s, np.full(len(s), SRC_SYNC), no_comm, _launch_ts(trace, "sync", len(s))))
    if not parts:
        return pd.DataFrame({c: np.zeros(0) for c in EVENT_COLUMNS})
    out = pd.DataFrame(
        {
            "ts": np.concatenate([f["ts"].to_numpy(dtype=np.float64) for f, *_ in parts]),
            "end": np.concatenate([f["end"].to_numpy(dtype=np.float64) for f, *_ in parts]),
            "stream": np.concatenate([f["stream"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "device": np.concatenate([f["device"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "correlation": np.concatenate([f["correlation"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "src": np.concatenate([p[1] for p in parts]).astype(np.int8),
            "hta": np.concatenate([hta_kernel_type(f["name"]) for f, *_ in parts]),
            "comm": np.concatenate([p[2] for p in parts]),
            "launch_ts": np.concatenate([p[3] for p in parts]),
            "row": np.concatenate([np.arange(len(f)) for f, *_ in parts]),
        }
    )
    # HTA: a GPU event is one whose stream is not -1
    return out[out["stream"].to_numpy() != -1].reset_index(drop=True)
