"""Fuzz hermes with damaged and hostile inputs, and classify what it does with each (issue 18).

    python benchmarks/fuzz.py --minutes 30 [--seed 18] [--workers 2] [--timeout 60]
                              [--category kineto ascend monitor kb] [--json results.json]

Inputs, by category (docs/reliability.md has the last figures):
- kineto: real traces (the bundled example, and small ones from ../shared/data when it is there)
  mutated at the JSON level (one event's ts set to 0, negative, 1e18 or "inf"; a negative or
  year-long dur; an event duplicated; a field deleted or retyped; args, metadata and top-level
  keys retyped; events shuffled or all duplicated) and at the byte level (bit flips, truncation,
  NaN / Infinity literals, invalid UTF-8, 1000-deep nesting, gzip damage), plus event lists
  generated with hypothesis;
- ascend: a torch_npu rank directory (text export and sqlite export) with one file damaged
  (truncation, bit flips, garbage, cells and events retyped, sqlite cells set to text, tables
  dropped, WAL mode);
- monitor: a recorded 2-rank monitor run with records damaged (impossible values, retyped and
  deleted fields, NaN literals, cut lines, invalid UTF-8, deep nesting, ill-typed environment
  records) or rank files replaced by a dangling link, a FIFO or a directory;
- kb: rule, case and --config files: real ones mutated, billion-laughs YAML, python tags,
  template injections (sandbox escapes, range(10**8), huge paddings), engine operators as values,
  non-UTF-8 text, identical conditions, typos and string thresholds;
- semantic (issue 37): inputs that stay readable but whose answer the damage would change: two
  logs claiming one rank, another process's capture in a run directory (the fixed twin's or
  another scenario's), a monitored step of days, an empty stretched ProfilerStep, a ProfilerStep
  spanning the others, a trace of device activity only, kernels without their launch calls. Such
  an input counts as ``success`` only when the report carries the warning that qualifies it;
  without it, ``wrong_success`` ("silent");
- requests (issue 37): a short training loop under the monitor (a stand-in profiler, no torch)
  while its capture request and a peer's file are replaced between steps by JSON of any shape,
  garbage, a FIFO, a link to /dev/zero or out of the directory, a directory or a 1 MB file: an
  exception out of ``step()`` is a crash, a blocked loop a hang, a file written outside the run
  directory a ``wrong_success``.

Each input ends in one of: ``clean_error`` (a HermesError whose message is one line naming the
file), ``success`` (a report that passes the checks below), ``wrong_success`` (a detectable wrong
answer: a NaN / inf in the report, a speedup below 1 or above 1000, a step time not above zero
or above 3 hours, or, for damage the reader is meant to drop, an answer that differs from that of
the input without the damaged event or record), ``crash`` (any other exception, a HermesError
that is several lines or does not name the file, or a worker that died), ``hang`` (no answer
within the timeout) and ``code_execution`` (a payload's marker file appeared).

Inputs are made from a fixed seed: the same seed and count give the same inputs. Every input is
run in a worker process (forked from this one, a fresh one after a hang or a crash).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import stat
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
EXAMPLE = ROOT / "examples" / "traces" / "cpu_dataloader_bound.json.gz"
MONITOR_RUN = ROOT / "tests" / "data" / "monitor_runs" / "two_ranks"
OUTCOMES = ("success", "clean_error", "wrong_success", "crash", "hang", "code_execution")
CATEGORIES = ("kineto", "ascend", "monitor", "kb", "semantic", "requests")
MAX_STEP_US = 3 * 3600e6
MAX_SPEEDUP = 1000.0

SMALL_KINETO = [  # fast to advise (< 0.3 s each), several eras and devices
    "param/dlrm_kineto_8rank/worker0_step_12.1694128201545.pt.trace.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "tracelens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
    "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/mi300__gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/torch_compile_triton__trace.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
]
ASCEND_DIRS = ["ascend/msinsight_pt_text_level1_2rank/rank0_ascend_pt", "ascend/msinsight_pt_db_level1_2rank/rank0_ascend_pt"]


def kineto_sources() -> list[Path]:
    out = [EXAMPLE]
    if SHARED.is_dir():
        out += [SHARED / p for p in SMALL_KINETO if (SHARED / p).is_file()]
    return out


def ascend_sources() -> list[Path]:
    return [SHARED / p for p in ASCEND_DIRS if (SHARED / p).is_dir()] if SHARED.is_dir() else []


def kb_sources() -> list[Path]:
    return sorted((ROOT / "rules").glob("*.yaml")) + sorted((ROOT / "cases").glob("*/*.yaml"))


# ---- the oracle -------------------------------------------------------------------------------


def _numbers(obj: Any, path: str = ""):
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")


def report_problems(report) -> list[str]:
    """Detectable wrong answers in a report (empty when it passes)."""
    doc = report.model_dump(mode="python")
    bad = [f"{p} = {v}" for p, v in _numbers(doc) if isinstance(v, float) and not math.isfinite(v)]
    for f in report.findings:
        s = f.expected_speedup
        if not (1.0 - 1e-9 <= s.low <= s.high <= MAX_SPEEDUP):
            bad.append(f"{f.case_id} speedup {s.low}-{s.high}")
        bad += _calibration_problems(s, f.case_id)
        if f.confidence is not None and not (0.0 <= f.confidence <= 1.0 and f.confidence_runs >= 1):
            bad.append(f"{f.case_id} confidence {f.confidence} over {f.confidence_runs} runs")
    for s in report.summary:
        m = s.mean_step_us
        if m is not None and not (0 < m <= MAX_STEP_US):
            bad.append(f"rank {s.rank} mean step {m} µs")
        for k, v in s.model_dump(mode="python").items():
            if k.endswith("_us") and isinstance(v, (int, float)) and v < -1e-6:
                bad.append(f"rank {s.rank} {k} = {v}")
    if report.combined is not None:
        for p, v in _numbers(report.combined.model_dump(mode="python")):
            if ("speedup" in p and not p.endswith("coverage") and isinstance(v, (int, float))
                    and not (1.0 - 1e-9 <= v <= MAX_SPEEDUP)):  # fmt: skip
                bad.append(f"combined{p} = {v}")
        bad += _calibration_problems(report.combined.expected_speedup, "combined")
    return bad


def _calibration_problems(s, who: str) -> list[str]:
    """A calibrated range holds its point, states a coverage in (0, 1], and keeps the model's range."""
    if s.coverage is None:
        return []
    ok = (0.0 < s.coverage <= 1.0 and s.model_low is not None and s.model_high is not None
          and (s.point is None or s.low - 1e-3 <= s.point <= s.high + 1e-3))  # fmt: skip
    return [] if ok else [f"{who} calibrated speedup {s}"]


