"""Small helpers that turn lists of decoded values into typed numpy columns."""

from __future__ import annotations

import re
from operator import attrgetter

import numpy as np
import pandas as pd

_NUM_RE = re.compile(r"(\d+)")


class NameTable:
    """Interns names chunk by chunk: codes now, one categorical at the end."""

    def __init__(self) -> None:
        self.table: dict = {}

    def codes(self, values: list) -> np.ndarray:
        local, uniques = pd.factorize(np.fromiter(values, dtype=object, count=len(values)))
        t = self.table
        remap = np.fromiter((t.setdefault(u, len(t)) for u in uniques), dtype=np.int32, count=len(uniques))
        return remap[local] if len(remap) else local.astype(np.int32)

    def categorical(self, codes: np.ndarray, decode: bool = False) -> pd.Categorical:
        cats = list(self.table)
        if decode:  # raw JSON snippets kept as bytes until now
            cats = [bytes(c).decode("utf-8", "surrogateescape") for c in cats]
        return pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype=object))


def _fast(objs: list, attr: str, dtype) -> np.ndarray | None:
    """np.fromiter over an attribute (C-level iteration); None when a value is not a plain number
    (or is out of the dtype's range: the slow path decides)."""
    try:
        return np.fromiter(map(attrgetter(attr), objs), dtype=dtype, count=len(objs))
    except (TypeError, ValueError, OverflowError):
        return None


def floats_of(objs: list, attr: str, default: float = np.nan) -> np.ndarray:
    out = _fast(objs, attr, np.float64)
    if out is None:
        return floats([getattr(o, attr) for o in objs], default)
    if not np.isnan(default):  # numpy turns None into NaN (JSON itself has no NaN)
        out[np.isnan(out)] = default
    return out


def ints_of(objs: list, attr: str, default: int = -1) -> np.ndarray:
    out = _fast(objs, attr, np.int64)
    return out if out is not None else ints([getattr(o, attr) for o in objs], default)


def ids_of(objs: list, attr: str) -> np.ndarray:
    out = _fast(objs, attr, np.int64)
    return out if out is not None else ids([getattr(o, attr) for o in objs])


def floats(values: list, default: float = np.nan) -> np.ndarray:
    try:
        return np.array([default if v is None else v for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        s = pd.Series(values, dtype=object).astype(str).str.strip()
        return pd.to_numeric(s, errors="coerce").to_numpy(np.float64)


def ints(values: list, default: int = -1) -> np.ndarray:
    """Integers as int64; a value that is not an integer becomes ``default``, one outside the
    int64 range raises OverflowError (the reader reports it: an id must never wrap around)."""
    try:
        return np.array([default if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError):
        num = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        fin = num.to_numpy(np.float64, na_value=np.nan).copy()
        if (np.abs(fin[np.isfinite(fin)]) >= 2.0**63).any():
            raise OverflowError("integer outside the int64 range") from None
        fin[~np.isfinite(fin)] = default
        return fin.astype(np.int64)


def _id_of(v) -> int:
    if isinstance(v, int):
        return v
    s = str(v).strip()
    if s.lower().startswith("0x"):
        try:
            return int(s, 16)
        except ValueError:
            return -1
    m = _NUM_RE.search(s)
    return int(m.group(1)) if m else -1


def ids(values: list) -> np.ndarray:
    """pid/tid/stream values as int64; strings ("stream 7", "0x0") become their number, else -1."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_id_of(v) for v in values], dtype=np.int64)


def streams(arg_values: list, tids: list) -> np.ndarray:
    """The stream from args where given (int or "0x.." string), else from the event's tid."""
    out = ids([v if (v is not None and v != -1 and v != "") else t for v, t in zip(arg_values, tids)])
    return out


def dim3(values: list) -> np.ndarray:
    """CUDA grid/block triples as an (n, 3) int64 array; missing or malformed entries are -1."""
    try:
        arr = np.array(values, dtype=np.int64)
        if arr.shape == (len(values), 3):
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.full((len(values), 3), -1, dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, list):
            for j, x in enumerate(v[:3]):
                if isinstance(x, int):
                    out[i, j] = x
    return out


def call_tree(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent index and depth of each interval among those on the same thread: what a stack walk
    in start order (longer first at equal starts, so an enclosing op precedes what it encloses)
    gives, computed without the walk. Everything the walk has popped before reaching an interval
    ended by its start, and the stack top is the latest interval still on the stack, so the parent
    is the latest earlier interval on the thread that ends after this one starts: found for all at
    once by descending a table of running maxima of the ends (blocks of 2^l), then depths by
    pointer doubling. tests/test_reader_tiny.py checks it against the walk."""
    n = len(ts)
    if n == 0:
        return np.full(0, -1, dtype=np.int64), np.zeros(0, dtype=np.int32)
    ts = np.asarray(ts, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    order = np.lexsort((-(end - ts), ts, tid))
    e, s, t = end[order], ts[order], np.asarray(tid)[order]
    idx = np.arange(n)
    first = np.ones(n, dtype=bool)
    first[1:] = t[1:] != t[:-1]
    thread_start = np.maximum.accumulate(np.where(first, idx, 0))
    latest = [e]  # latest[l][i]: the latest end among positions i - 2^l + 1 .. i
    while (1 << len(latest)) <= n:
        prev, span = latest[-1], 1 << (len(latest) - 1)
        nxt = prev.copy()
        nxt[span:] = np.maximum(prev[span:], prev[:-span])
        latest.append(nxt)
    # from the interval before, skip back over blocks that all ended by this start, largest first,
    # never past the thread's first interval
    pos = idx - 1
    for lvl in range(len(latest) - 1, -1, -1):
        size = 1 << lvl
        cand = np.flatnonzero(pos - size + 1 >= thread_start)
        p = pos[cand]
        skip = latest[lvl][p] <= s[cand]
        pos[cand[skip]] = p[skip] - size
    has = pos >= thread_start
    has[has] = e[pos[has]] > s[has]
    par = np.full(n, -1, dtype=np.int64)
    par[order[has]] = order[pos[has]]
    up = np.append(np.where(par >= 0, par, n), n)  # n: above the root
    dep = np.append((par >= 0).astype(np.int64), 0)
    while (up[:n] != n).any():
        dep = dep + dep[up]
        up = up[up]
    return par, dep[:n].astype(np.int32)
