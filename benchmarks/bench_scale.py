"""Cost against rank count: `hermes advise` on jobs of 8 to 2,048 ranks built from real traces.

    python benchmarks/bench_scale.py [--sizes 8 64 512 2048] [--modes local dask] [--workers 2]
                                     [--json out.json] [--keep DIR]

A job of N ranks is built from the 8 real DLRM ranks in ../shared/data/param/dlrm_kineto_8rank:
rank r is source rank r % 8 rewritten with its own distributedInfo (rank r, world size N, its
node's process group of 8 ranks in pg_config), its own clock (baseTimeNanoseconds shifted by
r x 37 µs mod 1 ms) and its file name; one rank (STRAGGLER_AT x N) is the straggler: every event of its
trace stretched by STRETCH from its first event, so its steps, compute and collectives all take
longer. Files are gzip level 1 (~90 kB each, ~180 MB for 2,048 ranks) in a temporary directory,
removed after each size unless --keep.

For each size and mode it runs what `hermes advise DIR --format json` runs (hermes_kb.advisor.run.
advise_streamed, the report's details, the JSON) in a fresh process and reports
wall time, time per rank, the hermes process's peak RSS and the largest worker's (forked workers
share the parent's pages at fork, so a worker's RSS counts part of the parent's), and whether
the report's slow rank for the whole job ("slow_ranks", domain "all") is the planted straggler.
mode "dask" starts a LocalCluster of --workers processes (1 thread each) in that process and
hands its address to the pipeline (as --dask does); the JSON must equal the local run's byte for byte.
Machines here are shared: the load average is printed with each run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "data" / "param" / "dlrm_kineto_8rank"
STRETCH = 2.0  # the slowest DLRM rank steps 1.6x the fastest: 2x makes the planted one the slowest whatever its source
STRAGGLER_AT = 0.7  # the straggler's place in the job, as a fraction of N
GROUP = 8

# run in a fresh interpreter: what `hermes advise DIR --format json -o OUT` runs (the pipeline, the
# report's details, the JSON), then the peak RSS of this process and of its workers
_RUN = r"""
import json, os, resource, sys, time
job, out, mode, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cluster = None
if mode == "dask":
    from distributed import LocalCluster
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
from hermes_kb.advisor.knowledge import knowledge_base
from hermes_kb.advisor.run import advise_streamed
from hermes_kb.render.details import with_details
for attempt in range(12):  # loaded (and cached) first: a KB edited while the ranks are analysed cannot fail the run
    try:
        knowledge_base(None)
        break
    except Exception:
        time.sleep(5)
from hermes_kb.render.report import render_json
t0 = time.perf_counter()
adv = advise_streamed([job], workers=workers, dask=cluster.scheduler_address if cluster else None)
with open(out, "w", encoding="utf-8") as fh:
    fh.write(render_json(with_details(adv.report, adv.facts)) + "\n")
wall = time.perf_counter() - t0
worker_kb = 0
if cluster is not None:
    from distributed import Client
    with Client(cluster.scheduler_address) as c:
        worker_kb = max(c.run(lambda: __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss).values())
    cluster.close()
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child_kb = max(worker_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"wall_s": wall, "self_rss_mb": self_kb / 1024, "worker_rss_mb": child_kb / 1024}))
"""


def _sources() -> list[dict]:
    files = sorted(DLRM.glob("*.json.gz"))
    if len(files) != GROUP:
        sys.exit(f"need the 8 DLRM ranks in {DLRM}")
    return [json.loads(gzip.decompress(f.read_bytes())) for f in files]


def _stretched(doc: dict) -> dict:
    events = doc["traceEvents"]
    t0 = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    out = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = t0 + (e["ts"] - t0) * STRETCH
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] = e["dur"] * STRETCH
        out.append(e)
    return {**doc, "traceEvents": out}


def build(n: int, where: Path, sources: list[dict]) -> int:
    """Write a job of ``n`` ranks under ``where``; returns the straggler's rank."""
    try:
        import orjson

        dumps = orjson.dumps
    except ImportError:  # the bench extra has it; json works, slower
        def dumps(x):
            return json.dumps(x).encode()

    straggler = int(n * STRAGGLER_AT)
    slow = _stretched(sources[straggler % GROUP])
    for r in range(n):
        doc = slow if r == straggler else sources[r % GROUP]
        node = list(range(r - r % GROUP, r - r % GROUP + GROUP))
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        head["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": n,
                                   "pg_config": [{"pg_name": str(1 + r // GROUP), "pg_desc": "node", "ranks": node}]}
        head["baseTimeNanoseconds"] = (r * 37_000) % 1_000_000
        data = dumps({**head, "traceEvents": doc["traceEvents"]})
        (where / f"worker{r}.pt.trace.json.gz").write_bytes(gzip.compress(data, compresslevel=1))
    return straggler


def run(job: Path, mode: str, workers: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-c", _RUN, str(job), str(out), mode, str(workers)], capture_output=True,
                       text=True, env=env)  # fmt: skip
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode or not lines:
        sys.exit(f"{mode} run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


def found(report: dict, straggler: int) -> tuple[bool, list]:
    slow = [(s["domain"], s["rank"]) for s in report.get("slow_ranks") or []]
    return any(d == "all" and r == straggler for d, r in slow), slow[:4]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 512, 2048])
    ap.add_argument("--modes", nargs="+", default=["local", "dask"], choices=["local", "dask"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="append the results to this JSON list")
    ap.add_argument("--keep", type=Path, help="build the jobs here and keep them")
    a = ap.parse_args()
    sources = _sources()
    results = []
    for n in a.sizes:
        base = Path(tempfile.mkdtemp(prefix=f"hermes-scale-{n}-", dir=a.keep))
        job = base / "job"
        job.mkdir()
        t = time.perf_counter()
        straggler = build(n, job, sources)
        built = time.perf_counter() - t
        size_mb = sum(f.stat().st_size for f in job.iterdir()) / 1e6
        print(f"== {n} ranks: built in {built:.1f} s ({size_mb:,.0f} MB gz), straggler rank {straggler}", flush=True)
        outs = {}
        for mode in a.modes:
            out = base / f"{mode}.json"
            load = os.getloadavg()[0]
            m = run(job, mode, a.workers, out)
            report = json.loads(out.read_text())
            ok, slow = found(report, straggler)
            outs[mode] = out.read_bytes()
            row = {"ranks": n, "mode": mode, "workers": a.workers, "wall_s": round(m["wall_s"], 2),
                   "ms_per_rank": round(m["wall_s"] / n * 1e3, 1), "self_rss_mb": round(m["self_rss_mb"]),
                   "worker_rss_mb": round(m["worker_rss_mb"]), "straggler": straggler, "found": ok,
                   "ranks_analysed": len(report["inputs"]["ranks"]), "load_avg": round(load, 2),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
            if mode == "dask" and "local" in outs:
                row["equals_local"] = outs["dask"] == outs["local"]
            results.append(row)
            print(json.dumps(row), "slow_ranks:", slow, flush=True)
        if a.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        old = json.loads(a.json.read_text()) if a.json.exists() else []
        a.json.write_text(json.dumps(old + results, indent=1) + "\n")


if __name__ == "__main__":
    main()
