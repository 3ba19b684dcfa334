"""Read one Kineto (PyTorch profiler) trace file into a RankTrace.

Decoding: one msgspec pass splits ``traceEvents`` into raw slices; events are then decoded a
chunk at a time into ``Event`` structs (args left raw), partitioned by category, and each
category's args decoded in one call into a category struct. Builders turn each chunk into
numpy columns, so neither a dict per event nor all event structs at once ever exist.
Times become float64 µs relative to the file's earliest event; the loader then puts every
rank on the bundle's common origin.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import threading
import zlib
from collections import defaultdict
from operator import attrgetter, itemgetter

import msgspec
import numpy as np
import pandas as pd

from ...core.errors import BadTraceError, as_rank
from ...core.workers import core_free
from . import frames as kf
from . import joins as kj
from . import schema as ks
from ...core import limits
from .. import validate as vd
from ..bundle import RankTrace, TraceMeta
from ..names import is_profiler_scope

try:
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal has wheels for the common platforms
    _zlib = zlib

CHUNK = 16384
SPLIT_MIN_EVENTS = 50_000

# Kineto categories, lower-cased (2021 traces capitalise them: "Kernel", "Runtime", ...; their
# flows are "async" launch pairs). docs/trace_bundle.md "Kineto schema eras" lists what differs.
ROUTES = {
    "cpu_op": "cpu_ops", "operator": "cpu_ops",
    "python_function": "python", "python": "python",
    "user_annotation": "annotations",
    "gpu_user_annotation": "gpu_annotations",
    "kernel": "kernels",
    "cuda_runtime": "runtime", "runtime": "runtime", "cuda_driver": "runtime", "driver": "runtime",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_sync": "syncs",
    "cpu_instant_event": "memory",
    "ac2g": "flows", "async_cpu_to_gpu": "flows", "async": "flows",
    "fwdbwd": "flows", "forward_backward": "flows",
}  # fmt: skip
TIMED = ("cpu_ops", "python", "annotations", "gpu_annotations", "kernels", "runtime", "memcpy", "syncs")


def read_bytes(path: str) -> bytes:
    """The file's JSON bytes, gunzipped when it is gzip (by magic number, not by name). Only a
    regular file is read, and only up to the limits of ``limits`` (a gzip file is refused while
    it expands past its bound, before the memory is spent)."""
    raw = limits.read_limited(path)
    if not raw:
        raise BadTraceError("empty file", path)
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(raw, path, limits.gzip_limit(len(raw)))
        if len(raw) < 64 and not raw.strip():
            raise BadTraceError("empty file (after gunzip)", path)
    return _utf8(raw, path)


def _utf8(raw: bytes, path: str) -> bytes:
    """JSON is UTF-8: a UTF-8 byte-order mark (some editors write one) is dropped; UTF-16 or
    UTF-32 text is refused naming its encoding."""
    if raw[:3] == b"\xef\xbb\xbf":
        return raw[3:]
    h = raw[:4] + b"\x01" * (4 - len(raw[:4]))  # a JSON text starts with an ASCII character
    if h in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff") or (h[0] and h[1:] == b"\x00\x00\x00") or \
            (h[:3] == b"\x00\x00\x00" and h[3]):
        raise BadTraceError("UTF-32 text: profiler traces are UTF-8 JSON (iconv -f UTF-32 -t UTF-8 converts it)", path)
    if h[:2] in (b"\xff\xfe", b"\xfe\xff") or (h[0] and not h[1]) or (not h[0] and h[1]):
        raise BadTraceError("UTF-16 text: profiler traces are UTF-8 JSON (iconv -f UTF-16 -t UTF-8 converts it)", path)
    return raw


def _gunzip(data: bytes, path: str, limit: int | None = None) -> bytes:
    """Every gzip member of ``data``, decompressed in one C-level pass each (ISA-L when
    installed: ~2.4x faster than zlib on a 54 MB trace), with the CRC checked, and never more
    than ``limit`` bytes of output: decompression stops there and the file is refused."""
    limit = limits.max_bytes() if limit is None else limit
    parts: list[bytes] = []
    total = 0
    rest = data
    try:
        while True:
            d = _zlib.decompressobj(wbits=31)
            out = d.decompress(rest, limit - total + 1)
            total += len(out)
            if total > limit:
                raise BadTraceError(
                    f"gzip data expands to more than {limits.human(limit)} ({len(data) / limits.MiB:,.1f} MiB "
                    "compressed): refused as a likely gzip bomb (set HERMES_MAX_GZIP_RATIO or HERMES_MAX_TRACE_BYTES "
                    "to read it)", path)  # fmt: skip
            parts.append(out)
            if not d.eof:
                raise BadTraceError("truncated gzip data", path)
            rest = d.unused_data
            if not rest.strip(b"\x00"):  # trailing zero padding is allowed, as gzip.decompress does
                break
            if rest[:2] != b"\x1f\x8b":
                raise BadTraceError("corrupt gzip data (trailing garbage after the compressed stream)", path)
    except (EOFError, zlib.error, _zlib.error, OSError) as exc:
        reason = "truncated gzip data" if isinstance(exc, EOFError) else f"corrupt gzip data ({exc})"
        raise BadTraceError(reason, path) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _decode_error(exc: Exception, path: str, where: str = "") -> BadTraceError:
    """Decoder failures as one line: invalid UTF-8 (a UnicodeDecodeError, or msgspec's DecodeError
    saying so from 0.23 on), nesting too deep, else invalid JSON."""
    if isinstance(exc, msgspec.DecodeError):
        msg = str(exc)
        if "utf-8" in msg.lower():
            return BadTraceError(f"invalid UTF-8 text{where}", path)
        return BadTraceError(f"invalid JSON{where}: {msg}", path)
    if isinstance(exc, RecursionError):
        return BadTraceError(f"JSON nested too deeply{where} (more levels than any profiler writes)", path)
    if isinstance(exc, UnicodeDecodeError):
        return BadTraceError(f"invalid UTF-8 text{where} (byte {exc.object[exc.start:exc.start + 1]!r})", path)
    return BadTraceError(f"unreadable JSON{where}: {exc}", path)


def decode_head(raw: bytes, path: str) -> ks.KinetoFile:
    cap = limits.max_events()
    if raw.count(b"{") > 2 * cap:  # objects bound the events from above: refuse before any is decoded
        raise BadTraceError(f"holds more than {cap:,} events, the limit (set HERMES_MAX_EVENTS to read it)", path)
    try:
        doc = ks.file_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.startswith("Expected `object`, got `array`"):  # Chrome's array form: a bare event list
            try:
                doc = ks.KinetoFile(traceEvents=msgspec.json.decode(raw, type=list[msgspec.Raw]))
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc2:
                raise _decode_error(exc2, path) from None
        elif "traceEvents" in msg or msg.startswith("Expected `object`"):
            raise BadTraceError("JSON is not a profiler trace (no 'traceEvents' list of events)", path) from None
        else:
            raise BadTraceError(f"ill-typed trace metadata: {msg}", path) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise _decode_error(exc, path) from None
    if len(doc.traceEvents) > cap:
        raise BadTraceError(f"holds {len(doc.traceEvents):,} events, more than the limit of {cap:,} "
                            "(set HERMES_MAX_EVENTS to read it)", path)  # fmt: skip
    limits.check_memory(len(doc.traceEvents), path)
    return doc


_event_list = msgspec.json.Decoder(list[ks.Event])


def _decode_chunk(raws: list[msgspec.Raw], start: int, path: str) -> list[ks.Event]:
    try:
        return _event_list.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError as exc:
        msg, _, where = str(exc).partition(" - at `$[")
        idx, _, field = where.rstrip("`").partition("]")
        at = f"event #{start + int(idx)}{field.replace('.', ' field ', 1)}" if idx.isdigit() else "an event"
        raise BadTraceError(f"ill-typed {at}: {msg}", path) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise _decode_error(exc, path, f" in events #{start}-#{start + len(raws) - 1}") from None


class _Builders:
    def __init__(self, path: str) -> None:
        self.cpu_ops = kf.CpuOps(path)
        self.python = kf.PythonFunctions(path)
        self.annotations = kf.Annotations(path)
        self.gpu_annotations = kf.GpuAnnotations(path)
        self.kernels = kf.Kernels(path)
        self.runtime = kf.Runtime(path)
        self.memcpy = kf.Memcpy(path)
        self.syncs = kf.Syncs(path)
        self.memory = kf.Memory(path)
        self.flows = kf.Flows(path)
        self.meta_events: list[ks.Event] = []
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, events: list[ks.Event]) -> None:
        for cat, evs in _by_category(events):
            if not cat:
                self._add_uncategorised(evs)
                continue
            self.counts[cat] += len(evs)
            route = ROUTES.get(cat.lower())
            if route is None:
                continue
            if route in ("memcpy", "memset"):
                self.memcpy.add_op([e for e in evs if e.ph == "X"], route)
            elif route == "flows":
                self.flows.add(evs)
            elif route == "memory":
                self.memory.add(evs)
            elif route == "cpu_ops":
                # PyTorch 1.8-1.9 ("Operator"): no user_annotation category yet, the step, DataLoader
                # and optimizer scopes are ops; and a later trace's "ProfilerStep#N" is a cpu_op when
                # it was opened with torch._C._profiler._RecordFunctionFast (RecordScope::FUNCTION),
                # as hermes' monitor does for its captures (monitor/capture.py). Left there, a
                # ProfilerStep at depth 0 holds every op: the step is not found, and the step span
                # is the top-level "operator" of every host analysis and of the critical path
                ops, scopes = _split_scopes([e for e in evs if e.ph == "X"])
                self.cpu_ops.add(ops)
                self.annotations.add(scopes)
            else:
                getattr(self, route).add([e for e in evs if e.ph == "X"])

    def _add_uncategorised(self, evs: list[ks.Event]) -> None:
        meta = [e for e in evs if e.ph == "M"]
        self.meta_events.extend(meta)
        self.counts["metadata"] += len(meta)
        if len(evs) > len(meta):
            self.counts["other"] += len(evs) - len(meta)
            # PyTorch 1.8-1.9 write the [memory] instants without a category (later cpu_instant_event)
            self.memory.add([e for e in evs if e.ph == "i" and e.name == "[memory]"])

    def merge(self, other: _Builders) -> None:
        for name in ("cpu_ops", "python", "annotations", "gpu_annotations", "kernels", "runtime", "memcpy", "syncs",
                     "memory", "flows"):  # fmt: skip
            getattr(self, name).merge(getattr(other, name))
        self.meta_events.extend(other.meta_events)
        for k, v in other.counts.items():
            self.counts[k] += v


_CAT = attrgetter("cat")
_NAME = attrgetter("name")


def _by_category(events: list[ks.Event]) -> list[tuple[str, list[ks.Event]]]:
    codes, cats = pd.factorize(np.fromiter(map(_CAT, events), dtype=object, count=len(events)))
    if len(cats) == 1:
        return [(cats[0], events)]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(cats) + 1))
    out = []
    for c, cat in enumerate(cats):
        idx = order[bounds[c] : bounds[c + 1]].tolist()
        out.append((cat, list(itemgetter(*idx)(events)) if len(idx) > 1 else [events[idx[0]]]))
    return out


def _split_scopes(events: list[ks.Event]) -> tuple[list[ks.Event], list[ks.Event]]:
    """(ops, record_function scopes) of a chunk of Operator events, classified per distinct name."""
    scopes = {n for n in set(map(_NAME, events)) if is_profiler_scope(n)}
    if not scopes:
        return events, []
    ops: list[ks.Event] = []
    found: list[ks.Event] = []
    for e in events:
        (found if e.name in scopes else ops).append(e)
    return ops, found


def _build(raws: list[msgspec.Raw], lo: int, hi: int, path: str) -> _Builders:
    b = _Builders(path)
    for start in range(lo, hi, CHUNK):
        b.add(_decode_chunk(raws[start : min(start + CHUNK, hi)], start, path))
    return b


def _can_split(n_events: int) -> bool:
    if n_events < SPLIT_MIN_EVENTS or not hasattr(os, "fork"):
        return False
    if threading.active_count() > 1 or mp.current_process().name != "MainProcess":
        return False  # forking a threaded process, or from inside a pool worker, is not safe
    return core_free()


def _build_split(raws: list[msgspec.Raw], path: str) -> _Builders:
    """Build the second half of the events in a forked child (it shares the decoded bytes
    copy-on-write) while this process builds the first half, then merge."""
    mid = (len(raws) // 2 // CHUNK) * CHUNK or len(raws) // 2
    rfd, wfd = os.pipe()
    # the child's collections would otherwise walk every object this process holds (garbage an
    # earlier analysis left included): 0.43 s against 0.36 s for the load right after an advise
    pid = -1
    gc.freeze()
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            gc.unfreeze()
    if pid == 0:  # child: build, send the builders back, exit without running any cleanup
        os.close(rfd)
        try:
            try:
                payload = ("ok", _build(raws, mid, len(raws), path))
            except BaseException as exc:  # noqa: BLE001  (sent to the parent, re-raised there)
                payload = ("err", exc if isinstance(exc, BadTraceError) else BadTraceError(str(exc), path))
            with os.fdopen(wfd, "wb") as fh:
                pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)
    os.close(wfd)
    try:
        first = _build(raws, 0, mid, path)
    finally:
        with os.fdopen(rfd, "rb") as fh:
            data = fh.read()
        os.waitpid(pid, 0)
    try:
        status, second = pickle.loads(data)
    except Exception:  # the child died: do its half here
        status, second = "ok", _build(raws, mid, len(raws), path)
    if status != "ok":
        raise second
    first.merge(second)
    return first


def parse_kineto(path: str, raw: bytes | None = None, split: bool = True) -> tuple[RankTrace, float]:
    """Parse one Kineto file. Returns the RankTrace (times relative to its first event) and the
    absolute time (µs, the trace clock with baseTimeNanoseconds applied) of that first event.
    Large files are built by two processes when cores are free (``split``)."""
    if raw is None:
        raw = read_bytes(path)
    doc = decode_head(raw, path)
    raws = doc.traceEvents
    b = _build_split(raws, path) if split and _can_split(len(raws)) else _build(raws, 0, len(raws), path)
    doc.traceEvents = []
    del raws, raw

    drops = _validate(b)
    first = min(getattr(b, k).min_ts() for k in TIMED)
    if first == float("inf"):
        if drops.total:
            raise BadTraceError(f"no profiler event with a plausible time: {drops.message()}", path)
        raise BadTraceError("no profiler events (no cpu_op, kernel, runtime or annotation events)", path)

    cpu_ops = b.cpu_ops.frame(first)
    kernels = b.kernels.frame(first)
    runtime = b.runtime.frame(first)
    memcpy = b.memcpy.frame(first)
    syncs = b.syncs.frame(first)
    annotations = b.annotations.frame(first)
    links = kj.links(runtime, {"kernel": kernels, "memcpy": memcpy, "sync": syncs}, b.flows.frame(first))
    _fill_ext_ids(links, {"kernel": kernels, "memcpy": memcpy, "sync": syncs})
    steps, warnings = kj.steps(annotations)
    if drops.total:
        warnings.insert(0, drops.message())
    if len(kernels) >= MIN_KERNELS_LINKED and (len(cpu_ops) or len(annotations)):
        linked = int(links.loc[links["gpu_kind"].astype(str).to_numpy() == "kernel", "gpu_idx"].nunique()) if len(links) else 0
        if linked < LINKED_SHARE * len(kernels):
            what = "no runtime events" if not len(runtime) else "correlations that match no runtime call"
            warnings.append(f"{linked:,} of {len(kernels):,} {UNLINKED_KERNELS} ({what}): "
                            "launch, dispatch and host-gap causes cannot be read from it")  # fmt: skip
    if not (len(cpu_ops) or len(runtime) or len(annotations)) and (len(kernels) or len(memcpy)):
        warnings.append(f"{DEVICE_ONLY}: no cpu_op, runtime or annotation events, so no step marks and no host "
                        "side; the whole capture is one window, and launch, dispatch, data and Python causes cannot be "
                        "seen (profile with ProfilerActivity.CPU as well)")  # fmt: skip
    meta = _meta(doc, b.meta_events, path)
    trace = RankTrace(
        meta=meta,
        cpu_ops=cpu_ops,
        python=b.python.frame(first),
        annotations=annotations,
        gpu_annotations=b.gpu_annotations.frame(first),
        kernels=kernels,
        runtime=runtime,
        memcpy=memcpy,
        syncs=syncs,
        collectives=kj.collectives(cpu_ops, b.cpu_ops.collective_args, kernels, b.kernels.collective_args, annotations,
                                    b.annotations.collective_args, meta),
        links=links,
        memory=b.memory.frame(first),
        steps=steps,
        counts=dict(sorted(b.counts.items())),
        warnings=warnings,
    )
    absolute_first = first + (meta.base_time_ns / 1000.0 if meta.base_time_ns else 0.0)
    return trace, absolute_first


# a trace whose kernels mostly have no launch call lost its runtime events (or its correlations):
# the real traces link 69-100% of theirs (a capture cut mid-step leaves some unlinked)
MIN_KERNELS_LINKED = 20
# the words of the two warnings the report's headline qualifies its answer with (advisor/qualify.py)
UNLINKED_KERNELS = "kernels have a launch call in the trace"
DEVICE_ONLY = "device activity only"
LINKED_SHARE = 0.5


def _validate(b: _Builders) -> vd.Drops:
    """The physical checks of validate.py over the whole file: events outside its plausible
    time span and exact duplicates dropped (non-finite times and negative durations were dropped
    while building). Returns every drop, for the warning."""
    starts = [c["ts"] for k in (*TIMED, "memory") for c in getattr(b, k).chunks]
    window = vd.plausible_window(np.concatenate(starts)) if starts else None
    drops = vd.Drops()
    for k in (*TIMED, "memory", "flows"):
        builder = getattr(b, k)
        builder.finalize(window)
        drops.merge(builder.drops)
    return drops


def _fill_ext_ids(links, gpu) -> None:
    """ROCm (and some CUDA) device activities carry no External id: take the launch's."""
    for kind, df in gpu.items():
        ext = df["ext_id"].to_numpy()
        miss = np.flatnonzero(ext < 0)
        if not len(miss):
            continue
        lk = links[(links["gpu_kind"] == kind) & (links["runtime_ext_id"] >= 0)]
        fill = np.full(len(df), -1, dtype=np.int64)
        fill[lk["gpu_idx"].to_numpy()] = lk["runtime_ext_id"].to_numpy()
        ext = ext.copy()
        ext[miss] = fill[miss]
        df["ext_id"] = ext


