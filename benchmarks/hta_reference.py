#!/usr/bin/env python3
"""Produce reference numbers from Meta's HolisticTraceAnalysis (HTA) 0.5.0.

Run with the python of a venv that has ``HolisticTraceAnalysis==0.5.0``
installed (HTA does not need torch)::

    python3 -m venv /tmp/htavenv
    /tmp/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/htavenv/bin/python benchmarks/hta_reference.py            # -> tests/data/hta_reference.json
    /tmp/htavenv/bin/python benchmarks/hta_reference.py --time     # timing + peak RSS on df_index_resolver

The traces are read from ``--data-root`` (default /work/shared/data); nothing
from there is copied into the repository, only derived numbers are written.

Modes
-----
default   For every trace directory in TRACE_DIRS build ``TraceAnalysis`` and
          record temporal breakdown, comm/comp overlap, idle-time breakdown
          and GPU kernel breakdown. Every call is wrapped in try/except; an
          error is recorded as ``{"error": "..."}``. Output: JSON file.
--time    Build ``TraceAnalysis`` for df_index_resolver in N (default 3)
          fresh child processes; each child reports the construction wall time
          and its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``).
          Prints the medians and, if the JSON output exists, stores them in it
          under "benchmark".
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA_ROOT = "/work/shared/data"
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "hta_reference.json")

# Relative to the data root. Each holds the trace file(s) of one job.
TRACE_DIRS = [
    "hta/df_index_resolver",
    "hta/nccl_parser_config",
    "hta/ns_resolution_trace",
    "hta/trace_diff/control",
    "hta/trace_diff/test",
    "hta/negative_queue_length_values_check",
    "hta/critical_path/alexnet",
    "hta/trace_filter",  # 2 ranks
]
TIMING_DIR = "hta/df_index_resolver"

HOW_MADE = (
    "benchmarks/hta_reference.py run with HolisticTraceAnalysis==0.5.0 (pip, no torch). "
    "Per trace dir: TraceAnalysis(trace_dir=<temp dir of symlinks to the dir's *.json.gz>) "
    "with defaults (include_last_profiler_step=False, JSON parser backend, ns rounding on); "
    "get_temporal_breakdown(visualize=False); get_comm_comp_overlap(visualize=False); "
    "get_idle_time_breakdown(ranks=<all ranks>, visualize=False, show_idle_interval_stats=True, "
    "consecutive_kernel_delay=30 [HTA default]); get_gpu_kernel_breakdown(visualize=False) "
    "[include_memory_kernels=True default]. Traces with fractional timestamps are also run with "
    "HTA_DISABLE_NS_ROUNDING=1 (key ns_rounding_disabled). Times are trace units (us). NaN -> null. "
    "See docs/hta_definitions.md."
)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _num(v: Any) -> Any:
    """Convert numpy / pandas scalars to JSON friendly python values."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if v is None:
        return None
    if isinstance(v, bool):
        return v
    if np is not None and isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, str):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f) or math.isinf(f):
        return None
    return f


ID_COLUMNS = {"rank", "stream"}


def _records(df, id_columns=ID_COLUMNS) -> List[Dict[str, Any]]:
    """DataFrame -> list of dicts. Identifier columns as int, measures as float."""
    out = []
    for row in df.to_dict("records"):
        rec = {}
        for k, v in row.items():
            if k in id_columns and v is not None:
                try:
                    rec[str(k)] = int(v)
                    continue
                except (TypeError, ValueError):
                    pass
            rec[str(k)] = _num(v)
        out.append(rec)
    return out


def _err(e: BaseException) -> Dict[str, str]:
    return {"error": f"{type(e).__name__}: {e}"}


def _quiet_hta() -> None:
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        from hta.configs.config import logger

        logger.setLevel(logging.ERROR)
    except Exception:
        pass
    warnings.filterwarnings("ignore")


def _make_trace_dir(src: str, tmp_root: str) -> str:
    """HTA wants a directory that contains only trace files: build one of symlinks."""
    dst = tempfile.mkdtemp(prefix="hta_", dir=tmp_root)
    for fn in sorted(os.listdir(src)):
        p = os.path.join(src, fn)
        if os.path.isfile(p) and (fn.endswith(".json.gz") or fn.endswith(".json")):
            os.symlink(os.path.abspath(p), os.path.join(dst, fn))
    return dst


_FLOAT_TS_RE = re.compile(rb'"ts"\s*:\s*-?\d+\.\d')


def _has_float_timestamps(trace_dir: str) -> bool:
    """True if any trace file in trace_dir has fractional (ns resolution) timestamps."""
    for fn in os.listdir(trace_dir):
        p = os.path.join(trace_dir, fn)
        opener = gzip.open if fn.endswith(".gz") else open
        with opener(p, "rb") as fh:
            if _FLOAT_TS_RE.search(fh.read(4 << 20)):
                return True
    return False


def _hta_version() -> str:
    try:
        from importlib.metadata import version

        return version("HolisticTraceAnalysis")
    except Exception:
        import hta.version as hv

        return ".".join(str(x) for x in hv.__version_tuple__)


