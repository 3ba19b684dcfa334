"""A rank's what-if replay state kept on disk until the combined gain asks for it, without pickle.

The state (replay.ReplayState: the rank's SimModel, its sets' per-node amounts, the sets that
drop waits) is written as numpy arrays in one ``.npz`` per rank and read back with
``allow_pickle=False``: a file in the temporary directory can hold numbers only, never code
(nothing in hermes unpickles from disk; tests/test_reliability.py). Lists come back as lists of
Python ints and floats, arrays with their dtype, so a replay of the read state equals one of the
original bit for bit.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..analyzers.whatif.job_forms import TABLE_COLUMNS, JobAnchors, JobPart
from .replay import ReplayState, SimModel

_AMOUNT = "amount:"
_FIELD = "field:"
_JOB = "job:"
_TABLE = "job_table:"


def pack(state: Any) -> bytes:
    """The state as the bytes of an uncompressed ``.npz``."""
    model = state.model
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Any] = {}
    for f in dataclasses.fields(model):
        v = getattr(model, f.name)
        if f.name == "anchors":
            arrays["anchors_node"] = np.array([a for a, _ in v], dtype=np.int64)
            arrays["anchors_off"] = np.array([b for _, b in v], dtype=np.float64)
        elif isinstance(v, np.ndarray):
            arrays[_FIELD + f.name] = v
        elif isinstance(v, list):
            kind = np.int64 if all(isinstance(x, (int, np.integer)) for x in v) else np.float64
            arrays["list:" + f.name] = np.array(v, dtype=kind)
        else:
            scalars[f.name] = v
    for target, amounts in state.amounts.items():
        arrays[_AMOUNT + target] = np.asarray(amounts)
    arrays["scalars"] = np.array([[k, repr(float(v)) if isinstance(v, float) else str(int(v)),
                                   "f" if isinstance(v, float) else "i"] for k, v in scalars.items()])  # fmt: skip
    arrays["drops"] = np.array(sorted(state.drop_waits), dtype=str)
    part = getattr(state, "job", None)
    if part is not None:
        for f in dataclasses.fields(part.anchors):
            arrays[_JOB + f.name] = getattr(part.anchors, f.name)
        for c in TABLE_COLUMNS:
            col = part.table[c].to_numpy()
            arrays[_TABLE + c] = col.astype(str) if col.dtype == object else col
        arrays["job_steps"] = np.array([part.steps], dtype=np.int64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _unpack(fh) -> Any:
    with np.load(fh, allow_pickle=False) as z:
        kw: dict[str, Any] = {}
        amounts: dict[str, np.ndarray] = {}
        for key in z.files:
            if key.startswith(_FIELD):
                kw[key[len(_FIELD):]] = z[key]
            elif key.startswith("list:"):
                kw[key[len("list:"):]] = z[key].tolist()
            elif key.startswith(_AMOUNT):
                amounts[key[len(_AMOUNT):]] = z[key]
        kw["anchors"] = list(zip(z["anchors_node"].tolist(), z["anchors_off"].tolist()))
        for name, text, kind in z["scalars"].tolist():
            kw[name] = float(text) if kind == "f" else int(text)
        drops = set(z["drops"].tolist())
        part = None
        if "job_steps" in z.files:
            anchors = JobAnchors(**{f.name: z[_JOB + f.name] for f in dataclasses.fields(JobAnchors)})
            table = pd.DataFrame({c: z[_TABLE + c] for c in TABLE_COLUMNS})
            part = JobPart(anchors, table, int(z["job_steps"][0]))
    return ReplayState(SimModel(**kw), amounts, drops, job=part)


class SpilledReplay(Mapping):
    """Rank -> ReplayState, each kept in its own file of numbers and read back when asked for."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="hermes-replay-")
        self._ranks: dict[Any, str] = {}  # ("file", i) until gather knows the rank, then the rank

    def put(self, key: Any, blob: bytes) -> None:
        path = os.path.join(self.dir, f"{len(self._ranks)}.npz")
        with open(path, "wb") as fh:
            fh.write(blob)
        self._ranks[key] = path

    def rename(self, old: Any, new: int) -> None:
        if old in self._ranks:
            self._ranks[new] = self._ranks.pop(old)

    def __getitem__(self, rank: int) -> Any:
        with open(self._ranks[rank], "rb") as fh:
            return _unpack(fh)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __del__(self) -> None:
        self.close()


__all__ = ["SpilledReplay", "pack"]
