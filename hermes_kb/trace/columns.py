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
    """Parent index and depth of each interval among those on the same thread (a stack walk in
    start order, longer first at equal starts, so an enclosing op precedes what it encloses)."""
    n = len(ts)
    if n == 0:
        return np.full(0, -1, dtype=np.int64), np.zeros(0, dtype=np.int32)
    order = np.lexsort((-(end - ts), ts, tid))
    tid_l, ts_l, end_l, order_l = tid[order].tolist(), ts[order].tolist(), end[order].tolist(), order.tolist()
    par = [-1] * n
    dep = [0] * n
    stack: list[int] = []
    prev_tid = None
    for k in range(n):
        t = tid_l[k]
        if t != prev_tid:
            stack.clear()
            prev_tid = t
        start = ts_l[k]
        while stack and end_l[stack[-1]] <= start:
            stack.pop()
        if stack:
            top = order_l[stack[-1]]
            me = order_l[k]
            par[me] = top
            dep[me] = dep[top] + 1
        stack.append(k)
    return np.array(par, dtype=np.int64), np.array(dep, dtype=np.int32)