def answer(report) -> list:
    """What must not change when only damage the readers drop was added."""
    finds = sorted((f.case_id, round(f.expected_speedup.low, 2), round(f.expected_speedup.high, 2)) for f in report.findings)
    steps = sorted((s.rank, round(s.mean_step_us or 0.0, 1)) for s in report.summary)
    return [finds, steps]


def classify_error(err: BaseException, case_dir: str) -> tuple[str, str]:
    from hermes_kb.core.errors import HermesError
    from hermes_kb.kb.loader import KbError

    msg = str(err)
    if not isinstance(err, HermesError):
        return "crash", f"{type(err).__name__}: {msg[:300]}\n{''.join(traceback.format_tb(err.__traceback__)[-3:])}"
    if isinstance(err, KbError):
        lines = msg.splitlines()
        if lines and all(case_dir in ln and ".yaml:" in ln for ln in lines):
            return "clean_error", lines[0][:300]
        return "crash", f"KbError lines do not all name a file: {msg[:300]}"
    if "\n" in msg:
        return "crash", f"error of several lines: {msg[:300]}"
    if case_dir not in msg:
        return "crash", f"error does not name the file: {msg[:300]}"
    return "clean_error", msg[:300]


# ---- materialising a case (in the worker) -----------------------------------------------------

_DOCS: dict[str, Any] = {}


def _doc(src: Path):
    key = str(src)
    if key not in _DOCS:
        raw = src.read_bytes()
        _DOCS[key] = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return copy.deepcopy(_DOCS[key])


def _events(doc) -> list:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


WEIRD = [None, "", "x", "12abc", [], {}, [1, [2]], {"a": {"b": 1}}, True, False, 0, -1, 2**63, 2**64, -(2**63) - 1,
         10**30, 1e308, -1e308, 1e-320, 3.5, "inf", "-inf", "nan", "Infinity", "\u202e\u0000\x1b[2J", "🔥" * 50]  # fmt: skip
DROP_KINDS = ("ts_zero", "ts_negative", "ts_huge", "ts_inf", "dur_negative", "dur_huge", "duplicate")
KINETO_KINDS = DROP_KINDS + ("retype", "delete_field", "args", "top_level", "shuffle", "dup_all", "bitflip",
                             "truncate", "literal", "utf8", "deep", "gz_damage", "name_payload")  # fmt: skip


def kineto_mutation(src: Path, kind: str, rng: random.Random, out: Path) -> tuple[Path, Path | None]:
    """Write the mutated trace to ``out``; return it and, for damage that must be dropped, the
    reference input (the same trace without the damaged event, or the original)."""
    doc = _doc(src)
    ev = _events(doc)
    xs = [i for i, e in enumerate(ev) if isinstance(e, dict) and e.get("ph") == "X"] or list(range(len(ev)))
    i = rng.choice(xs)
    ref = None
    if kind in DROP_KINDS:
        e = ev[i]
        window = _window(ev)
        if kind == "ts_zero":
            e["ts"] = 0
        elif kind == "ts_negative":
            e["ts"] = -rng.choice([1, 1e9, 1e15, 1e17])
        elif kind == "ts_huge":
            e["ts"] = rng.choice([1e18, 1e300, 9e15 + float(e.get("ts") or 0)])
        elif kind == "ts_inf":
            e["ts"] = rng.choice(["inf", "-inf", "Infinity", "-Infinity"])
        elif kind == "dur_negative":
            e["dur"] = -rng.choice([0.5, 1, 1e6, 1e15])
        elif kind == "dur_huge":
            e["dur"] = rng.choice([1e15, 1e300, 3e13])
        if kind == "duplicate":
            ev.insert(rng.randrange(len(ev) + 1), copy.deepcopy(ev[i]))
            ref = src
        elif _plausible(e, window):
            ref = None  # the damage left a time the readers must take as real: checked for sanity only
        else:
            ref_doc = _doc(src)
            del _events(ref_doc)[i]
            ref = out.with_name("reference.json")
            ref.write_text(json.dumps(ref_doc))
    elif kind == "retype":
        ev[i][rng.choice(["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id"])] = rng.choice(WEIRD)
    elif kind == "delete_field":
        ev[i].pop(rng.choice(["ts", "dur", "name", "cat", "ph", "pid", "tid", "args"]), None)
    elif kind == "args":
        args = ev[i].setdefault("args", {}) if isinstance(ev[i].get("args", {}), dict) else {}
        key = rng.choice(["External id", "correlation", "Input Dims", "stream", "device", "bytes", "Collective name",
                          "In msg nelems", "Group size", "dtype", "Record function id", "grid", "block",
                          "est. achieved occupancy %", "memory bandwidth (GB/s)", "Python id", "Bytes"])  # fmt: skip
        args[key] = rng.choice(WEIRD)
    elif kind == "top_level" and isinstance(doc, dict):
        key = rng.choice(["traceEvents", "distributedInfo", "deviceProperties", "baseTimeNanoseconds", "schemaVersion"])
        if key == "distributedInfo":
            doc[key] = rng.choice([{"rank": 10**30}, {"rank": -1}, {"rank": "x", "world_size": 1e30}, [1], "r"])
        elif key == "traceEvents" and rng.random() < 0.3:
            del doc[key]
        else:
            doc[key] = rng.choice(WEIRD)
    elif kind == "shuffle":
        rng.shuffle(ev)
        ref = src
    elif kind == "dup_all":
        ev.extend(copy.deepcopy(ev))
        ref = src
    elif kind == "name_payload":
        ev[i]["name"] = rng.choice(["{{ 7*7 }}", "{% for x in range(10**9) %}x{% endfor %}", "${jndi:x}", "\x1b]52;c;aGk=\x07",
                                    "<img src=x onerror=alert(1)>", "a" * 100_000])  # fmt: skip
    data = json.dumps(doc).encode()
    if kind == "bitflip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            k = rng.randrange(len(b))
            b[k] ^= 1 << rng.randrange(8)
        data = bytes(b)
    elif kind == "truncate":
        data = data[: rng.randrange(len(data))]
    elif kind == "literal":
        k = data.find(b'"ts": ', rng.randrange(len(data)))
        j = data.find(b",", k + 6)
        if k > 0 and j > 0:
            data = data[: k + 6] + rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"0x10"]) + data[j:]
    elif kind == "utf8":
        k = data.find(b'"name": "', rng.randrange(len(data)))
        if k > 0:
            data = data[: k + 9] + rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]) + data[k + 9:]
    elif kind == "deep":
        k = data.find(b'"args": ', rng.randrange(len(data)))
        depth = rng.choice([100, 1000, 5000])
        if k > 0:
            data = data[: k + 8] + b"[" * depth + b"]" * depth + b", \"x\": " + data[k + 8:]
    if kind == "gz_damage" or (rng.random() < 0.3 and kind not in ("truncate", "bitflip")):
        gz = bytearray(gzip.compress(data, compresslevel=1))
        if kind == "gz_damage":
            how = rng.choice(["flip", "cut", "append", "members"])
            if how == "flip":
                k = rng.randrange(10, len(gz))
                gz[k] ^= 1 << rng.randrange(8)
            elif how == "cut":
                gz = gz[: rng.randrange(len(gz))]
            elif how == "append":
                gz += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            else:
                gz += gzip.compress(b" " * rng.randint(1, 1000))
        out = out.with_suffix(".json.gz") if not out.name.endswith(".gz") else out
        out.write_bytes(bytes(gz))
    else:
        out.write_bytes(data)
    return out, ref


