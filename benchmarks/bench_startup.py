"""How fast the `hermes` command answers, as a user starts it (issue 36, item 4).

    python benchmarks/bench_startup.py [--repeat 7] [--json out.json]

Each command runs as a fresh process (``python -m hermes_kb ...``, bytecode already compiled as
after ``pip install``), in turn with two references timed beside it so that the machine's drift
hits both sides of each ratio: ``python -c pass`` (the interpreter's own start) and a process that
only loads the bundled example (``hermes_kb.load``: imports the readers and pandas, parses the file).
The knowledge-base cache (kb/cache.py) is written once before timing, in a private directory, as
it is after a user's first command; ``kb list (no cache)`` shows what a first start costs.

Targets: ``--help``, ``advise --help``, ``kb list`` and ``kb show`` under 0.5 s; ``advise`` on the
bundled example under 1.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/traces/cpu_dataloader_bound.json.gz"
COMMANDS: list[tuple[str, list[str], float | None, dict[str, str]]] = [
    ("hermes --help", ["--help"], 0.5, {}),
    ("hermes advise --help", ["advise", "--help"], 0.5, {}),
    ("hermes kb list", ["kb", "list"], 0.5, {}),
    ("hermes kb show C-IO-001", ["kb", "show", "C-IO-001"], 0.5, {}),
    ("hermes advise EXAMPLE", ["advise", str(EXAMPLE)], 1.5, {}),
    ("hermes kb list (no cache)", ["kb", "list"], None, {"HERMES_KB_CACHE": "off"}),
]


def _time(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    py = sys.executable
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HERMES_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "hermes_kb")], check=True, env=env)
        _time([py, "-m", "hermes_kb", "kb", "list"], env)  # writes the KB cache, as a first command does
        refs = {"python -c pass": [py, "-c", "pass"],
                "load the example": [py, "-c", f"import hermes_kb; hermes_kb.load({str(EXAMPLE)!r})"]}  # fmt: skip
        rows = []
        for name, cmd, target, extra in COMMANDS:
            own, ref = [], {k: [] for k in refs}
            for _ in range(args.repeat):
                own.append(_time([py, "-m", "hermes_kb", *cmd], {**env, **extra}))
                for k, argv in refs.items():
                    ref[k].append(_time(argv, env))
            med = statistics.median(own)
            row = {"command": name, "median_s": round(med, 3), "target_s": target,
                   "met": None if target is None else med < target}  # fmt: skip
            for k in refs:
                row[f"ratio_to_{k.replace(' ', '_').replace('-', '')}"] = round(med / statistics.median(ref[k]), 2)
            rows.append(row)
    width = max(len(r["command"]) for r in rows)
    print(f"{'command':<{width}}  median s  target  met   x python -c pass  x load example")
    for r in rows:
        tgt = "-" if r["target_s"] is None else f"< {r['target_s']}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['command']:<{width}}  {r['median_s']:8.3f}  {tgt:>6}  {met:<4}  "
              f"{r['ratio_to_python_c_pass']:16.1f}  {r['ratio_to_load_the_example']:14.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
