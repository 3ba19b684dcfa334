"""Loader speed and memory, as ratios against references measured in the same run.

    python benchmarks/bench_load.py [TRACE.json.gz] [--repeat 5] [--hta-python /path/to/python]

Prints (and with --json writes) for one trace:
  - hermes_kb.load(path) vs orjson.loads(gzip.decompress(bytes)) of the same file (both from
    the compressed bytes on disk; ratio <= 1.0 means hermes builds its frames faster than
    orjson alone builds Python dicts);
  - peak RSS of a fresh process loading the trace, against the uncompressed JSON size;
  - 8 ranks (the same file linked 8 times) against 1 rank, with the machine's cores;
  - HolisticTraceAnalysis building TraceAnalysis on the same file, when --hta-python names a
    Python that has HTA installed (it needs its own environment).
Machines here are shared and noisy: runs are interleaved and medians reported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared/data/hta/df_index_resolver/df_index_resolver.json.gz"

# ru_maxrss is inherited across fork+exec, so the child reads its own high-water mark (VmHWM)
# after resetting it through /proc/self/clear_refs.
_RSS_CHILD = r"""
import sys, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
import hermes_kb
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
t = time.perf_counter()
b = hermes_kb.load(sys.argv[1])
el = time.perf_counter() - t
print(base, status("VmHWM"), el)
"""

_HTA_CHILD = r"""
import sys, time, logging
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
t = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
el = time.perf_counter() - t
print(base, status("VmHWM"), el)
"""


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_decode(path: Path, repeat: int) -> dict:
    import orjson

    import hermes_kb

    data = path.read_bytes()
    hermes_kb.load(path)  # warm imports and the page cache
    t_orjson, t_hermes = [], []
    for _ in range(repeat):
        t_orjson.append(_time(lambda: orjson.loads(gzip.decompress(data))))
        t_hermes.append(_time(lambda: hermes_kb.load(path)))
    o, h = statistics.median(t_orjson), statistics.median(t_hermes)
    return {"orjson_s": o, "hermes_s": h, "ratio_hermes_over_orjson": h / o, "json_bytes": len(gzip.decompress(data))}


def bench_rss(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True, text=True, check=True)
    base, peak, el = out.stdout.split()
    return {"rss_after_imports": int(base), "rss_peak": int(peak), "rss_growth": int(peak) - int(base)}


def bench_ranks(path: Path, n: int = 8) -> dict:
    import hermes_kb

    with tempfile.TemporaryDirectory() as tmp:
        for r in range(n):
            os.symlink(path, Path(tmp) / f"rank{r}.json.gz")
        # one rank in one process (a lone big file would otherwise use the second core too)
        os.environ["HERMES_NO_SPLIT"] = "1"
        try:
            one = min(_time(lambda: hermes_kb.load(Path(tmp) / "rank0.json.gz")) for _ in range(2))
        finally:
            del os.environ["HERMES_NO_SPLIT"]
        many = min(_time(lambda: hermes_kb.load(tmp)) for _ in range(2))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"one_rank_s": one, f"{n}_ranks_s": many, "ratio": many / one, "cores": cores}


def bench_hta(path: Path, hta_python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(path, Path(tmp) / path.name)
        runs = []
        for _ in range(2):
            out = subprocess.run([hta_python, "-c", _HTA_CHILD, tmp], capture_output=True, text=True)
            if out.returncode != 0:
                return {"error": out.stderr.strip().splitlines()[-1:]}
            runs.append(out.stdout.split())
    base, peak, _ = runs[-1]
    return {"hta_s": min(float(r[2]) for r in runs), "hta_rss_peak": int(peak), "hta_rss_growth": int(peak) - int(base)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hta-python", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--skip-ranks", action="store_true")
    args = ap.parse_args()
    path = Path(args.trace)
    res: dict = {"trace": str(path), "python": sys.version.split()[0]}
    res["decode"] = bench_decode(path, args.repeat)
    res["memory"] = bench_rss(path)
    res["memory"]["peak_over_json"] = res["memory"]["rss_peak"] / res["decode"]["json_bytes"]
    res["memory"]["growth_over_json"] = res["memory"]["rss_growth"] / res["decode"]["json_bytes"]
    if not args.skip_ranks:
        res["ranks"] = bench_ranks(path)
    if args.hta_python:
        res["hta"] = bench_hta(path, args.hta_python)
        if "hta_s" in res["hta"]:
            res["hta"]["speedup_hermes_vs_hta"] = res["hta"]["hta_s"] / res["decode"]["hermes_s"]
    d, m = res["decode"], res["memory"]
    mb = 1 << 20
    print(f"trace: {path.name}  ({d['json_bytes'] / mb:.1f} MB JSON)")
    print(f"orjson.loads(gzip.decompress): {d['orjson_s']:.3f} s   hermes_kb.load: {d['hermes_s']:.3f} s   "
          f"ratio {d['ratio_hermes_over_orjson']:.2f} (target <= 1.0, aim 0.5)")  # fmt: skip
    print(f"peak RSS {m['rss_peak'] / mb:.0f} MB = {m['peak_over_json']:.2f}x JSON size; "
          f"growth over imports {m['rss_growth'] / mb:.0f} MB = {m['growth_over_json']:.2f}x (target <= 2x)")  # fmt: skip
    if "ranks" in res:
        r = res["ranks"]
        print(f"1 rank {r['one_rank_s']:.2f} s, 8 ranks {r['8_ranks_s']:.2f} s: {r['ratio']:.1f}x on {r['cores']} cores "
              "(target about 4x on 2 cores)")  # fmt: skip
    if "hta" in res:
        h = res["hta"]
        if "hta_s" in h:
            print(f"HTA TraceAnalysis {h['hta_s']:.2f} s, peak RSS {h['hta_rss_peak'] / mb:.0f} MB: hermes is "
                  f"{h['speedup_hermes_vs_hta']:.1f}x faster (target >= 5x)")  # fmt: skip
        else:
            print(f"HTA failed: {h['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
