"""How much of a for-loop AdamW's step() time the foreach and fused implementations remove on CPU,
and what the loop costs in page faults.

The measurement behind C-CPU-027's gain range (cases/cpu/C-CPU-027-optimizer-per-parameter-loop.yaml).
Four model families, none of them a scenario of the zoo except the first (benchmarks/scenarios/):
the small_batch scenario's MLP (1.6 M parameters, LayerNorm + GELU), a 3-layer CNN with batch
norm on 32x32 images, a 2-layer transformer encoder (d=256, 4 heads) and a small language model
(8k x 128 embedding, MLP, 8k-way output). One intra-op thread; each configuration runs 25 steps
and reports medians of the last 20 (step and optimizer.step() alone), three rounds alternating
the implementations. Two shares of the for-loop step() time: what the implementation removes
from step() itself, and what it removes from the whole training step (the case's gain fraction:
speedup = T / (T - f x optimizer time), so f is the whole-step saving over the for-loop step()
time). Also the process' minor page faults and system CPU time per step (getrusage), inside and
outside step(): the loop's temporaries, returned to the OS by glibc, fault back in every step.
Needs torch (pip install torch==2.13.0).

  python benchmarks/optimizer_impl_cpu.py [--quick]
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch
from torch import nn

STEPS, WARMUP, ROUNDS = 20, 5, 3
IMPLEMENTATIONS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _ce(out: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.flatten(0, -2) if out.dim() > 2 else out,
                                       torch.zeros(out.numel() // out.shape[-1], dtype=torch.long))  # fmt: skip


def mlp() -> tuple[nn.Module, callable]:
    m = nn.Sequential(nn.Linear(512, 1024), nn.LayerNorm(1024), nn.GELU(),
                      nn.Linear(1024, 1024), nn.LayerNorm(1024), nn.GELU(), nn.Linear(1024, 10))  # fmt: skip
    return m, lambda b: torch.randn(b, 512)


def cnn() -> tuple[nn.Module, callable]:
    def block(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]

    m = nn.Sequential(*block(3, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2), *block(64, 128),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))  # fmt: skip
    return m, lambda b: torch.randn(b, 3, 32, 32)


def transformer() -> tuple[nn.Module, callable]:
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    m = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(256 * 32, 10))
    return m, lambda b: torch.randn(b, 32, 256)


def language_model() -> tuple[nn.Module, callable]:
    m = nn.Sequential(nn.Embedding(8000, 128), nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128), nn.Linear(128, 8000))
    return m, lambda b: torch.randint(0, 8000, (b, 32))


MODELS = {"mlp": (mlp, (4, 64)), "cnn": (cnn, (8, 64)), "transformer": (transformer, (4, 16)),
          "language_model": (language_model, (4, 16))}  # fmt: skip


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_stime, r.ru_minflt


def run(build, kwargs: dict, batch: int) -> dict[str, float]:
    """Medians per step in ms (step, step()) and means per step (system ms, faults inside and
    outside step())."""
    torch.manual_seed(0)
    m, make_input = build()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, **kwargs)
    x = make_input(batch)
    rows = []
    for i in range(WARMUP + STEPS):
        s0, f0 = _usage()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _ce(m(x)).backward()
        t1 = time.perf_counter()
        s1, f1 = _usage()
        opt.step()
        t2 = time.perf_counter()
        s2, f2 = _usage()
        if i >= WARMUP:
            rows.append((t2 - t0, t2 - t1, s2 - s0, f1 - f0, f2 - f1))
    return {"step": statistics.median(r[0] for r in rows) * 1e3, "update": statistics.median(r[1] for r in rows) * 1e3,
            "sys": statistics.fmean(r[2] for r in rows) * 1e3, "faults_out": statistics.fmean(r[3] for r in rows),
            "faults_in": statistics.fmean(r[4] for r in rows)}  # fmt: skip


def main() -> None:
    torch.set_num_threads(1)
    quick = "--quick" in sys.argv
    models = {"mlp": MODELS["mlp"]} if quick else MODELS
    for name, (build, batches) in models.items():
        for batch in batches:
            rounds = [{k: run(build, kw, batch) for k, kw in IMPLEMENTATIONS.items()} for _ in range(1 if quick else ROUNDS)]
            base = rounds[0]["for_loop"]
            print(f"{name} batch {batch}: for-loop step {base['step']:.2f} ms, step() {base['update']:.2f} ms "
                  f"({base['update'] / base['step']:.0%}), system {base['sys']:.2f} ms/step, faults "
                  f"{base['faults_in']:.0f} in step() + {base['faults_out']:.0f} outside")  # fmt: skip
            for impl in ("foreach", "fused"):
                inner = sorted(1 - r[impl]["update"] / r["for_loop"]["update"] for r in rounds)
                whole = sorted((r["for_loop"]["step"] - r[impl]["step"]) / r["for_loop"]["update"] for r in rounds)
                f = rounds[0][impl]
                print(f"  {impl:8s} removed {', '.join(f'{v:.0%}' for v in inner)} of the for-loop step() time from "
                      f"step(), {', '.join(f'{v:.0%}' for v in whole)} from the whole step; system {f['sys']:.2f} "
                      f"ms/step, faults {f['faults_in']:.0f} in step() + {f['faults_out']:.0f} outside")  # fmt: skip


if __name__ == "__main__":
    main()
