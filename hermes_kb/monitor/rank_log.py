"""The monitor's two files per rank: ``RUN_DIR/rank<R>.jsonl`` (the environment, one line per
step, the captures, the end) and ``RUN_DIR/rank<R>.monitor.jsonl`` (``NOTES``: what the monitor
found and decided). A step line is formatted by hand (``STEP_LINE``, ``optional_fields``): a
third of the cost of json.dumps on the training thread."""

from __future__ import annotations

import json
import time
from typing import Any

encode_json = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_NUMERIC = frozenset(("optimizer_s", "optimizer_sys_s", "comm_s", "comm_blocked_s"))
_COUNTS = frozenset(("optimizer_minflt", "gc_gen2"))


def optional_fields(opt: dict) -> str:
    """The optional fields of a step record, as ',"key":value...': the frequent numeric ones by
    hand, the rest (events, device times, resource samples, extras) through json."""
    out = []
    rest = {}
    for k, v in opt.items():
        if k in _NUMERIC and v.__class__ is float:
            out.append(',"%s":%.6g' % (k, v))
        elif k in _COUNTS and v.__class__ is int:
            out.append(',"%s":%d' % (k, v))
        else:
            rest[k] = v
    if rest:
        out.append("," + encode_json(rest)[1:-1])
    return "".join(out)


STEP_LINE = ('{"type":"step","rank":%d,"step":%d,"time":%.6f,"wall_s":%.6g,"data_wait_s":%.6g,"gc_count":%d,'
             '"gc_pause_s":%.6g,"cpu_s":%.6g,"sys_s":%.6g,"minflt":%d,"fluctuation":%s')

NOTES = "rank{rank}.monitor.jsonl"  # what the monitor found and decided: warm-up, triggers, domains, FLOPs


class RankLogWriter:
    """The Monitor's (recorder.py) writes other than the step line: records of the rank log and
    notes. A mixin: the file handles and the rank are the Monitor's attributes."""

    _fh: Any
    _notes_fh: Any
    _flushed: float
    _left_out: int
    rank: int

    def _write(self, rec: dict) -> None:
        if self._fh is not None:
            self._fh.write((encode_json(rec) + "\n").encode())
            now = time.perf_counter()
            if now - self._flushed >= 1.0 or rec.get("type") != "step":
                self._fh.flush()
                self._flushed = now

    def _flush(self) -> None:
        fh = self._fh
        if fh is not None:
            fh.flush()

    def _note(self, rec: dict) -> None:
        """A line of RUN_DIR/rank<R>.monitor.jsonl (rare: flushed at once)."""
        if rec.get("type") == "trigger" and rec.get("captured") is False and self._left_out:
            rec = {**rec, "left_out_before": self._left_out}
            self._left_out = 0
        if self._notes_fh is not None:
            try:
                self._notes_fh.write(json.dumps({**rec, "rank": self.rank, "time": time.time()}, default=str,
                                                separators=(",", ":")) + "\n")  # fmt: skip
                self._notes_fh.flush()
            except (OSError, ValueError):  # a full disk: the notes are lost, not the training
                pass
