"""Per-category column builders for the Kineto reader.

The reader decodes events a chunk at a time; each builder turns a chunk of one category into
numpy columns (names interned through a ``NameTable``) and, at the end, into one DataFrame
with times relative to the file's first event. Nothing per event outlives its chunk except
the few CPU ops and kernels that carry collective parameters.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from . import schema as ks
from .. import validate as vd
from ..columns import NameTable, call_tree, dim3, floats, floats_of, ids, ids_of, ints_of, streams
from ..names import annotation_kind, memcpy_parts, runtime_kind


_NAME = attrgetter("name")
_DIMS = attrgetter("input_dims")
_TYPES = attrgetter("input_types")
GLOO_SPAN = "gloo:"


def _first_type(raw: msgspec.Raw) -> str:
    """The first entry of a recorded ``Input type`` list, '' when there is none."""
    if not raw:
        return ""
    try:
        v = msgspec.json.decode(bytes(raw))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return ""
    return v[0][:40] if isinstance(v, list) and v and isinstance(v[0], str) else ""
_CONCRETE = attrgetter("concrete_inputs")


def streams_of(args: list, events: list[ks.Event]) -> np.ndarray:
    fast = ints_of(args, "stream")
    if (fast >= 0).all():
        return fast
    return streams([a.stream for a in args], [e.tid for e in events])


def ext_ids_of(args: list) -> np.ndarray:
    """External id, else its PyTorch 1.8-1.9 spelling "external id" (device and runtime events)."""
    ext = ints_of(args, "ext_id")
    if len(ext) and ext.min() < 0:
        ext = np.where(ext >= 0, ext, ints_of(args, "ext_id_2021"))
    return ext


def decode_args(events: list[ks.Event], typ: type, path: str, what: str) -> list[Any]:
    joined = b"[" + b",".join([e.args for e in events]) + b"]"
    try:
        return msgspec.json.decode(joined, type=list[typ])
    except msgspec.ValidationError as exc:
        msg = str(exc)
        raise BadTraceError(f"ill-typed args in a {what} event: {msg.split(' - at ')[0]}", path) from None
    except RecursionError:
        raise BadTraceError(f"args of a {what} event nested too deeply", path) from None
    except UnicodeDecodeError:
        raise BadTraceError(f"invalid UTF-8 text in the args of a {what} event", path) from None
    except msgspec.DecodeError as exc:  # msgspec 0.23 reports invalid UTF-8 so
        what_ = "invalid UTF-8 text" if "utf-8" in str(exc).lower() else f"invalid JSON ({exc})"
        raise BadTraceError(f"{what_} in the args of a {what} event", path) from None


def times(events: list[ks.Event], path: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    ts = floats_of(events, "ts")
    if np.isnan(ts).any():
        bad = events[int(np.flatnonzero(np.isnan(ts))[0])]
        raise BadTraceError(f"{what} event {bad.name!r} has a missing or non-numeric 'ts' ({bad.ts!r})", path)
    dur = floats_of(events, "dur", default=0.0)
    if np.isnan(dur).any():
        bad = events[int(np.flatnonzero(np.isnan(dur))[0])]
        raise BadTraceError(f"{what} event {bad.name!r} has a non-numeric 'dur' ({bad.dur!r})", path)
    return ts, dur


def _duplicate_candidates(ts: np.ndarray, dur: np.ndarray, name: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The rows of ``idx`` sharing (ts, dur, name) with another: only they can be exact
    duplicates, so the all-column comparison runs on them alone (usually none)."""
    if len(idx) < 2:
        return idx
    key_ts, key_dur, key_name = ts[idx], dur[idx], name[idx]
    order = np.lexsort((key_name, key_dur, key_ts))
    same = (np.diff(key_ts[order]) == 0) & (np.diff(key_dur[order]) == 0) & (np.diff(key_name[order]) == 0)
    if not same.any():
        return idx[:0]
    hit = np.zeros(len(idx), dtype=bool)
    hit[order[1:][same]] = True
    hit[order[:-1][same]] = True
    return idx[hit]  # ascending, so "first copy kept" still means the earliest event