def _num_or_none(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _window(ev: list) -> tuple[float, float] | None:
    """The plausible time span of a trace as docs/reliability.md defines it (re-derived here, not
    imported, so that the oracle does not share the reader's code): the 25th-75th percentile of
    the starts widened by 100x its width and at least an hour; under 20 events, an hour either
    side of the median start."""
    ts = sorted(t for e in ev if isinstance(e, dict) and e.get("ph") in ("X", "i")
                and (t := _num_or_none(e.get("ts"))) is not None)  # fmt: skip
    if not ts:
        return None
    if len(ts) < 20:
        mid = _quantile(ts, 0.5)
        return mid - 3600e6, mid + 3600e6
    lo, hi = _quantile(ts, 0.25), _quantile(ts, 0.75)
    r = max(100 * (hi - lo), 3600e6)
    return lo - r, hi + r


def _quantile(xs: list[float], p: float) -> float:
    pos = (len(xs) - 1) * p
    a = int(pos)
    b = min(a + 1, len(xs) - 1)
    return xs[a] + (xs[b] - xs[a]) * (pos - a)


def _plausible(e: dict, window) -> bool:
    ts, dur = _num_or_none(e.get("ts")), _num_or_none(e.get("dur", 0) or 0)
    if ts is None or dur is None or dur < 0:
        return False
    return window is None or (window[0] <= ts and ts + dur <= window[1])


def generated_trace(events: list[dict], out: Path) -> Path:
    out.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return out


ASCEND_TEXT_FILES = ["trace_view.json", "kernel_details.csv", "communication.json", "communication_matrix.json",
                     "step_trace_time.csv", "op_statistic.csv", "api_statistic.csv", "memory_record.csv"]  # fmt: skip


def ascend_mutation(src: Path, rng: random.Random, out: Path) -> Path:
    d = out / src.name
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("*-shm", "*-wal", "operator_details.csv", "l2_cache.csv",
                                                          "npu_module_mem.csv", "operator_memory.csv"))  # fmt: skip
    for f in [d, *d.rglob("*")]:
        f.chmod(f.stat().st_mode | stat.S_IWUSR | (stat.S_IXUSR if f.is_dir() else 0))
    o = d / "ASCEND_PROFILER_OUTPUT"
    dbs = sorted(o.glob("*.db"))
    if dbs:
        db = rng.choice(dbs)
        how = rng.choice(["cells", "cells", "cells", "drop_table", "truncate", "bitflip", "wal", "profiler_info"])
        if how in ("cells", "drop_table", "wal"):
            _sql_damage(db, how, rng)
        elif how == "truncate":
            data = db.read_bytes()
            db.write_bytes(data[: rng.randrange(len(data))])
        elif how == "bitflip":
            b = bytearray(db.read_bytes())
            for _ in range(rng.randint(1, 16)):
                k = rng.randrange(len(b))
                b[k] ^= 1 << rng.randrange(8)
            db.write_bytes(bytes(b))
        else:
            _damage_text(next(d.glob("profiler_info*.json")), rng)
        return d
    f = o / rng.choice(ASCEND_TEXT_FILES)
    if not f.exists():
        f = next(d.glob("profiler_info*.json"))
    if f.name == "trace_view.json" and rng.random() < 0.6:
        doc = json.loads(f.read_text())
        ev = _events(doc)
        xs = [k for k, e in enumerate(ev) if isinstance(e, dict) and e.get("ph") == "X"]
        for _ in range(rng.randint(1, 5)):
            e = ev[rng.choice(xs)]
            field = rng.choice(["ts", "ts", "dur", "name", "pid", "tid", "args", "cat"])
            e[field] = rng.choice([*WEIRD, "abc", "-5", "0", "1e300"])
        if rng.random() < 0.3:
            ev.append(copy.deepcopy(ev[rng.choice(xs)]))
        f.write_text(json.dumps(doc))
    else:
        _damage_text(f, rng)
    return d


def _sql_damage(db: Path, how: str, rng: random.Random) -> None:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        t = rng.choice(tables)
        if how == "drop_table":
            con.execute(f'DROP TABLE "{t}"')
        elif how == "wal":
            con.execute("PRAGMA journal_mode=WAL")
        else:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
            c = rng.choice(cols)
            v = rng.choice(["garbage", None, -1, 2**62, -(2**62), 1e308, 0, "", "1e999", 3.5])
            con.execute(f'UPDATE "{t}" SET "{c}" = ? WHERE rowid IN (SELECT rowid FROM "{t}" ORDER BY random() LIMIT ?)',
                        (v, rng.choice([1, 5, 100000])))  # fmt: skip
        con.commit()
    except sqlite3.Error:  # e.g. text into an INTEGER PRIMARY KEY: that damage cannot be written
        pass
    finally:
        con.close()