# --------------------------------------------------------------------------
# reference numbers
# --------------------------------------------------------------------------
def analyse_dir(trace_dir: str) -> Dict[str, Any]:
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type, KernelType

    res: Dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        analyzer = TraceAnalysis(trace_dir=trace_dir)
    except Exception as e:  # noqa: BLE001
        res["trace_analysis"] = _err(e)
        return res
    construct_s = time.perf_counter() - t0
    t = analyzer.t
    ranks = sorted(int(r) for r in t.traces.keys())
    sym_table = t.symbol_table.get_sym_table()
    sym_id = t.symbol_table.get_sym_id_map()

    # ---- what HTA kept (helps to reproduce the event selection) -----------
    info: Dict[str, Any] = {"ranks": ranks, "construct_seconds": round(construct_s, 2)}
    per_rank = {}
    for r in ranks:
        df = t.traces[r]
        gpu = df[df["stream"].ne(-1)]
        cats: Dict[str, int] = {}
        for cid, n in gpu["cat"].value_counts().items():
            cats[sym_table[int(cid)]] = int(n)
        steps = sorted(
            sym_table[int(n)]
            for n in df["name"].unique()
            if sym_table[int(n)].startswith("ProfilerStep")
        )
        per_rank[str(r)] = {
            "n_gpu_rows": int(len(gpu)),  # rows with stream != -1 used by temporal/overlap
            "n_gpu_unique_index": int(gpu["index"].nunique()),
            "gpu_rows_by_cat": cats,
            "n_streams": int(gpu["stream"].nunique()),
            "gpu_first_ts_aligned": _num(gpu["ts"].min()) if len(gpu) else None,
            "gpu_last_end_aligned": _num((gpu["ts"] + gpu["dur"]).max()) if len(gpu) else None,
            "profiler_steps_seen_on_cpu": steps,
        }
    info["per_rank"] = per_rank
    info["n_profiler_step_symbols"] = sum(1 for k in sym_id if "ProfilerStep" in k)
    res["trace_info"] = info

    # ---- temporal breakdown ---------------------------------------------
    try:
        tb = analyzer.get_temporal_breakdown(visualize=False)
        res["temporal_breakdown"] = _records(tb)
    except Exception as e:  # noqa: BLE001
        res["temporal_breakdown"] = _err(e)

    # ---- comm / comp overlap --------------------------------------------
    try:
        ov = analyzer.get_comm_comp_overlap(visualize=False)
        res["comm_comp_overlap"] = _records(ov)
    except Exception as e:  # noqa: BLE001
        res["comm_comp_overlap"] = _err(e)

    # ---- idle time breakdown (all ranks; HTA default is ranks=[0]) --------
    try:
        idle_df, stats_df = analyzer.get_idle_time_breakdown(
            ranks=ranks, visualize=False, show_idle_interval_stats=True
        )
        res["idle_time_breakdown"] = _records(idle_df)
        if stats_df is not None:
            stats_df = stats_df.reset_index().rename(columns={"index": "idle_category"})
            wanted = ["rank", "stream", "idle_category", "count", "mean", "min", "50%", "max"]
            keep = [c for c in wanted if c in stats_df.columns]
            res["idle_interval_stats"] = _records(stats_df[keep])
    except Exception as e:  # noqa: BLE001
        res["idle_time_breakdown"] = _err(e)

    # ---- GPU kernel breakdown --------------------------------------------
    try:
        kt_df, all_df = analyzer.get_gpu_kernel_breakdown(visualize=False)
        # kernel_type_df: union time per kernel-type combination, summed over ranks
        res["gpu_kernel_breakdown_by_type"] = _records(kt_df)
        # plain sum of event durations per (rank, kernel_type)
        sums = (
            all_df.groupby(["rank", "kernel_type"])["sum (us)"].sum().reset_index()
            .rename(columns={"sum (us)": "sum_dur_us"})
        )
        res["gpu_kernel_dur_sum_by_rank_type"] = _records(sums)
    except Exception as e:  # noqa: BLE001
        res["gpu_kernel_breakdown_by_type"] = _err(e)

    # Per-rank version of the kernel-type union times (HTA only reports the
    # sum over ranks; this calls the same private helper rank by rank).
    try:
        types = [KernelType.COMPUTATION.name, KernelType.COMMUNICATION.name, KernelType.MEMORY.name]
        rows = []
        for r in ranks:
            df = t.traces[r]
            g = df[df["stream"].ne(-1)].copy()
            g["kernel_type"] = g["name"].map(lambda x: get_kernel_type(sym_table[x]))
            kt = BreakdownAnalysis._get_gpu_kernel_type_time(g, types)
            for rec in _records(kt):
                rec = {"rank": r, **rec}
                rows.append(rec)
        res["gpu_kernel_type_time_per_rank"] = rows
    except Exception as e:  # noqa: BLE001
        res["gpu_kernel_type_time_per_rank"] = _err(e)

    return res


