"""A rank's monitor log as the facts read it: its steps after warm-up as numpy columns
(``Series``: the warm-up the monitor detected, else the first ``WARMUP`` steps; the steps the
monitor slowed itself left out), and the monitor's notes (``read_notes``: rank<R>.monitor.jsonl)
with the values read from them."""

from __future__ import annotations

import math

import json
from pathlib import Path
from typing import Any

import numpy as np

from hermes_kb.monitor.reader import RankLog, RunLog

WARMUP = 2  # first steps left out (with at least MIN_STEPS_FOR_WARMUP steps)
MIN_STEPS_FOR_WARMUP = 10
NOTES = "rank{rank}.monitor.jsonl"
MAX_NOTES_BYTES = 64 << 20  # a notes file larger than this is damage: the monitor writes a few lines an hour
KEEP_AFTER_WARMUP = 0.5  # a detected warm-up is used when it leaves at least half of the steps


def read_notes(run: RunLog) -> dict[int, list[dict]]:
    """Per rank, the records of ``rank<R>.monitor.jsonl`` from its last start (a run directory
    reused by a second run keeps the second's); damaged lines are skipped."""
    out: dict[int, list[dict]] = {}
    d = Path(run.run_dir)
    for r in run.ranks:
        p = d / NOTES.format(rank=r)
        try:
            if not p.is_file():
                continue
            with open(p, "rb") as fh:
                data = fh.read(MAX_NOTES_BYTES)
        except OSError:
            continue
        recs: list[dict] = []
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                continue
            if rec["type"] == "start":
                recs = []
            recs.append(rec)
        out[r] = recs
    return out