class FrameBuilder:
    """Collects chunks of one event category. Subclasses add their own columns."""

    what = "event"
    args_type: type | None = None
    TABLES = {"names": "name"}  # NameTable attribute -> the chunk column holding its codes

    def __init__(self, path: str) -> None:
        self.path = path
        self.names = NameTable()
        self.chunks: list[dict[str, np.ndarray]] = []
        self.n = 0
        self.drops = vd.Drops()

    def add(self, events: list[ks.Event]) -> None:
        if events:
            self._add(events, decode_args(events, self.args_type, self.path, self.what) if self.args_type else [])

    def _add(self, events: list[ks.Event], args: list[Any]) -> None:
        ts, dur = times(events, self.path, self.what)
        with np.errstate(invalid="ignore"):
            non_finite = ~(np.isfinite(ts) & np.isfinite(dur))
            negative = ~non_finite & (dur < 0)
        if non_finite.any() or negative.any():  # physically impossible: dropped, counted (validate.py)
            for mask, reason in ((non_finite, vd.NON_FINITE), (negative, vd.NEGATIVE)):
                if mask.any():
                    e = events[int(np.flatnonzero(mask)[0])]
                    self.drops.add(self.what, reason, int(mask.sum()), vd.example(e.name, e.ts, e.dur))
            keep = np.flatnonzero(~(non_finite | negative))
            events = [events[i] for i in keep.tolist()]
            args = [args[i] for i in keep.tolist()] if args else args
            ts, dur = ts[keep], dur[keep]
            if not events:
                return
        cols = {"name": self.names.codes(list(map(_NAME, events))), "ts": ts, "dur": dur}
        try:
            cols.update(self.extract(events, args, self.n))
        except OverflowError:
            raise BadTraceError(f"a {self.what} event has an integer (pid, tid, stream, device, correlation, External id, "
                                "bytes) outside the 64-bit integer range", self.path) from None  # fmt: skip
        self.chunks.append(cols)
        self.n += len(events)

    def finalize(self, window: tuple[float, float] | None) -> None:
        """Drop the events outside the file's plausible time span and exact duplicates (every
        column equal), counted in ``drops``; the rows left become one chunk."""
        cols = self._columns()
        if not cols:
            return
        ts, dur = cols["ts"], cols["dur"]
        keep = ~vd.outside(ts, dur, window)
        if not keep.all():
            i = int(np.flatnonzero(~keep)[0])
            self.drops.add(self.what, vd.OUTSIDE, int((~keep).sum()), vd.example(self._name(cols, i), ts[i], dur[i]))
        idx = _duplicate_candidates(ts, dur, cols["name"], np.flatnonzero(keep))
        if len(idx) > 1:
            dup = pd.DataFrame({k: v[idx] for k, v in cols.items() if v.ndim == 1}).duplicated().to_numpy()
            if dup.any():
                i = int(idx[np.flatnonzero(dup)[0]])
                self.drops.add(self.what, vd.DUPLICATE, int(dup.sum()), vd.example(self._name(cols, i), ts[i], dur[i]))
                keep[idx[dup]] = False
        if not keep.all():
            new_index = np.cumsum(keep) - 1
            for attr in ("collective_args",):
                if hasattr(self, attr):
                    setattr(self, attr, {int(new_index[k]): v for k, v in getattr(self, attr).items() if keep[k]})
            cols = {k: v[keep] for k, v in cols.items()}
        self.chunks = [cols] if len(cols["ts"]) else []
        self.n = len(cols["ts"])

    def _name(self, cols: dict[str, np.ndarray], i: int) -> str:
        table = list(self.names.table)
        code = int(cols["name"][i])
        return str(table[code]) if 0 <= code < len(table) else "?"

    def extract(self, events: list[ks.Event], args: list[Any], offset: int) -> dict[str, np.ndarray]:
        return {}

    def merge(self, other: FrameBuilder) -> None:
        """Append another builder's rows (built from later events): re-code its interned columns."""
        for attr, col in self.TABLES.items():
            remap = getattr(self, attr).codes(list(getattr(other, attr).table))
            for chunk in other.chunks:
                chunk[col] = remap[chunk[col]] if len(remap) else chunk[col]
        for attr in ("collective_args",):
            if hasattr(self, attr):
                getattr(self, attr).update({k + self.n: v for k, v in getattr(other, attr).items()})
        self.chunks.extend(other.chunks)
        self.n += other.n
        self.drops.merge(other.drops)

    def min_ts(self) -> float:
        return min((float(c["ts"].min()) for c in self.chunks), default=float("inf"))

    def _columns(self) -> dict[str, np.ndarray]:
        if not self.chunks:
            return {}
        keys = self.chunks[0].keys()
        return {k: np.concatenate([c[k] for c in self.chunks]) for k in keys}

    def frame(self, origin: float) -> pd.DataFrame:
        cols = self._columns()
        if not cols:
            return self.empty()
        ts = cols["ts"] - origin
        out: dict[str, Any] = {"name": self.names.categorical(cols.pop("name")), "ts": ts, "dur": cols["dur"]}
        out["end"] = ts + cols.pop("dur")
        cols.pop("ts")
        out.update(self.finish(cols, out))
        return pd.DataFrame(out)

    def finish(self, cols: dict[str, np.ndarray], out: dict[str, Any]) -> dict[str, Any]:
        return cols

    def empty(self) -> pd.DataFrame:
        sample = self.empty_columns()
        df = pd.DataFrame({"name": pd.Categorical([]), "ts": np.zeros(0), "dur": np.zeros(0), "end": np.zeros(0)})
        for k, dtype in sample.items():
            df[k] = pd.Categorical([]) if dtype == "category" else np.zeros(0, dtype=dtype)
        return df

    def empty_columns(self) -> dict[str, Any]:
        return {}