def _damage_text(f: Path, rng: random.Random) -> None:
    data = f.read_bytes()
    how = rng.choice(["truncate", "bitflip", "garbage", "json", "cell", "cell", "utf8", "header"])
    if how == "truncate":
        data = data[: rng.randrange(max(len(data), 1))]
    elif how == "bitflip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                k = rng.randrange(len(b))
                b[k] ^= 1 << rng.randrange(8)
        data = bytes(b)
    elif how == "garbage":
        data = rng.choice([b"", b"\x00" * 100, b"null", b"[]", b"{}", b"[1, 2]", b'{"step1": "garbage"}', os.urandom(200)])
    elif how == "json" and f.suffix == ".json":
        try:
            doc = json.loads(data)
            doc = _retype_json(doc, rng)
            data = json.dumps(doc).encode()
        except ValueError:
            pass
    elif how == "cell" and f.suffix == ".csv":
        lines = data.decode("utf-8", "replace").splitlines()
        if len(lines) > 1:
            k = rng.randrange(1, len(lines))
            cells = lines[k].split(",")
            c = rng.randrange(len(cells))
            cells[c] = rng.choice(["abc", "-1", "1e308", "nan", "", "inf", "-1e15", '"', "N/A", "99999999999999999999999"])
            lines[k] = ",".join(cells)
        data = ("\n".join(lines) + "\n").encode()
    elif how == "utf8":
        k = rng.randrange(max(len(data), 1))
        data = data[:k] + b"\xff\xfe\xc3\x28" + data[k:]
    elif how == "header":
        lines = data.split(b"\n", 1)
        data = b"a,b,c\n" + (lines[1] if len(lines) > 1 else b"")
    f.write_bytes(data)


def _retype_json(doc: Any, rng: random.Random, depth: int = 0) -> Any:
    if isinstance(doc, dict) and doc:
        k = rng.choice(list(doc))
        doc[k] = _retype_json(doc[k], rng, depth + 1) if rng.random() < 0.6 and depth < 6 else rng.choice(WEIRD)
    elif isinstance(doc, list) and doc:
        k = rng.randrange(len(doc))
        doc[k] = _retype_json(doc[k], rng, depth + 1) if rng.random() < 0.6 and depth < 6 else rng.choice(WEIRD)
    else:
        return rng.choice(WEIRD)
    return doc


MONITOR_FIELDS = ["wall_s", "wall_s", "data_wait_s", "gc_pause_s", "cpu_s", "sys_s", "step", "time", "gc_count",
                  "optimizer_s", "samples_per_s", "mfu", "minflt"]  # fmt: skip
TYPE_DAMAGE = ["fast", [1], {"a": 1}, True]  # never a number the monitor writes
IMPOSSIBLE = {  # per field: values no real step can have (the reader must drop the record)
    "wall_s": [-0.5, 0, 1e-300, 1e300, 1e7, None], "data_wait_s": [-1.0, "x2", "x10"], "gc_pause_s": [-1e-3, "x2"],
    "optimizer_s": [-1.0, "x1e6"], "cpu_s": [-1.0, 1e300], "sys_s": [-0.5], "step": [-1, 2**64, 1.5, -(2**63)],
    "time": [-1.0, 1e300], "gc_count": [-3, 1.5], "samples_per_s": [-2.0, 1e300], "mfu": [-0.1, 1e6], "minflt": [-1.0],
}  # fmt: skip


def monitor_mutation(rng: random.Random, out: Path) -> tuple[Path, Path | None]:
    d = out / "run"
    shutil.copytree(MONITOR_RUN, d, ignore=shutil.ignore_patterns("README.md"))
    f = d / rng.choice(["rank0.jsonl", "rank1.jsonl"])
    lines = f.read_text().splitlines()
    steps = [k for k, ln in enumerate(lines) if '"type":"step"' in ln or '"type": "step"' in ln]
    kind = rng.choice(["drop_record", "drop_record", "drop_record", "env", "delete_line", "dup_line", "cut", "bitflip",
                       "literal", "utf8", "deep", "file", "all_bad", "sample", "events"])  # fmt: skip
    ref = None
    if kind == "drop_record":
        k = rng.choice(steps)
        rec = json.loads(lines[k])
        field = rng.choice(MONITOR_FIELDS)
        v = rng.choice(IMPOSSIBLE[field] + TYPE_DAMAGE)
        if isinstance(v, str) and v.startswith("x") and v[1:].replace(".", "").replace("e", "").isdigit():
            v = rec["wall_s"] * float(v[1:])  # a wait longer than the step it is in
        rec[field] = v
        if field == "wall_s" and v is None:
            del rec["wall_s"]
        lines[k] = json.dumps(rec)
        ref_dir = out / "reference"
        shutil.copytree(MONITOR_RUN, ref_dir, ignore=shutil.ignore_patterns("README.md"))
        (ref_dir / f.name).write_text("\n".join(x for j, x in enumerate(lines) if j != k) + "\n")
        ref = ref_dir
    elif kind == "env":
        k = next((j for j, ln in enumerate(lines) if "environment" in ln), 0)
        rec = json.loads(lines[k])
        rec[rng.choice(["affinity", "env", "cpu_count", "torch_threads", "gc_thresholds", "domains", "hostname", "cpu",
                        "versions", "rank"])] = rng.choice(WEIRD)  # fmt: skip
        lines[k] = json.dumps(rec)
    elif kind == "delete_line":
        del lines[rng.randrange(len(lines))]
    elif kind == "dup_line":
        k = rng.randrange(len(lines))
        lines.insert(k, lines[k])
    elif kind == "cut":
        k = rng.randrange(len(lines))
        lines[k] = lines[k][: rng.randrange(len(lines[k]) + 1)]
    elif kind == "literal":
        k = rng.choice(steps)
        lines[k] = lines[k].replace('"wall_s":', '"wall_s":' + rng.choice(["NaN", "Infinity", "-Infinity", "1e999"]) + ',"x":', 1)
    elif kind == "sample":
        k = rng.choice(steps)
        rec = json.loads(lines[k])
        rec[rng.choice(["process_cpu_cores", "system_cpu_ratio", "rss_bytes", "affinity_count", "runqueue_wait_ratio",
                        "top_procs", "others_cores", "torch_threads", "main_run_ratio"])] = rng.choice(WEIRD)  # fmt: skip
        lines[k] = json.dumps(rec)
    elif kind == "events":
        k = rng.choice(steps)
        rec = json.loads(lines[k])
        rec[rng.choice(["events", "device_s"])] = rng.choice([{"ckpt": -5}, {"x": "y"}, [[1, -3]], [[2**64, 1]], "z", [["a"]],
                                                               {"save": 1e300}])  # fmt: skip
        lines[k] = json.dumps(rec)
    elif kind == "all_bad":
        lines = [ln.replace('"wall_s":', '"wall_s":-1,"x":') for ln in lines]
    text = "\n".join(lines) + "\n"
    data = text.encode()
    if kind == "bitflip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            k = rng.randrange(len(b))
            b[k] ^= 1 << rng.randrange(8)
        data = bytes(b)
    elif kind == "utf8":
        k = rng.randrange(len(data))
        data = data[:k] + b"\xff\xfe" + data[k:]
    elif kind == "deep":
        k = data.find(b"\n", rng.randrange(len(data)))
        data = data[: k + 1] + b"[" * 5000 + b"]" * 5000 + data[k:]
    f.write_bytes(data)
    if kind == "file":
        how = rng.choice(["dangling", "fifo", "dir", "empty", "binary"])
        g = d / rng.choice(["rank0.jsonl", "rank1.jsonl", "rank2.jsonl"])
        if g.exists():
            g.unlink()
        if how == "dangling":
            os.symlink(out / "nowhere.jsonl", g)
        elif how == "fifo":
            os.mkfifo(g)
        elif how == "dir":
            g.mkdir()
        elif how == "empty":
            g.write_bytes(b"")
        else:
            g.write_bytes(os.urandom(4096))
    return d, ref