def _meta_names(events: list[ks.Event]) -> tuple[dict[str, str], dict[str, str]]:
    procs: dict[str, str] = {}
    threads: dict[str, str] = {}
    if not events:
        return procs, threads
    try:
        args = msgspec.json.decode(b"[" + b",".join([e.args for e in events]) + b"]", type=list[ks.MetaArgs])
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return procs, threads  # names are cosmetic: never fail a load on them
    for e, a in zip(events, args):
        if e.name == "process_name" and a.name:
            procs.setdefault(str(e.pid), a.name)
        elif e.name == "process_labels" and a.labels:
            procs[str(e.pid)] = f"{procs.get(str(e.pid), '')} [{a.labels}]".strip()
        elif e.name == "thread_name" and a.name:
            threads[f"{e.pid}/{e.tid}"] = a.name
    return procs, threads


def _json_or(raw: msgspec.Raw, default):
    try:
        val = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return default
    return default if val is None else val


def _text(raw: msgspec.Raw) -> str | None:
    val = _json_or(raw, None)
    if val is None or isinstance(val, (dict, list)):
        return None
    return str(val)


def _meta(doc: ks.KinetoFile, meta_events: list[ks.Event], path: str) -> TraceMeta:
    dist = _json_or(doc.distributedInfo, None)
    if not isinstance(dist, dict):
        dist = None
    devs = _json_or(doc.deviceProperties, [])
    if isinstance(devs, dict):
        devs = [devs]
    devs = [d for d in devs if isinstance(d, dict)] if isinstance(devs, list) else []
    base_ns = None
    base_text = _text(doc.baseTimeNanoseconds)
    if base_text is not None:
        try:
            base_ns = int(float(base_text)) if not base_text.isdigit() else int(base_text)
        except ValueError:
            base_ns = None
    versions = {
        k: v
        for k in ("cupti_version", "cuda_runtime_version", "cuda_driver_version", "hip_runtime_version",
                  "hip_driver_version", "roctracer_version")  # fmt: skip
        if (v := _text(getattr(doc, k))) is not None
    }
    flags = {
        k: v for k in ("record_shapes", "profile_memory", "with_stack", "with_flops") if (v := _text(getattr(doc, k)))
    }
    procs, threads = _meta_names(meta_events)
    world = as_rank(dist.get("world_size")) if dist else None
    return TraceMeta(
        source=os.path.abspath(path),
        rank=-1,
        rank_source="",
        world_size=world or None,
        schema_version=_text(doc.schemaVersion),
        trace_name=_text(doc.traceName),
        display_time_unit=_text(doc.displayTimeUnit),
        base_time_ns=base_ns,
        device_properties=devs,
        distributed_info=dist,
        versions=versions,
        flags=flags,
        process_names=procs,
        thread_names=threads,
    )


def distributed_rank(trace: RankTrace) -> int | None:
    dist = trace.meta.distributed_info or {}
    return as_rank(dist.get("rank"))
