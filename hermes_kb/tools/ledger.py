"""The user's own record of predictions against outcomes (issue 33, docs/advice.md#the-ledger).

``hermes diff BEFORE AFTER --record`` appends one line per resolved finding: what hermes predicted
before the change and the step speedup measured after it. ``hermes kb calibration --ledger``
reads the file back and shows each case's hit rate there beside the zoo's. The file is a plain
JSON-lines file in a documented place ($HERMES_LEDGER, else $XDG_DATA_HOME/hermes/ledger.jsonl,
else ~/.local/share/hermes/ledger.jsonl); hermes writes it only with --record and reads it only
with --ledger, never on its own.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ..advisor.report import Speedup
from ..core.errors import HermesError

LEDGER_ENV = "HERMES_LEDGER"
MAX_LINE = 64 * 1024  # a longer line is not one hermes wrote


class LedgerEntry(BaseModel):
    recorded: str = Field(description="UTC date and time the line was written")
    hermes_version: str
    case_id: str
    before: str = Field(description="file or directory name of the run before the change (no path)")
    after: str
    predicted: Speedup = Field(description="the range the finding stated before the change")
    measured_speedup: float = Field(description="mean step before / after over the finding's ranks")
    within_range: bool
    resolved_together: int = Field(default=1, ge=1, description="findings resolved by the same change: above 1 the "
                                   "measured speedup is their joint effect and is not counted for one case")  # fmt: skip


def ledger_path() -> Path:
    env = os.environ.get(LEDGER_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "hermes" / "ledger.jsonl"


def entries_of(result, version: str, before: str, after: str) -> list[LedgerEntry]:
    """The lines a diff (tools.diff.DiffResult) adds: its resolved findings with a measured speedup
    (``before`` / ``after``: the inputs' names, kept without their folders)."""
    resolved = [c for c in result.findings if c.status == "resolved" and c.measured_speedup is not None
                and c.predicted_speedup is not None]  # fmt: skip
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return [LedgerEntry(recorded=now, hermes_version=version, case_id=c.case_id,
                        before=Path(before).name or before, after=Path(after).name or after, predicted=c.predicted_speedup,
                        measured_speedup=c.measured_speedup, within_range=bool(c.within_range),
                        resolved_together=len(resolved)) for c in resolved]  # fmt: skip


def append(entries: list[LedgerEntry], path: Path | None = None) -> Path:
    """Append the lines (the folder is made if missing); one-line error when it cannot be written."""
    p = path or ledger_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a", encoding="utf-8") as fh:
            for e in entries:
                fh.write(e.model_dump_json() + "\n")
    except OSError as err:
        raise HermesError(f"{p}: cannot write the ledger ({err.strerror or err})") from None
    return p


def read(path: Path | None = None) -> tuple[list[LedgerEntry], list[str]]:
    """The ledger's lines, and a note per line that is not one hermes wrote (skipped)."""
    p = path or ledger_path()
    if not p.is_file():
        return [], []
    out, notes = [], []
    try:
        with p.open("r", encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                if len(line) > MAX_LINE:
                    notes.append(f"{p}:{i}: line longer than {MAX_LINE} characters, skipped")
                    continue
                try:
                    out.append(LedgerEntry.model_validate(json.loads(line)))
                except (json.JSONDecodeError, ValidationError, TypeError):
                    notes.append(f"{p}:{i}: not a ledger line, skipped")
    except OSError as err:
        raise HermesError(f"{p}: cannot read the ledger ({err.strerror or err})") from None
    return out, notes


def case_records(entries: list[LedgerEntry]) -> dict[str, tuple[int, int]]:
    """Per case: (hits, runs) over the lines that resolved one finding alone."""
    out: dict[str, tuple[int, int]] = {}
    for e in entries:
        if e.resolved_together != 1:
            continue
        h, n = out.get(e.case_id, (0, 0))
        out[e.case_id] = (h + int(e.within_range), n + 1)
    return out


__all__ = ["LEDGER_ENV", "LedgerEntry", "append", "case_records", "entries_of", "ledger_path", "read"]
