"""The device activities of a rank's analysed windows (kernels, then memcpy/memset) as numpy arrays
with their kernel class, the what-if sets made of a selection of them, and the small summaries
every compute fact takes of them (a clamped ratio, the top names by time)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..context import RankContext
from ..whatif.sets import WhatIfSet, register
from .calltree import in_windows
from .kernel_classes import CLASSES, CLS_INDEX, classify_ascend_task, classify_kernel


@dataclass
class Acts:
    """Device activities (kernels, then memcpy/memset) of the analysed windows, as numpy arrays."""

    row: np.ndarray  # row in kernels / memcpy
    name_id: np.ndarray  # index into names
    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    cls: np.ndarray  # index into CLASSES
    kernel: np.ndarray  # bool: kernel (else memcpy/memset)
    names: np.ndarray  # name table

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, m: np.ndarray) -> Acts:
        return Acts(self.row[m], self.name_id[m], self.ts[m], self.end[m], self.dur[m], self.stream[m],
                    self.device[m], self.cls[m], self.kernel[m], self.names)  # fmt: skip


def device_activities(ctx: RankContext) -> Acts:
    tr = ctx.trace
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "name_id", "ts", "end", "dur", "stream", "device",
                                                          "cls", "kernel")}  # fmt: skip
    names: list[np.ndarray] = []
    offset = 0
    for frame, is_kernel in ((tr.kernels, True), (tr.memcpy, False)):
        if not len(frame):
            continue
        cats = frame["name"].cat.categories
        table = np.array([str(c) for c in cats] + [""], dtype=object)
        m = in_windows(ctx, frame["ts"].to_numpy())
        codes = frame["name"].cat.codes.to_numpy().astype(np.int64)
        codes = np.where(codes < 0, len(cats), codes)[m]
        if is_kernel:
            full = frame["name"].cat.codes.to_numpy().astype(np.int64)
            full = np.where(full < 0, len(cats), full)
            if is_ascend(ctx, frame):
                row_cls = _ascend_classes(frame, table, full)
            else:
                ccls = np.array([CLS_INDEX[classify_kernel(n)] for n in table], dtype=np.int64)
                row_cls = ccls[full]
            # hand the class of every kernel row to later analyzers (index into CLASSES)
            ctx.shared["compute"] = {"classes": CLASSES, "kernel_class": row_cls}
            cls = row_cls[m]
        else:
            cls = np.full(len(codes), CLS_INDEX["memory"], dtype=np.int64)
        cols["row"].append(np.flatnonzero(m))
        cols["name_id"].append(codes + offset)
        for c in ("ts", "end", "dur", "stream", "device"):
            cols[c].append(frame[c].to_numpy()[m])
        cols["cls"].append(cls)
        cols["kernel"].append(np.full(len(codes), is_kernel))
        names.append(table)
        offset += len(table)
    if not names:
        e = np.zeros(0)
        ei = np.zeros(0, dtype=np.int64)
        return Acts(ei, ei, e, e, e, ei, ei, ei, np.zeros(0, dtype=bool), np.zeros(0, dtype=object))
    return Acts(*(np.concatenate(cols[k]) for k in ("row", "name_id", "ts", "end", "dur", "stream", "device",
                                                      "cls", "kernel")), np.concatenate(names))  # fmt: skip


def is_ascend(ctx: RankContext, frame: pd.DataFrame) -> bool:
    return getattr(ctx.trace.meta, "format", "") == "ascend" and "op_type" in frame.columns


def _ascend_classes(frame: pd.DataFrame, table: np.ndarray, name_codes: np.ndarray) -> np.ndarray:
    """Class per kernel row of an Ascend trace, from (operator type, task name, task type),
    classified once per distinct combination."""
    def codes_of(col: str) -> tuple[np.ndarray, np.ndarray]:
        if col not in frame.columns:
            return np.array([""], dtype=object), np.zeros(len(frame), dtype=np.int64)
        c = frame[col].astype("category")
        vals = np.array([str(v) for v in c.cat.categories] + [""], dtype=object)
        k = c.cat.codes.to_numpy().astype(np.int64)
        return vals, np.where(k < 0, len(vals) - 1, k)

    ops, op_codes = codes_of("op_type")
    tts, tt_codes = codes_of("task_type")
    key = (name_codes * len(ops) + op_codes) * len(tts) + tt_codes
    uniq, inv = np.unique(key, return_inverse=True)
    cls = np.empty(len(uniq), dtype=np.int64)
    for i, kk in enumerate(uniq):
        rest, t = divmod(int(kk), len(tts))
        n, o = divmod(rest, len(ops))
        cls[i] = CLS_INDEX[classify_ascend_task(str(ops[o]), str(table[n]), str(tts[t]))]
    return cls[inv.reshape(-1)]


def register_device(ctx: RankContext, name: str, description: str, act: Acts, launches: bool = False) -> None:
    """``launches``: the fix removes the kernels' calls too (WhatIfSet.launches)."""
    if len(act):
        register(ctx, WhatIfSet(name, description, kernels=act.row[act.kernel], memcpy=act.row[~act.kernel],
                                launches=launches))  # fmt: skip


def register_selected(ctx: RankContext, name: str, description: str, act: Acts, m: np.ndarray,
                      launches: bool = False) -> None:  # fmt: skip
    if m.any():
        sub = act.take(m)
        register(ctx, WhatIfSet(name, description, kernels=sub.row[sub.kernel], memcpy=sub.row[~sub.kernel],
                                launches=launches))  # fmt: skip


def ratio(x: float) -> float:
    if not np.isfinite(x):
        return 0.0
    return float(min(1.0, max(0.0, x)))


def top_names(name_id: np.ndarray, weights: np.ndarray, names: np.ndarray, n: int = 3) -> list[str]:
    """The n names with the largest summed weight."""
    if not len(name_id):
        return []
    tot = np.bincount(name_id, weights=weights, minlength=len(names))
    top = np.argsort(-tot, kind="stable")[:n]
    return [str(names[i])[:200] for i in top if tot[i] > 0]


def top_label(labels: np.ndarray, weights: np.ndarray) -> str:
    """The label with the largest summed weight ('' when none)."""
    if not len(labels):
        return ""
    s = pd.Series(weights).groupby(pd.Series(labels, dtype=object)).sum()
    s = s[s.index != ""]
    return str(s.idxmax()) if len(s) and s.max() > 0 else ""