class CpuOps(FrameBuilder):
    what = "cpu_op"
    args_type = ks.CpuOpArgs
    TABLES = {"names": "name", "dims": "input_dims", "types": "input_types", "concrete": "concrete_inputs"}

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.dims = NameTable()
        self.types = NameTable()
        self.concrete = NameTable()
        self.collective_args: dict[int, ks.CpuOpArgs] = {}

    def extract(self, events, args, offset):
        for i, a in enumerate(args):
            if a.collective is not None:
                self.collective_args[offset + i] = a
        return {
            "pid": ids_of(events, "pid"),
            "tid": ids_of(events, "tid"),
            "ext_id": ints_of(args, "ext_id"),
            "seq": ints_of(args, "seq_nr"),
            "rf_id": ints_of(args, "rf_id"),
            "fwd_tid": ints_of(args, "fwd_tid"),
            "input_dims": self.dims.codes(list(map(bytes, map(_DIMS, args)))),
            "input_types": self.types.codes(list(map(bytes, map(_TYPES, args)))),
            "concrete_inputs": self.concrete.codes(list(map(bytes, map(_CONCRETE, args)))),
        }

    def finish(self, cols, out):
        cols["input_dims"] = self.dims.categorical(cols["input_dims"], decode=True)
        cols["input_types"] = self.types.categorical(cols["input_types"], decode=True)
        cols["concrete_inputs"] = self.concrete.categorical(cols["concrete_inputs"], decode=True)
        cols["parent"], cols["depth"] = call_tree(cols["tid"], out["ts"], out["end"])
        return cols

    def empty_columns(self):
        return {"pid": np.int64, "tid": np.int64, "ext_id": np.int64, "seq": np.int64, "rf_id": np.int64,
                "fwd_tid": np.int64, "input_dims": "category", "input_types": "category", "concrete_inputs": "category", "parent": np.int64,
                "depth": np.int32}  # fmt: skip


class PythonFunctions(FrameBuilder):
    what = "python_function"
    args_type = ks.PythonArgs

    def extract(self, events, args, offset):
        return {
            "tid": ids_of(events, "tid"),
            "py_id": ints_of(args, "py_id"),
            "parent_id": ints_of(args, "parent_id"),
        }

    def empty_columns(self):
        return {"tid": np.int64, "py_id": np.int64, "parent_id": np.int64}


class Annotations(FrameBuilder):
    what = "user_annotation"
    args_type = ks.AnnotationArgs

    def __init__(self, path: str) -> None:
        super().__init__(path)
        # row -> element type of a gloo collective's span (``gloo:all_reduce`` records the
        # tensor's scalar type, e.g. "float"; its size is on the c10d op that issued it)
        self.collective_args: dict[int, str] = {}

    def extract(self, events, args, offset):
        for i, e in enumerate(events):
            if e.name.startswith(GLOO_SPAN) and args:
                t = _first_type(args[i].input_types)
                if t:
                    self.collective_args[offset + i] = t
        return {"tid": ids_of(events, "tid"), "ext_id": ints_of(args, "ext_id")}

    def finish(self, cols, out):
        names: pd.Categorical = out["name"]
        kinds = [annotation_kind(str(c)) for c in names.categories]
        codes = names.codes
        cols["kind"] = pd.Categorical(np.array([k for k, _ in kinds], dtype=object)[codes])
        cols["step"] = np.array([s for _, s in kinds], dtype=np.int64)[codes]
        return cols

    def empty_columns(self):
        return {"tid": np.int64, "ext_id": np.int64, "kind": "category", "step": np.int64}