ZOO = ROOT / "benchmarks" / "scenarios" / "recorded"
SEMANTIC_KINDS = ("dup_rank", "foreign_capture", "stretched_step", "nested_step", "gpu_only", "no_launch_calls",
                  "days_step")  # fmt: skip


def _synthetic_gpu(n: int, linked: int, host: bool, out: Path) -> Path:
    """n kernels after n operators (when ``host``), the first ``linked`` with their launch call."""
    ev = []
    for i in range(n):
        if host:
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 * i, "dur": 20})
        if host and i < linked:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 100 * i + 5, "dur": 5, "args": {"correlation": i + 1}})  # fmt: skip
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 100 * i + 30, "dur": 40,
                   "args": {"device": 0, "stream": 7, "correlation": i + 1}})  # fmt: skip
    out.write_text(json.dumps({"traceEvents": ev}))
    return out


def _counted_steps(run_dir: Path) -> set[int]:
    """The steps of rank 0 the monitor analysis counts: after the warm-up, not slowed by a capture."""
    from hermes_kb.analyzers.monitor.series import Series, read_notes, run_warmup_end
    from hermes_kb.monitor.reader import read_run

    run = read_run(run_dir)
    notes = read_notes(run)
    return set(Series(run.ranks[0], notes.get(0), run_warmup_end(notes)).step.tolist())