def nonneg_int(v: Any) -> int | None:
    """A step number or count from a note: an int from 0 to 2^63 - 1 (what a step record holds)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None


def finite_num(v: Any) -> float | None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)  # an integer beyond a float's range raises
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _warmup_end(notes: list[dict]) -> int | None:
    for rec in notes:
        if rec.get("type") == "warmup" and rec.get("settled") is True and (e := nonneg_int(rec.get("end_step"))) is not None:
            return e
    return None


def run_warmup_end(notes: dict[int, list[dict]]) -> int | None:
    """The last step of the run's warm-up: the latest any rank detected (ranks compared with each
    other must be compared over the same steps)."""
    ends = [e for recs in notes.values() if (e := _warmup_end(recs)) is not None]
    return max(ends) if ends else None


def _perturbed(log: RankLog, notes: list[dict]) -> set[int]:
    """Steps the monitor slowed itself: each capture's profiled steps and the step after (it
    writes the trace), and the step whose FLOPs it counted."""
    out: set[int] = set()
    for c in log.captures:
        last = nonneg_int(c.get("step"))
        if last is None or "first_step" not in c:  # an older monitor's record: its steps are not known
            continue
        first = nonneg_int(c.get("first_step"))
        if first is None or first > last or last - first > 10_000:
            continue
        out.update(range(first, min(last + 2, 2**63)))
    for rec in notes:
        if rec.get("type") == "mfu" and (s := nonneg_int(rec.get("counted_step"))) is not None:
            out.add(s)
    return out


def nan_median(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else float("nan")


def none_if_nan(v: float) -> float | None:
    return None if v is None or np.isnan(v) else float(v)


# a step over this many times the median step, and over a minute, is left out: a suspended
# process or a clock jump (a 6.9-day step once made a rank's mean 2,013 s), never a step's work
OUTLIER_RATIO = 1000.0
OUTLIER_MIN_S = 60.0


class Series:
    """One rank's step columns as numpy arrays, warm-up steps and the steps the monitor slowed
    itself (captures, the FLOP-counted step) dropped. The warm-up is the one the monitor
    detected from the step times (its notes; ``warmup_end``: the run's, the latest of its ranks)
    when it leaves at least half of the steps, else the first ``WARMUP`` steps (with at least
    ``MIN_STEPS_FOR_WARMUP``)."""

    def __init__(self, log: RankLog, notes: list[dict] | None = None, warmup_end: int | None = None):
        n = log.steps_count
        notes = notes or []
        steps = np.asarray(log.step, dtype=np.int64)
        w = WARMUP if n >= MIN_STEPS_FOR_WARMUP else 0
        end = warmup_end if warmup_end is not None else _warmup_end(notes)
        self.detected = False
        if end is not None:
            k = int(np.searchsorted(steps, end, side="right")) if n and np.all(np.diff(steps) > 0) else None
            if k is not None and n - k >= KEEP_AFTER_WARMUP * n:
                w, self.detected = k, True
        self.warmup = w
        keep = np.zeros(n, dtype=bool)
        keep[w:] = True
        skip = _perturbed(log, notes)
        if skip:
            keep &= ~np.isin(steps, np.fromiter(skip, dtype=np.int64))
        self.outliers = 0
        if keep.sum() >= 3:  # a pause or a clock jump, not work: it would make the mean meaningless
            wall = np.nan_to_num(np.asarray(log.wall_s, dtype=np.float64), nan=0.0)
            out = keep & (wall > OUTLIER_RATIO * float(np.median(wall[keep]))) & (wall > OUTLIER_MIN_S)
            keep &= ~out
            self.outliers = int(out.sum())
        self.excluded = int(n - w - keep.sum())

        def col(a, dtype=np.float64):
            return np.asarray(a, dtype=dtype)[keep]

        self.step = steps[keep]
        self.wall = col(log.wall_s) * 1e6
        self.dw = np.nan_to_num(col(log.data_wait_s)) * 1e6
        self.gc = np.nan_to_num(col(log.gc_pause_s)) * 1e6
        self.gen2 = col(log.gc_gen2, np.int64)
        self.cpu = col(log.cpu_s) * 1e6
        dwc = getattr(log, "data_wait_cpu_s", None)  # absent from logs older than the field
        self.dwc = (col(dwc) * 1e6 if dwc is not None and len(dwc) == n
                    else np.full(len(self.wall), np.nan))  # fmt: skip
        self.sys = col(log.sys_s) * 1e6
        self.flt = col(log.minflt)
        self.opt = col(log.optimizer_s) * 1e6
        self.opt_sys = col(log.optimizer_sys_s) * 1e6
        self.opt_flt = col(log.optimizer_minflt)
        self.sps = col(log.samples_per_s)
        self.mfu = col(log.mfu)
        self.flags = col(log.fluctuation, np.int8)
        comm = getattr(log, "comm_s", None)  # absent from readers older than the monitor's comm timing
        self.comm = (col(comm) * 1e6 if comm is not None and len(comm) == n
                     else np.full(len(self.wall), np.nan))  # fmt: skip
        first = int(self.step[0]) if len(self.step) else 0
        kept = set(self.step.tolist())
        self.events = {s: e for s, e in log.events.items() if s in kept}
        self.device = np.array([v for s, v in log.device_s.items() if s >= first and s in kept], dtype=np.float64) * 1e6

    def __len__(self) -> int:
        return len(self.wall)

    @property
    def compute(self) -> np.ndarray:
        return self.wall - self.dw - self.gc


def mfu_note(notes: list[dict]) -> dict | None:
    """The monitor's last FLOPs record that gave a count."""
    got = [r for r in notes if r.get("type") == "mfu" and r.get("counted") is True and finite_num(r.get("flops_per_step"))]
    return got[-1] if got else None


def device_of(log: RankLog) -> str:
    versions = (log.environment or {}).get("versions") or {}
    if "torch_npu" in versions:
        return "npu"
    if log.device_s or "nccl" in versions:
        return "gpu"
    return "cpu"


def sample_median(samples: list[dict], key: str) -> float | None:
    vals = [float(x[key]) for x in samples if isinstance(x.get(key), (int, float)) and not isinstance(x.get(key), bool)]
    return float(np.median(vals)) if vals else None
