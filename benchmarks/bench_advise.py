"""Analyzer, knowledge-base and advise speed, as ratios against loading in the same run.

    python benchmarks/bench_advise.py [TRACE.json.gz] [--ranks-dir DIR] [--repeat 3]

Prints:
  - all analyzers on the trace vs loading it (target: ratio <= 1.0);
  - knowledge-base load + compile to durable-rules, in a fresh process (target < 0.3 s);
  - inference (rules then cases) on the facts of 8 ranks (target < 0.5 s);
  - hermes_kb.advise on the trace vs loading it (target: ratio < 2.0), and vs a bare
    ``orjson.loads`` of the same decompressed file (issue 21: <= 1x).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared/data"
DEFAULT = SHARED / "hta/df_index_resolver/df_index_resolver.json.gz"
RANKS = SHARED / "param/dlrm_kineto_8rank"

_KB_CHILD = r"""
import time
t0 = time.perf_counter()
from hermes_kb.kb.loader import load_kb
from hermes_kb.kb import durable_engine
t1 = time.perf_counter()
kb = load_kb()  # cold: every file parsed and checked
t2 = time.perf_counter()
durable_engine._register(kb, kb.active_rules(), "when")
durable_engine._register(kb, kb.active_cases(), "conditions")
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, len(kb.rules), len(kb.cases))
"""


def _med(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--ranks-dir", default=str(RANKS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import hermes_kb
    from hermes_kb.analysis.run import analyze_bundle
    from hermes_kb.kb.engine import infer

    res: dict = {"trace": args.trace}
    hermes_kb.load(args.trace)
    try:
        import orjson
    except ImportError:  # pragma: no cover - the bench extra installs it
        orjson = None
    raw = Path(args.trace).read_bytes()  # as bench_load.py: the compressed bytes already read

    def _orjson() -> None:
        orjson.loads(gzip.decompress(raw) if args.trace.endswith(".gz") else raw)

    # interleaved, so that the machine's drift (shared, noisy) hits both sides of each ratio alike
    load_t, advise_t, orjson_t = [], [], []
    for _ in range(args.repeat):
        load_t.append(_med(lambda: hermes_kb.load(args.trace), 1))
        advise_t.append(_med(lambda: hermes_kb.advise(args.trace), 1))
        if orjson is not None:
            orjson_t.append(_med(_orjson, 1))
    load_s, advise_s = statistics.median(load_t), statistics.median(advise_t)
    bundle = hermes_kb.load(args.trace)
    analyze_s = _med(lambda: analyze_bundle(bundle), args.repeat)
    res["load_s"], res["analyze_s"], res["advise_s"] = load_s, analyze_s, advise_s
    if orjson_t:
        res["orjson_s"] = statistics.median(orjson_t)
        res["advise_over_orjson"] = statistics.median(a / o for a, o in zip(advise_t, orjson_t))
        res["load_over_orjson"] = statistics.median(a / o for a, o in zip(load_t, orjson_t))

    # cold: the disk cache of the checked KB (kb/cache.py) off, as on a first start
    out = subprocess.run([sys.executable, "-c", _KB_CHILD], capture_output=True, text=True, check=True,
                         env={**os.environ, "HERMES_KB_CACHE": "off"})  # fmt: skip
    imp, load_kb_s, compile_s, n_rules, n_cases = out.stdout.split()
    res["kb"] = {"import_s": float(imp), "load_s": float(load_kb_s), "compile_s": float(compile_s),
                 "rules": int(n_rules), "cases": int(n_cases)}  # fmt: skip

    ranks = hermes_kb.load(args.ranks_dir)
    facts = analyze_bundle(ranks)
    from hermes_kb.advisor.knowledge import knowledge_base

    kb = knowledge_base()
    infer(kb, facts, "durable")  # registration happens once per process
    res["inference"] = {"ranks": len(ranks), "facts": len(facts),
                        "durable_s": _med(lambda: infer(kb, facts, "durable"), args.repeat),
                        "python_s": _med(lambda: infer(kb, facts, "python"), args.repeat)}  # fmt: skip

    k = res["kb"]
    i = res["inference"]
    print(f"trace: {Path(args.trace).name}")
    print(f"load {load_s:.2f} s · analyzers {analyze_s:.2f} s: ratio {analyze_s / load_s:.2f} (target <= 1.0)")
    print(f"advise {advise_s:.2f} s: {advise_s / load_s:.2f}x load (target < 2.0)")
    if "orjson_s" in res:
        print(f"advise / orjson.loads of the same file ({res['orjson_s']:.2f} s), median of {args.repeat} interleaved "
              f"pairs: {res['advise_over_orjson']:.2f} (target <= 1.0); load / orjson {res['load_over_orjson']:.2f} "
              "(target <= 0.5)")  # fmt: skip
    print(f"KB: {k['rules']} rules + {k['cases']} cases, load+check {k['load_s']:.3f} s + compile "
          f"{k['compile_s']:.3f} s = {k['load_s'] + k['compile_s']:.3f} s (cold: the JSON cache of "
          f"kb/cache.py off; target < 0.3 s; imports {k['import_s']:.2f} s not counted)")  # fmt: skip
    print(f"inference on {i['ranks']} ranks ({i['facts']} facts): durable-rules {i['durable_s']:.3f} s, "
          f"python evaluator {i['python_s']:.3f} s (target < 0.5 s)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