class GpuAnnotations(Annotations):
    what = "gpu_user_annotation"

    def extract(self, events, args, offset):
        cols = super().extract(events, args, offset)
        cols["device"] = ids_of(events, "pid")
        return cols

    def empty_columns(self):
        return {**super().empty_columns(), "device": np.int64}


class Kernels(FrameBuilder):
    what = "kernel"
    args_type = ks.KernelArgs

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.collective_args: dict[int, ks.KernelArgs] = {}

    def extract(self, events, args, offset):
        for i, a in enumerate(args):
            if a.collective is not None:
                self.collective_args[offset + i] = a
        grid = dim3([a.grid for a in args])
        block = dim3([a.block for a in args])
        return {
            "device": ids([a.device if a.device >= 0 else e.pid for a, e in zip(args, events)]),
            "stream": streams_of(args, events),
            "correlation": ints_of(args, "correlation"),
            "ext_id": ext_ids_of(args),
            "grid_x": grid[:, 0],
            "grid_y": grid[:, 1],
            "grid_z": grid[:, 2],
            "block_x": block[:, 0],
            "block_y": block[:, 1],
            "block_z": block[:, 2],
            "registers": ints_of(args, "registers"),
            "shared_mem": ints_of(args, "shared_mem"),
            "blocks_per_sm": floats_of(args, "blocks_per_sm"),
            "warps_per_sm": floats_of(args, "warps_per_sm"),
            "occupancy": floats_of(args, "occupancy"),
        }

    def empty_columns(self):
        cols = {k: np.int64 for k in ("device", "stream", "correlation", "ext_id", "grid_x", "grid_y", "grid_z",
                                      "block_x", "block_y", "block_z", "registers", "shared_mem")}  # fmt: skip
        cols.update({"blocks_per_sm": np.float64, "warps_per_sm": np.float64, "occupancy": np.float64})
        return cols


class Runtime(FrameBuilder):
    what = "cuda_runtime"
    args_type = ks.RuntimeArgs

    def extract(self, events, args, offset):
        return {
            "tid": ids_of(events, "tid"),
            "correlation": ints_of(args, "correlation"),
            "ext_id": ext_ids_of(args),
            "cbid": ints_of(args, "cbid"),
            "driver": np.full(len(events), "driver" in events[0].cat.lower()),  # one category per chunk bucket
        }

    def finish(self, cols, out):
        names: pd.Categorical = out["name"]
        kinds = np.array([runtime_kind(str(c)) for c in names.categories], dtype=object)
        cols["kind"] = pd.Categorical(kinds[names.codes])
        cols["api"] = pd.Categorical(np.where(cols.pop("driver"), "driver", "runtime"))
        return cols

    def empty_columns(self):
        return {"tid": np.int64, "correlation": np.int64, "ext_id": np.int64, "cbid": np.int64, "kind": "category",
                "api": "category"}  # fmt: skip


class Memcpy(FrameBuilder):
    """gpu_memcpy and gpu_memset together (``op`` tells them apart)."""

    what = "gpu_memcpy"
    args_type = ks.MemcpyArgs
    TABLES = {"names": "name", "labels": "label"}

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.labels = NameTable()  # (op, kind, src, dst) tuples

    def add_op(self, events, op: str) -> None:
        self._op = op
        self.add(events)

    def extract(self, events, args, offset):
        op = self._op
        labels = []
        for e, a in zip(events, args):
            kind, src, dst = memcpy_parts(e.name)
            if not kind and a.kind:
                kind = a.kind
            labels.append((op, kind or ("Memset" if op == "memset" else "unknown"), src, dst))
        return {
            "label": self.labels.codes(labels),
            "device": ids([a.device if a.device >= 0 else e.pid for a, e in zip(args, events)]),
            "stream": streams_of(args, events),
            "correlation": ints_of(args, "correlation"),
            "ext_id": ext_ids_of(args),
            "bytes": ints_of(args, "bytes"),
            "bandwidth_gbps": floats_of(args, "bandwidth"),
        }

    def finish(self, cols, out):
        labels = list(self.labels.table)
        codes = cols.pop("label")
        for j, col in enumerate(("op", "kind", "src", "dst")):
            cols[col] = pd.Categorical(np.array([lab[j] for lab in labels], dtype=object)[codes])
        nbytes, dur = cols["bytes"], out["dur"]
        with np.errstate(divide="ignore", invalid="ignore"):
            derived = np.where((nbytes >= 0) & (dur > 0), nbytes / (dur * 1e3), np.nan)
        bw = cols["bandwidth_gbps"]
        cols["bandwidth_gbps"] = np.where(bw >= 0, bw, derived)
        return {k: cols[k] for k in ("op", "device", "stream", "correlation", "ext_id", "kind", "src", "dst",
                                     "bytes", "bandwidth_gbps")}  # fmt: skip

    def empty_columns(self):
        return {"op": "category", "device": np.int64, "stream": np.int64, "correlation": np.int64,
                "ext_id": np.int64, "kind": "category", "src": "category", "dst": "category", "bytes": np.int64,
                "bandwidth_gbps": np.float64}  # fmt: skip


