"""How much of a for-loop AdamW's step() time the foreach and fused implementations remove on CPU.

The measurement behind C-CPU-027's gain range (cases/cpu/optimizer_per_parameter_loop.yaml). The
model is the small_batch scenario's MLP (1.6 M parameters, benchmarks/scenarios/small_batch.py),
one intra-op thread, batch 4 and 64; each configuration runs 35 steps and reports the median of
the last 30 (step and optimizer.step() alone). Two shares of the for-loop step() time: what the
implementation removes from step() itself, and what it removes from the whole training step
(the case's gain fraction: speedup = T / (T - f x optimizer time), so f is the whole-step
saving over the for-loop step() time; fewer temporaries in the update can also speed up the
rest of the step). Needs torch (pip install torch==2.13.0).

  python benchmarks/optimizer_impl_cpu.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

STEPS, WARMUP = 30, 5
IMPLEMENTATIONS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 1024), nn.LayerNorm(1024), nn.GELU(),
                         nn.Linear(1024, 1024), nn.LayerNorm(1024), nn.GELU(), nn.Linear(1024, 10))  # fmt: skip


def run(kwargs: dict, batch: int) -> tuple[float, float]:
    """(median step ms, median optimizer.step() ms)."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, **kwargs)
    x, y = torch.randn(batch, 512), torch.randint(0, 10, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    steps, updates = [], []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(m(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if i >= WARMUP:
            steps.append(t2 - t0)
            updates.append(t2 - t1)
    return statistics.median(steps) * 1e3, statistics.median(updates) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for batch in (4, 64):
        res = {name: run(kw, batch) for name, kw in IMPLEMENTATIONS.items()}
        base_step, base = res["for_loop"]
        for name, (step, upd) in res.items():
            print(f"batch {batch:3d} {name:8s} step {step:6.2f} ms  step() {upd:6.2f} ms  "
                  f"removed {1 - upd / base:5.1%} of the for-loop step() time from step(), "
                  f"{(base_step - step) / base:5.1%} from the whole step")  # fmt: skip


if __name__ == "__main__":
    main()