def semantic_mutation(kind: str, rng: random.Random, out: Path) -> tuple[Path, str | tuple[str, ...]]:
    """Damage that leaves a readable input whose answer would change (issue 37): the input, and the
    warning (or any of the warnings) the report must carry for the answer to count as qualified
    rather than silently wrong."""
    if kind == "dup_rank":  # two logs claiming one rank
        d = out / "run"
        shutil.copytree(MONITOR_RUN, d, ignore=shutil.ignore_patterns("README.md"))
        r = rng.choice([0, 1])
        shutil.copy(d / f"rank{r}.jsonl", d / f"rank{'0' * rng.randint(1, 3)}{r}.jsonl")
        return d, "is claimed by"
    if kind in ("foreign_capture", "days_step"):
        runs = sorted(p for p in ZOO.glob("*/bad") if (p / "rank0.capture-profile.json.gz").is_file()
                      and not (p / "rank1.jsonl").exists())  # fmt: skip
        src = rng.choice(runs)
        d = out / "run"
        shutil.copytree(src, d)
        if kind == "foreign_capture":  # the fixed twin's capture, or another scenario's, under this run's name
            other = rng.choice([src.parent / "fixed"] + [p for p in runs if p != src])
            shutil.copy(other / "rank0.capture-profile.json.gz", d / "rank0.capture-profile.json.gz")
            return d, "not a capture of this run"
        lines = (d / "rank0.jsonl").read_text().splitlines()
        counted = _counted_steps(src)  # a step the analysis counts (not warm-up, not a captured step)
        steps = [k for k, ln in enumerate(lines) if '"type":"step"' in ln and json.loads(ln).get("step") in counted]
        k = rng.choice(steps)
        rec = json.loads(lines[k])
        rec["wall_s"] = rng.choice([1e5, 6.9 * 86400, 1e7])
        lines[k] = json.dumps(rec)
        (d / "rank0.jsonl").write_text("\n".join(lines) + "\n")
        # a step over a week is a damaged record to the reader: either warning qualifies the answer
        return d, ("over 1,000x the median step left out", "damaged line")
    if kind in ("stretched_step", "nested_step"):
        doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
        steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        last = max(steps, key=lambda e: e["ts"])
        if kind == "stretched_step":
            last["dur"] = last["dur"] * rng.choice([50, 1000, 10**5])
            want = ("an empty stretch", "times cannot be real")  # 10**5 x leaves the trace's plausible span
        else:
            first = min(steps, key=lambda e: e["ts"])
            doc["traceEvents"].append(dict(first, name=f"ProfilerStep#{rng.randint(100, 10**6)}",
                                           dur=last["ts"] + last["dur"] - first["ts"] + rng.randint(0, 10)))  # fmt: skip
            want = "span the step(s) after them"
        p = out / "trace.json"
        p.write_text(json.dumps(doc))
        return p, want
    n = rng.randint(20, 400)
    if kind == "gpu_only":
        return _synthetic_gpu(n, 0, False, out / "trace.json"), "device activity only"
    return _synthetic_gpu(n, rng.randint(0, (n - 1) // 2), True, out / "trace.json"), "kernels have a launch call"


REQUEST_IDS = ["ok", "", "../../x", "/abs", "a/b", "..", ".", "a" * 300, "\x00", "id\nnext", "🔥", "CON", "x y"]


def _hostile_file(rng: random.Random, p: Path) -> None:
    """A request or peer file as a hostile writer leaves it: JSON of any shape, garbage, or a
    FIFO, a link to /dev/zero or out of the directory, a directory, a huge file."""
    kind = rng.choice(["json", "json", "json", "garbage", "fifo", "zero", "outside", "dir", "huge", "empty"])
    if kind == "json":
        doc = {k: rng.choice(WEIRD + [rng.randint(-5, 10**6), rng.choice(REQUEST_IDS)])
               for k in rng.sample(["id", "steps", "start_after", "reason", "rank", "time", "domains", "wall_s"],
                                   rng.randint(0, 8))}  # fmt: skip
        p.write_text(json.dumps(rng.choice([doc, list(doc.values()), doc.get("id")])))
    elif kind == "garbage":
        p.write_bytes(os.urandom(rng.randint(1, 512)))
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "zero":
        os.symlink("/dev/zero", p)
    elif kind == "outside":
        os.symlink(p.parents[2] / "secret.txt", p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "huge":
        p.write_bytes(b'{"id": "big", "steps": 1, "pad": "' + b"a" * (1 << 20) + b'"}')
    else:
        p.write_bytes(b"")


def requests_case(rng: random.Random, out: Path) -> str | None:
    """A short training loop under the monitor while its capture request and a peer's file are
    replaced by hostile ones between steps; returns what went wrong, None when every step ran and
    nothing was written outside the run directory."""
    from hermes_kb.monitor import Monitor
    from hermes_kb.monitor.capture import REQUEST

    sys.path.insert(0, str(ROOT / "tests"))
    from hostile import FakeProfiler

    run = out / "run"
    (out / "secret.txt").write_text("do not read")
    done = 0
    with Monitor(run, rank=0, profiler_factory=FakeProfiler, poll_s=0.0, sample_every=1, procs_every_s=0,
                 device_events=False, flops=False, peers_every_s=0.0, warmup=2, domains=["dp"]) as mon:  # fmt: skip
        for i in range(rng.randint(8, 24)):
            if i % 3 == 0:
                for target in (run / REQUEST, run / "peers" / "rank1.json"):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if target.is_symlink() or target.is_file():
                        target.unlink()
                    elif target.is_dir():
                        shutil.rmtree(target)
                    elif target.exists():  # a FIFO
                        target.unlink()
                    _hostile_file(rng, target)
            mon.step()
            done += 1
    outside = [p for p in out.rglob("*") if not (p == out / "secret.txt" or run in p.parents or p == run)]
    if outside:
        return f"wrote outside the run directory: {outside[:3]}"
    return None if done else "no step ran"


RULE_TEMPLATE = (ROOT / "tests" / "test_kb.py").read_text().split('RULE = """\\\n', 1)[1].split('"""', 1)[0]


def kb_mutation(rng: random.Random, out: Path, marker: Path) -> tuple[str, Path, Path | None]:
    """('kb', rules dir, cases dir) or ('config', config file, None)."""
    rules, cases = out / "rules", out / "cases"
    rules.mkdir()
    cases.mkdir()
    kind = rng.choice(["mutate", "mutate", "mutate", "laughs", "python_tag", "template", "template", "operator", "utf8",
                       "identical", "config", "config", "file", "deep"])  # fmt: skip
    src = rng.choice(kb_sources())
    is_case = src.parent.name != "rules"
    dst = (cases / src.parent.name / src.name) if is_case else (rules / src.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    text = src.read_text()
    if kind == "mutate":
        import yaml

        doc = yaml.safe_load(text)
        doc = _retype_json(doc, rng)
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    elif kind == "laughs":
        n = rng.choice([6, 9, 12])
        laughs = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
            f"l{i}: &l{i} [{', '.join(['*l' + str(i - 1)] * 9)}]\n" for i in range(1, n))
        text = laughs + text.replace("\ntitle:", f"\nx_laughs: *l{n - 1}\ntitle:", 1) if rng.random() < 0.5 else \
            text.rstrip("\n") + f"\nlaughs: [*l{n - 1}]\n" + laughs  # fmt: skip
    elif kind == "python_tag":
        payload = rng.choice([f"!!python/object/apply:os.system ['touch {marker}']",
                              f"!!python/object/new:subprocess.check_output [['touch', '{marker}']]",
                              f"!!python/name:os.system", "!!binary aGVsbG8="])  # fmt: skip
        text = text.replace("\ntitle: ", f"\ntitle: {payload}\nx_title: ", 1)
    elif kind == "template":
        payload = rng.choice([
            f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}",
            "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            f"{{{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}",
            "{{ range(10**8) | list }}", "{{ 10 ** 10 ** 8 }}", "{{ 'x' * 1000000000 }}", '{{ "%0999999999d" | format(1) }}',
            "{% for i in range(100000000) %}x{% endfor %}", "{{ lipsum(10**6) }}", "{{ 'x' | center(10**9) }}",
            "{% set x = 1 %}{{ x }}", "{{ namespace() }}", "{{ config }}", "{{ request }}",
            "{{ (p.x | default('a')) * 100000000 }}", "{{ dict(a=1).items() }}", "{% include '/etc/passwd' %}",
        ])  # fmt: skip
        if not is_case:
            src = rng.choice([p for p in kb_sources() if p.parent.name != "rules"])
            dst = cases / src.parent.name / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
        start = text.index("\nexplanation:") + 1
        end = text.index("\n", start)
        while text[end + 1:end + 3] == "  ":
            end = text.index("\n", end + 1)
        text = text[:start] + "explanation: " + json.dumps(payload) + text[end:]
    elif kind == "operator":
        text = RULE_TEMPLATE.replace('op: ">=", param: th', "op: " + rng.choice(['"==", value: {"$gte": 0}',
                                     '"in", value: [{"$ne": 1}]', '">", value: "$x"', '">", value: .nan', '"==", value: [[1]]']))  # fmt: skip
        dst = rules / "op.yaml"
    elif kind == "utf8":
        b = text.encode()
        k = rng.randrange(len(b))
        dst.write_bytes(b[:k] + rng.choice([b"\xff", b"\xc3\x28", b"\xe9"]) + b[k:])
        text = None
    elif kind == "identical":
        (rules / "a.yaml").write_text(RULE_TEMPLATE)
        text = RULE_TEMPLATE.replace("R-TST-001", "R-TST-002")
        dst = rules / "b.yaml"
    elif kind == "deep":
        text = text.rstrip("\n") + "\nx: " + "[" * 3000 + "]" * 3000 + "\n"
    elif kind == "file":
        how = rng.choice(["dir", "dangling", "fifo", "big", "empty"])
        dst = rules / "weird.yaml"
        if how == "dir":
            dst.mkdir()
        elif how == "dangling":
            os.symlink(out / "nowhere.yaml", dst)
        elif how == "fifo":
            os.mkfifo(dst)
        elif how == "big":
            dst.write_text("x: '" + "y" * (2 << 20) + "'\n")
        else:
            dst.write_text("")
        text = None
    elif kind == "config":
        from hermes_kb.kb.loader import load_kb

        cfg = out / "thresholds.yaml"
        ids = ["R-IO-001", "C-IO-001", "R-STEP-001", "C-CPU-002", "C-NOPE-999", "R-IO-01"]
        body = rng.choice([
            "{i}: {{{p}: {v}}}\n", "{i}: [1, 2]\n", "{i}: {{{p}: {{a: 1}}}}\n", "{i}:\n  {p}: &a [*a]\n", "- {i}\n",
            "{i}: {{no_such: 1}}\n", "l0: &l0 [a,a,a,a,a,a,a,a,a,a]\nl1: &l1 [*l0,*l0,*l0,*l0,*l0,*l0,*l0,*l0,*l0,*l0]\n"
            "l2: &l2 [*l1,*l1,*l1,*l1,*l1,*l1,*l1,*l1,*l1,*l1]\nl3: &l3 [*l2,*l2,*l2,*l2,*l2,*l2,*l2,*l2,*l2,*l2]\n"
            "l4: &l4 [*l3,*l3,*l3,*l3,*l3,*l3,*l3,*l3,*l3,*l3]\nl5: [*l4,*l4,*l4,*l4,*l4,*l4,*l4,*l4,*l4,*l4]\n",
            f"{{i}}: !!python/object/apply:os.system ['touch {marker}']\n", "{i}: {{{p}: '{v}'}}\n",
        ])  # fmt: skip
        params = {"R-IO-001": None}
        i = rng.choice(ids)
        kb = _full_kb()
        entry = kb.by_id(i)
        p = rng.choice(list(entry.item.parameters) or ["x"]) if entry else "x"
        v = rng.choice(["0.5", "high", ".nan", ".inf", "-1", "true", "1e999", "[1]", "null"])
        cfg.write_text(body.format(i=i, p=p, v=v))
        del params, load_kb
        return "config", cfg, None
    if text is not None:
        dst.write_text(text)
    return "kb", rules, cases


_KB = None
_FACTS: dict = {}


def _full_kb():
    global _KB
    if _KB is None:
        from hermes_kb.kb.loader import load_kb

        _KB = load_kb()
    return _KB


def _example_facts():
    if not _FACTS:
        from hermes_kb.analysis.run import analyze_with_replay
        from hermes_kb.trace import load

        bundle = load(str(EXAMPLE))
        _FACTS["bundle"] = bundle
        _FACTS["facts"] = analyze_with_replay(bundle)[0]
    return _FACTS["bundle"], _FACTS["facts"]


# ---- running one case (in the worker) ---------------------------------------------------------


def run_case(case: dict) -> dict:
    import hermes_kb

    rng = random.Random(case["seed"])
    work = Path(tempfile.mkdtemp(prefix=f"fz{case['id']}_", dir=case["tmp"]))
    marker = work / "PWNED"
    res = {"id": case["id"], "category": case["category"], "kind": case["kind"], "source": case.get("source", "")}
    try:
        ref = None
        if case["category"] == "kineto":
            if case["kind"] == "generated":
                target = generated_trace(case["events"], work / "generated.json")
            else:
                target, ref = kineto_mutation(Path(case["source"]), case["kind"], rng, work / "trace.json")
            call = lambda p: hermes_kb.advise(str(p))  # noqa: E731
        elif case["category"] == "ascend":
            target = ascend_mutation(Path(case["source"]), rng, work)
            call = lambda p: hermes_kb.advise(str(p))  # noqa: E731
        elif case["category"] == "monitor":
            target, ref = monitor_mutation(rng, work)
            call = lambda p: hermes_kb.advise(str(p))  # noqa: E731
        elif case["category"] == "semantic":
            target, want = semantic_mutation(case["kind"], rng, work)
            call = lambda p: hermes_kb.advise(str(p))  # noqa: E731
        elif case["category"] == "requests":  # the monitor inside training: it must never raise or block
            target, call = work, lambda p: requests_case(rng, p)  # noqa: E731
        else:
            what, target, cases = kb_mutation(rng, work, marker)
            call = _kb_call(what, cases)
        try:
            report = call(target)
        except BaseException as exc:  # noqa: BLE001 - classified
            if case["category"] == "requests":  # the monitor may never raise into the training loop
                res["outcome"], res["detail"] = "crash", f"{type(exc).__name__}: {exc}"[:400]
            else:
                res["outcome"], res["detail"] = classify_error(exc, str(work))
        else:
            if case["category"] == "requests":
                bad, report = ([report] if report else []), None
            else:
                bad = report_problems(report) if report is not None else []
            wants = () if case["category"] != "semantic" else (want,) if isinstance(want, str) else want
            if not bad and wants and not any(x in w for x in wants for w in report.warnings):
                bad = [f"silent: the damage changed the input and no warning says {' or '.join(map(repr, wants))}"]
            if bad:
                res["outcome"], res["detail"] = "wrong_success", "; ".join(bad[:3])
            elif ref is not None:
                want = answer(call(ref))
                got = answer(report)
                if got != want:
                    res["outcome"], res["detail"] = "wrong_success", f"damage changed the answer: {got} != {want}"
                else:
                    res["outcome"], res["detail"] = "success", "same answer as without the damage"
            else:
                res["outcome"], res["detail"] = "success", ""
        if marker.exists():
            res["outcome"], res["detail"] = "code_execution", "the payload's marker file was written"
    except BaseException as exc:  # noqa: BLE001 - a bug of the harness itself is reported as such
        res["outcome"], res["detail"] = "harness_error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-800:]}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


def _kb_call(what: str, cases: Path | None):
    def call(target: Path):
        import hermes_kb.advisor.run as adv
        from hermes_kb.kb.loader import load_kb, load_overrides

        if what == "config":
            kb = load_kb(overrides=load_overrides(target))
        else:
            kb = load_kb(target, cases)
        bundle, facts = _example_facts()
        saved = adv.knowledge_base
        adv.knowledge_base = lambda config=None: kb
        try:
            return adv.advise_bundle(bundle, facts=facts)
        finally:
            adv.knowledge_base = saved

    return call


# ---- the pool ---------------------------------------------------------------------------------


def _worker(conn) -> None:
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        conn.send(run_case(case))


class Pool:
    """Worker processes forked from this one; a worker past the timeout is killed (a hang) and
    one that dies is a crash; either is replaced."""

    def __init__(self, n: int, timeout: float):
        self.n, self.timeout = n, timeout
        self.ctx = mp.get_context("fork")
        self.workers: list[list] = [self._start() for _ in range(n)]  # [process, conn, case, started]

    def _start(self) -> list:
        a, b = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(b,), daemon=False)
        p.start()
        b.close()
        return [p, a, None, 0.0]

    def run(self, cases, on_result, deadline: float | None = None) -> None:
        it = iter(cases)
        pending = True
        while True:
            for w in self.workers:
                if w[2] is None and pending and (deadline is None or time.time() < deadline):
                    case = next(it, None)
                    if case is None:
                        pending = False
                        continue
                    w[1].send(case)
                    w[2], w[3] = case, time.time()
            busy = [w for w in self.workers if w[2] is not None]
            if not busy:
                return
            ready = wait([w[1] for w in busy] + [w[0].sentinel for w in busy], timeout=1.0)
            now = time.time()
            for k, w in enumerate(self.workers):
                if w[2] is None:
                    continue
                if w[1] in ready:
                    try:
                        on_result(w[1].recv())
                        w[2] = None
                        continue
                    except (EOFError, OSError):
                        pass
                if w[1] in ready or w[0].sentinel in ready or not w[0].is_alive():
                    on_result({**_base(w[2]), "outcome": "crash", "detail": f"worker died (exit {w[0].exitcode})"})
                    self._replace(k)
                elif now - w[3] > self.timeout:
                    on_result({**_base(w[2]), "outcome": "hang", "detail": f"no answer in {self.timeout:.0f} s"})
                    self._replace(k)

    def _replace(self, k: int) -> None:
        p, conn = self.workers[k][0], self.workers[k][1]
        if p.is_alive():
            p.kill()
        p.join()
        conn.close()
        self.workers[k] = self._start()

    def close(self) -> None:
        for p, conn, _, _ in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, conn, _, _ in self.workers:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def _base(case: dict) -> dict:
    return {k: case.get(k, "") for k in ("id", "category", "kind", "source")}


# ---- making the cases (in the parent) ---------------------------------------------------------


def generated_event_lists(n: int, seed: int) -> list[list[dict]]:
    """``n`` Kineto event lists drawn by hypothesis (tests/fuzz_strategies.py), reproducibly."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fuzz_strategies import collect_event_lists

    return collect_event_lists(n, seed)


def make_cases(seed: int, counts: dict[str, int], tmp: str) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    k_src, a_src = kineto_sources(), ascend_sources()
    n_gen = counts.get("kineto", 0) // 6
    gen = generated_event_lists(n_gen, seed) if n_gen else []
    for cat in CATEGORIES:
        for j in range(counts.get(cat, 0)):
            case = {"id": len(out), "category": cat, "seed": rng.randrange(2**32), "tmp": tmp}
            if cat == "kineto":
                if j < len(gen):
                    case.update(kind="generated", events=gen[j], source="hypothesis")
                else:
                    case.update(kind=rng.choice(KINETO_KINDS), source=str(rng.choice(k_src)))
            elif cat == "ascend":
                if not a_src:
                    continue
                case.update(kind="damaged_file", source=str(rng.choice(a_src)))
            elif cat == "monitor":
                case.update(kind="damaged_run", source=str(MONITOR_RUN))
            elif cat == "semantic":
                case.update(kind=SEMANTIC_KINDS[j % len(SEMANTIC_KINDS)], source="semantic")
            elif cat == "requests":
                case.update(kind="hostile_writer", source="monitor")
            else:
                case.update(kind="hostile_kb", source="kb")
            out.append(case)
    rng.shuffle(out)
    return out


def summarize(results: list[dict]) -> dict:
    table: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        table[r["category"]][r["outcome"]] += 1
        table["all"][r["outcome"]] += 1
    return {cat: {o: table[cat][o] for o in (*OUTCOMES, "harness_error")} | {"inputs": sum(table[cat].values())}
            for cat in (*CATEGORIES, "all") if cat in table}  # fmt: skip


def print_table(summary: dict, elapsed: float) -> None:
    cols = ("inputs", "clean_error", "success", "wrong_success", "crash", "hang", "code_execution")
    print(f"{'category':10}" + "".join(f"{c:>15}" for c in cols))
    for cat, row in summary.items():
        print(f"{cat:10}" + "".join(f"{row.get(c, 0):>15,}" for c in cols))
    print(f"({elapsed:,.0f} s)")


def fuzz(counts: dict[str, int], *, seed: int = 18, workers: int = 2, timeout: float = 60.0,
         minutes: float | None = None, verbose: bool = False) -> tuple[dict, list[dict]]:  # fmt: skip
    """Run the cases; returns (summary per category, every failure's record)."""
    import hermes_kb  # noqa: F401 - imported before forking, so every worker starts warm
    from hermes_kb.kb.loader import load_kb

    load_kb()
    _example_facts()
    tmp = tempfile.mkdtemp(prefix="hermes_fuzz_")
    results: list[dict] = []
    failures: list[dict] = []
    deadline = time.time() + minutes * 60 if minutes else None

    def on_result(r: dict) -> None:
        results.append(r)
        if r["outcome"] not in ("success", "clean_error"):
            failures.append(r)
            if verbose:
                print(f"[{r['outcome']}] {r['category']}/{r['kind']} {r['source']}: {r['detail'][:400]}", flush=True)
        if verbose and len(results) % 250 == 0:
            print(f"... {len(results)} inputs", flush=True)

    pool = Pool(workers, timeout)
    try:
        pool.run(make_cases(seed, counts, tmp), on_result, deadline)
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return summarize(results), failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="stop making new inputs after this long")
    ap.add_argument("--count", type=int, default=None, help="inputs in all (default: as many as fit in --minutes)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before an input counts as a hang")
    ap.add_argument("--category", nargs="*", default=list(CATEGORIES), choices=CATEGORIES)
    ap.add_argument("--json", type=Path, default=None, help="write the summary and every failure here")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    total = a.count or int(a.minutes * 60 * 12 * a.workers)  # more than fit: --minutes stops it
    share = {"kineto": 0.28, "ascend": 0.1, "monitor": 0.18, "kb": 0.18, "semantic": 0.16, "requests": 0.1}
    counts = {c: max(1, int(total * share[c])) for c in a.category}
    t = time.time()
    summary, failures = fuzz(counts, seed=a.seed, workers=a.workers, timeout=a.timeout,
                             minutes=None if a.count else a.minutes, verbose=a.verbose)  # fmt: skip
    print_table(summary, time.time() - t)
    if a.json:
        a.json.write_text(json.dumps({"seed": a.seed, "summary": summary, "failures": failures}, indent=1))
    bad = sum(summary.get("all", {}).get(o, 0) for o in ("wrong_success", "crash", "hang", "code_execution", "harness_error"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
