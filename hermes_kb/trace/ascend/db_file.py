"""A read-only sqlite file of torch_npu's db export (``SqliteFile``: its tables and columns, and
queries that fail as BadTraceError), and the conversions every table's columns go through:
interned strings, ids, ns times to µs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ...core import limits
from ...core.errors import BadTraceError


class SqliteFile:
    """A read-only sqlite file: its tables and columns, and queries that fail as BadTraceError.

    The file may come from someone else, so only what the profiler writes is read: plain tables.
    A view or a virtual table under a table's name is left out with a warning (``refused``; a view
    runs its author's query, e.g. a recursive one that never ends), a table of more rows than
    ``HERMES_MAX_EVENTS`` is refused before it is read, and every query of the file together gets
    ``HERMES_MAX_DB_SECONDS`` of wall time (default 600 s), past which sqlite is interrupted."""

    def __init__(self, path: Path):
        self.path = path
        limits.check_size(path, what="a sqlite database")  # a FIFO or device is refused, never opened
        self.budget_s = limits.max_db_seconds()
        self._deadline = time.monotonic() + self.budget_s
        self._timed_out = False
        self._rows: dict[str, int] = {}
        try:
            # read-only and immutable: sqlite never writes -shm / -wal files beside it (a WAL-mode
            # export in a read-only directory fails otherwise), never takes a lock
            self.con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            self.con.set_progress_handler(self._progress, 10_000)
            rows = self.con.execute("SELECT name, type, coalesce(sql, '') FROM sqlite_master "
                                    "WHERE type IN ('table', 'view')").fetchall()  # fmt: skip
            self.refused = sorted(f"{n} ({'a view' if t == 'view' else 'a virtual table'})" for n, t, sql in rows
                                  if t == "view" or sql.lstrip().upper().startswith("CREATE VIRTUAL"))  # fmt: skip
            self.tables = {n for n, t, sql in rows if t == "table" and not sql.lstrip().upper().startswith("CREATE VIRTUAL")}
            self.columns = {t: {r[1] for r in self.con.execute(f'PRAGMA table_info("{t}")')} for t in self.tables}
        except sqlite3.Error as exc:
            raise BadTraceError(self._reason(exc, "not a readable sqlite database"), str(path)) from None
        self._strings: dict[int, str] | None = None

    def _progress(self) -> int:
        if time.monotonic() > self._deadline:
            self._timed_out = True
            return 1  # sqlite stops the statement with "interrupted"
        return 0

    def _reason(self, exc: Exception, what: str) -> str:
        if self._timed_out:
            return f"{what}: stopped after {self.budget_s:g} s (HERMES_MAX_DB_SECONDS; raise it for a database this large)"
        return f"{what} ({one_line(exc)})"

    def _check_rows(self, table: str) -> None:
        if table not in self.tables or table in self._rows:
            return
        n = int(self.con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
        self._rows[table] = n
        if n > limits.max_events():
            raise BadTraceError(f"table {table} has {n:,} rows, more than HERMES_MAX_EVENTS={limits.max_events():,}: "
                                "not read (raise the limit to read it)", str(self.path))  # fmt: skip

    def close(self) -> None:
        self.con.close()

    def has(self, table: str, *cols: str) -> bool:
        return table in self.tables and all(c in self.columns[table] for c in cols)

    def query(self, sql: str, what: str) -> pd.DataFrame:
        """``what``: the table read (its rows are counted against HERMES_MAX_EVENTS first)."""
        try:
            self._check_rows(what)
            return pd.read_sql_query(sql, self.con)
        except (sqlite3.Error, pd.errors.DatabaseError, ValueError) as exc:
            raise BadTraceError(self._reason(exc, f"cannot read {what}"), str(self.path)) from None

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            df = self.query("SELECT id, value FROM STRING_IDS", "STRING_IDS") if self.has("STRING_IDS", "id", "value") else None
            self._strings = {} if df is None else dict(zip(df["id"].astype(np.int64), df["value"].astype(object).fillna("").astype(str)))
        return self._strings

    def enum(self, table: str, default: dict[int, str] | None = None) -> dict[int, str]:
        out = dict(default or {})
        if self.has(table, "id", "name"):
            df = self.query(f'SELECT id, name FROM "{table}"', table)
            out.update(zip(df["id"].astype(np.int64), df["name"].astype(str)))
        return out


def refused_objects(db: SqliteFile) -> list[str]:
    """The warnings for the views and virtual tables of a db that were not read."""
    return [f"{db.path}: {r}: not read (a profiler export holds plain tables)" for r in db.refused]


def one_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:160]


def interned(ids: pd.Series, table: dict[int, str]) -> pd.Series:
    """Interned string ids -> their text ("" when missing)."""
    v = pd.to_numeric(ids, errors="coerce")
    return v.map(lambda i: table.get(int(i), "") if i == i else "").astype(object).astype(str)


def int_ids(s: pd.Series, default: int = -1) -> np.ndarray:
    """An id column as int64 (exact for integer cells); any other cell is ``default``."""
    v, ok = _exact_ints(s)
    v = v.copy()
    v[~ok] = default
    return v


def ns_to_us(ns: pd.Series) -> np.ndarray:
    """ns integers -> µs floats (the same arithmetic for every table, so joins on time agree);
    a cell that is not an integer is NaN (dropped and counted by the timeline's checks)."""
    v, ok = _exact_ints(ns)
    out = v.astype(np.float64) / 1000.0
    out[~ok] = np.nan
    return out


def _exact_ints(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, which are numbers) of an ns column, exact even when some cells are garbage
    (a column with text in it comes back as objects; through floats its ns would lose precision)."""
    if pd.api.types.is_integer_dtype(s.dtype):
        return s.to_numpy(np.int64).copy(), np.ones(len(s), dtype=bool)
    if pd.api.types.is_float_dtype(s.dtype):
        v = s.to_numpy(np.float64)
        ok = np.isfinite(v) & (np.abs(v) < 9.2e18)
        out = np.zeros(len(v), dtype=np.int64)
        out[ok] = v[ok].astype(np.int64)
        return out, ok
    out = np.zeros(len(s), dtype=np.int64)
    ok = np.zeros(len(s), dtype=bool)
    for i, v in enumerate(s.to_numpy(object).tolist()):
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            v = int(v)
        elif isinstance(v, str) and v.strip().lstrip("+-").isdigit():
            v = int(v.strip())
        if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
            out[i], ok[i] = v, True
    return out, ok


def dur_us(start: pd.Series, end: pd.Series) -> np.ndarray:
    """µs between two ns columns, subtracted as integers (µs floats near 1.7e15 resolve only 0.25 µs)."""
    a, ok_a = _exact_ints(start)
    b, ok_b = _exact_ints(end)
    ok = ok_a & ok_b
    out = np.full(len(a), np.nan)
    out[ok] = (b[ok] - a[ok]) / 1000.0
    return out


def empty_frame(cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in cols})


def note_unreadable(db: SqliteFile, table: str, n: int, warnings: list[str]) -> None:
    """Rows whose times are not integers (garbage in the table) are left out, and named."""
    if n:
        warnings.append(f"{db.path}: {table}: skipped {n} row(s) whose startNs / endNs is not an integer")
