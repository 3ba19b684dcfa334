"""What page faults from glibc's malloc cost a CPU training step, and what keeping the memory saves.

The measurement behind C-MON-012's gain range (cases/cpu/C-MON-012-monitor-allocator-page-faults.yaml).
The models of benchmarks/optimizer_impl_cpu.py, with AdamW for-loop and fused, each run in a
fresh process under glibc's defaults, with the mmap and trim thresholds raised
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_), and, with --jemalloc PATH, with jemalloc
preloaded, once with its defaults and once told never to purge freed pages (MALLOC_CONF). Per configuration: median step time, mean system CPU time and minor faults per step
(getrusage), and the saving of each allocator setting as a multiple of the default's system time
(the case's gain fraction). One intra-op thread, 25 steps, the last 20 counted, best of 3 runs.
Needs torch (pip install torch==2.13.0).

  python benchmarks/allocator_faults_cpu.py [--jemalloc /usr/lib/x86_64-linux-gnu/libjemalloc.so.2]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CONFIGS = [("mlp", 4, "for_loop"), ("mlp", 64, "for_loop"), ("transformer", 4, "for_loop"),
           ("language_model", 4, "for_loop"), ("language_model", 16, "for_loop"), ("language_model", 16, "fused")]  # fmt: skip
RAISED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
RUNS = 3
# jemalloc's defaults purge freed pages (dirty and muzzy decay, and at once for blocks above its
# oversize threshold): measured here, that faults as much as glibc or more. Never purging keeps them.
JEMALLOC_KEEP = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def child(name: str, batch: int, impl: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    import optimizer_impl_cpu as o

    torch.set_num_threads(1)
    res = o.run(o.MODELS[name][0], o.IMPLEMENTATIONS[impl], batch)
    print(json.dumps(res))


def measure(cfg: tuple[str, int, str], env: dict[str, str]) -> dict[str, float]:
    best = None
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, __file__, "--child", *map(str, cfg)], env={**os.environ, **env},
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        res = json.loads(out.strip().splitlines()[-1])
        if best is None or res["step"] < best["step"]:
            best = res
    return best


def main() -> None:
    settings = {"glibc default": {}, "glibc thresholds raised": RAISED}
    if "--jemalloc" in sys.argv:
        lib = sys.argv[sys.argv.index("--jemalloc") + 1]
        settings["jemalloc"] = {"LD_PRELOAD": lib}
        settings["jemalloc, no purging"] = {"LD_PRELOAD": lib, "MALLOC_CONF": JEMALLOC_KEEP}
    for cfg in CONFIGS:
        res = {k: measure(cfg, env) for k, env in settings.items()}
        base = res["glibc default"]
        line = (f"{cfg[0]} batch {cfg[1]} AdamW {cfg[2]}: default step {base['step']:.2f} ms, system "
                f"{base['sys']:.2f} ms/step, faults {base['faults_in'] + base['faults_out']:.0f}/step")  # fmt: skip
        for k, r in list(res.items())[1:]:
            saved = base["step"] - r["step"]
            ratio = f"{saved / base['sys']:.2f}x the system time" if base["sys"] >= 0.2 else "system time < 0.2 ms"
            line += f"; {k}: step {r['step']:.2f} ms, system {r['sys']:.2f} ms, saved {saved:.2f} ms ({ratio})"
        print(line, flush=True)


if __name__ == "__main__":
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        child(sys.argv[i + 1], int(sys.argv[i + 2]), sys.argv[i + 3])
    else:
        main()
