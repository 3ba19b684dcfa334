"""Memory over many advise calls in one process (issue 18): it must hold flat.

    python benchmarks/bench_memory.py [--calls 1000] [--engine durable|python|auto] [TRACE]

Loads the trace once, then calls ``hermes_kb.advise`` on the bundle ``--calls`` times, sampling
the resident set size (RSS) after each call (after a gc.collect()). Prints the RSS after the
first call, after the warm-up (the first 10% of calls), at the end, and the growth per call after
the warm-up; docs/reliability.md keeps the last figures. Before issue 18 durable-rules kept one
session state per call in its C core: +2.9 MB a call.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "traces" / "cpu_dataloader_bound.json.gz"


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20
    except OSError:  # not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", default=str(EXAMPLE))
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--engine", default="auto", choices=("auto", "durable", "python"))
    a = ap.parse_args(argv)

    import hermes_kb
    from hermes_kb.trace import load

    bundle = load(a.trace)
    samples: list[float] = []
    t = time.time()
    for i in range(a.calls):
        report = hermes_kb.advise(bundle, engine=a.engine)
        gc.collect()
        samples.append(rss_mb())
    secs = time.time() - t
    warm = max(1, a.calls // 10)
    per_call_kb = (samples[-1] - samples[warm - 1]) / max(1, a.calls - warm) * 1024
    print(f"trace: {a.trace}")
    print(f"engine: {report.kb.engine}; {a.calls} calls in {secs:,.0f} s ({secs / a.calls * 1e3:,.0f} ms a call)")
    print(f"RSS after call 1: {samples[0]:,.1f} MB; after call {warm} (warm-up): {samples[warm - 1]:,.1f} MB; "
          f"after call {a.calls}: {samples[-1]:,.1f} MB; max {max(samples):,.1f} MB")  # fmt: skip
    print(f"growth after the warm-up: {samples[-1] - samples[warm - 1]:+,.1f} MB ({per_call_kb:+,.1f} KB a call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