class Syncs(FrameBuilder):
    what = "cuda_sync"
    args_type = ks.SyncArgs
    TABLES = {"names": "name", "kinds": "sync_kind"}

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.kinds = NameTable()

    def extract(self, events, args, offset):
        return {
            "device": ints_of(args, "device"),
            "stream": streams_of(args, events),
            "correlation": ints_of(args, "correlation"),
            "ext_id": ints_of(args, "ext_id"),
            "sync_kind": self.kinds.codes([a.sync_kind or "" for a in args]),
            "wait_on_stream": ints_of(args, "wait_on_stream"),
            "wait_event_corr": ints_of(args, "wait_event_corr"),
        }

    def finish(self, cols, out):
        cols["sync_kind"] = self.kinds.categorical(cols["sync_kind"])
        return cols

    def empty_columns(self):
        return {"device": np.int64, "stream": np.int64, "correlation": np.int64, "ext_id": np.int64,
                "sync_kind": "category", "wait_on_stream": np.int64, "wait_event_corr": np.int64}  # fmt: skip


class Memory(FrameBuilder):
    """[memory] instant events (profile_memory=True): allocations (+bytes) and frees (-bytes)."""

    what = "cpu_instant_event"
    args_type = ks.MemoryArgs

    def add(self, events):
        if events:
            args = decode_args(events, self.args_type, self.path, self.what)
            keep = [i for i, a in enumerate(args) if a.bytes is not None]
            if keep:
                self._add([events[i] for i in keep], [args[i] for i in keep])

    def extract(self, events, args, offset):
        return {
            "bytes": ints_of(args, "bytes"),
            "total_allocated": ints_of(args, "total_allocated"),
            "total_reserved": ints_of(args, "total_reserved"),
            "addr": ints_of(args, "addr"),
            "device_type": ints_of(args, "device_type"),
            "device_id": ints_of(args, "device_id"),
        }

    def empty_columns(self):
        return {k: np.int64 for k in ("bytes", "total_allocated", "total_reserved", "addr", "device_type",
                                      "device_id")}  # fmt: skip


class Flows:
    """Finish halves of flow events (ac2g): their id is the correlation and their ts the device
    activity's start. Only used to link activities whose args carry no correlation."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ids: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.drops = vd.Drops()

    def merge(self, other: Flows) -> None:
        self.ids.extend(other.ids)
        self.ts.extend(other.ts)
        self.drops.merge(other.drops)

    def add(self, events: list[ks.Event]) -> None:
        fin = [e for e in events if e.ph == "f"]
        if fin:
            try:
                self.ids.append(ids([e.id if e.id is not None else -1 for e in fin]))
            except OverflowError:
                raise BadTraceError("a flow event has an id outside the 64-bit integer range", self.path) from None
            self.ts.append(floats([e.ts for e in fin]))

    def finalize(self, window: tuple[float, float] | None) -> None:
        """Flow halves with a missing, non-finite or implausible time link nothing: dropped."""
        if not self.ids:
            return
        i, t = np.concatenate(self.ids), np.concatenate(self.ts)
        bad = ~np.isfinite(t) | vd.outside(t, np.zeros(len(t)), window)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            self.drops.add("flow", vd.OUTSIDE if np.isfinite(t[k]) else vd.NON_FINITE, int(bad.sum()),
                           vd.example(f"flow {int(i[k])}", t[k]))  # fmt: skip
        self.ids, self.ts = [i[~bad]], [t[~bad]]

    def frame(self, origin: float) -> pd.DataFrame:
        if not self.ids:
            return pd.DataFrame({"id": np.zeros(0, np.int64), "ts": np.zeros(0)})
        return pd.DataFrame({"id": np.concatenate(self.ids), "ts": np.concatenate(self.ts) - origin})