def make_reference(data_root: str, out_path: str, only: Optional[List[str]] = None) -> Dict[str, Any]:
    _quiet_hta()
    result: Dict[str, Any] = {"hta_version": _hta_version(), "how_made": HOW_MADE}
    if os.path.exists(out_path):
        try:
            with open(out_path) as fh:
                old = json.load(fh)
            if "benchmark" in old:
                result["benchmark"] = old["benchmark"]
            if only:
                for k, v in old.items():
                    if k.startswith("hta/"):
                        result[k] = v
        except Exception:
            pass
    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp_root:
        for rel in TRACE_DIRS:
            if only and rel not in only:
                continue
            src = os.path.join(data_root, rel)
            t0 = time.perf_counter()
            if not os.path.isdir(src):
                result[rel] = {"trace_analysis": {"error": f"missing directory {src}"}}
                continue
            print(f"[hta_reference] {rel} ...", file=sys.stderr, flush=True)
            tdir = _make_trace_dir(src, tmp_root)
            result[rel] = analyse_dir(tdir)
            if _has_float_timestamps(tdir):
                # HTA rounds float (ns-resolution) timestamps by default: ts -> ceil(ts),
                # end -> floor(ts + dur). Also record the unrounded variant.
                os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
                try:
                    alt = analyse_dir(tdir)
                finally:
                    del os.environ["HTA_DISABLE_NS_ROUNDING"]
                result[rel]["ns_rounding_disabled"] = {
                    k: alt[k]
                    for k in ("temporal_breakdown", "comm_comp_overlap", "idle_time_breakdown")
                    if k in alt
                }
            dt = time.perf_counter() - t0
            print(f"[hta_reference] {rel} done in {dt:.1f}s", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=False)
        fh.write("\n")
    print(f"[hta_reference] wrote {out_path} ({os.path.getsize(out_path)} bytes)", file=sys.stderr)
    return result


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------
def _child_construct(trace_dir: str) -> None:
    """Runs in a fresh process: import HTA, build TraceAnalysis, report."""
    _quiet_hta()
    import hta.trace_analysis  # noqa: F401  (import cost outside the timed region)

    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    hta.trace_analysis.TraceAnalysis(trace_dir=trace_dir)
    wall = time.perf_counter() - t0
    ru_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(
        json.dumps(
            {
                "construct_wall_s": wall,
                "peak_rss_kb": ru_self,
                "peak_rss_after_import_kb": rss_before_kb,
                "peak_rss_children_kb": ru_children,
            }
        )
    )


def run_timing(data_root: str, out_path: str, runs: int) -> Dict[str, Any]:
    src = os.path.join(data_root, TIMING_DIR)
    samples = []
    with tempfile.TemporaryDirectory(prefix="hta_time_") as tmp_root:
        d = _make_trace_dir(src, tmp_root)
        for i in range(runs):
            t0 = time.perf_counter()
            cp = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child-construct", d],
                capture_output=True,
                text=True,
                check=True,
            )
            proc_wall = time.perf_counter() - t0
            rec = json.loads(cp.stdout.strip().splitlines()[-1])
            rec["process_wall_s"] = proc_wall
            samples.append(rec)
            print(
                f"[hta_reference] run {i + 1}/{runs}: construct {rec['construct_wall_s']:.2f}s, "
                f"process {proc_wall:.2f}s, peak RSS {rec['peak_rss_kb'] / 1024:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
    bench = {
        "trace": TIMING_DIR,
        "what": "TraceAnalysis(trace_dir=...) construction in a fresh child process (imports excluded from "
        "construct_wall_s, included in process_wall_s); peak RSS = ru_maxrss of that child",
        "runs": runs,
        "construct_wall_s_median": statistics.median(s["construct_wall_s"] for s in samples),
        "process_wall_s_median": statistics.median(s["process_wall_s"] for s in samples),
        "peak_rss_mib_median": statistics.median(s["peak_rss_kb"] for s in samples) / 1024.0,
        "peak_rss_after_import_mib_median": statistics.median(s["peak_rss_after_import_kb"] for s in samples)
        / 1024.0,
        "samples": samples,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}",
        "hta_version": _hta_version(),
    }
    print(
        f"HTA {bench['hta_version']} on {TIMING_DIR}: TraceAnalysis construction median "
        f"{bench['construct_wall_s_median']:.2f} s "
        f"(process incl. imports {bench['process_wall_s_median']:.2f} s), "
        f"peak RSS median {bench['peak_rss_mib_median']:.0f} MiB "
        f"(after imports {bench['peak_rss_after_import_mib_median']:.0f} MiB), {runs} runs"
    )
    if os.path.exists(out_path):
        with open(out_path) as fh:
            data = json.load(fh)
        data["benchmark"] = {k: v for k, v in bench.items() if k != "samples"}
        with open(out_path, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        print(f"[hta_reference] stored benchmark in {out_path}", file=sys.stderr)
    return bench


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument(
        "--time", action="store_true", help="time TraceAnalysis construction on df_index_resolver"
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--only", action="append", help="only this trace dir (repeatable), keeps the others from --out"
    )
    ap.add_argument("--child-construct", metavar="DIR", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child_construct:
        _child_construct(a.child_construct)
        return 0
    if a.time:
        run_timing(a.data_root, a.out, a.runs)
        return 0
    make_reference(a.data_root, a.out, a.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
