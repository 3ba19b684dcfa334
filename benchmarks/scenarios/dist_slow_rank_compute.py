"""Scenario dist_slow_rank_compute: one rank of a 2-rank DDP job does extra work in every step.

Model: an MLP (512 -> 1024 -> 1024 -> 10, 1.6 M parameters) wrapped in DistributedDataParallel
(gloo, 2 ranks on one host, one process and one intra-op thread each), AdamW (fused=True),
synthetic data, batch 32 per rank (common_dist.py runs the job).

Injected (bad): rank 0 evaluates the model on a held-out batch of 256 samples inside every
training step (forward under torch.no_grad, loss and accuracy kept as tensors), the usual
"if rank == 0: validate for the logs" left in the step. Rank 1 has no such work, so at each
step's gradient all-reduce it waits for rank 0: the job runs at rank 0's pace.

Fix (fixed): the same held-out evaluation every 50 steps, and on every rank's share of the
held-out set (each rank evaluates its own 128 samples, as the data-parallel evaluation does),
so no rank carries work the others do not: the ranks are balanced (no evaluation falls in the
timed or recorded steps).

Expected: C-MON-006 (one rank computes slower, the job runs at its pace), from the monitor logs
of both ranks: rank 0 burns more CPU per step than rank 1 while both step at the same pace.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common_dist  # noqa: E402
from common_dist import Label, Run  # noqa: E402

EVAL_EVERY = {"bad": 1, "fixed": 50}


def make_run(variant: str, rank: int, world: int) -> Run:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randn(32, 512, generator=gen), torch.randint(0, 10, (32,), generator=gen)) for _ in range(8)]
    held = (torch.randn(256, 512, generator=gen), torch.randint(0, 10, (256,), generator=gen))
    loss_fn = nn.CrossEntropyLoss()
    every = EVAL_EVERY[variant]
    logs: list = []

    def evaluate(x, y) -> None:
        with torch.no_grad():
            out = model.module(x)  # the wrapped module: no DDP forward (no buffer broadcast) for evaluation
            logs.append((loss_fn(out, y), (out.argmax(1) == y).float().mean()))

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if i % every == every - 1:
            if variant == "bad":
                if rank == 0:
                    evaluate(*held)
            else:
                lo = rank * len(held[0]) // world
                hi = (rank + 1) * len(held[0]) // world
                evaluate(held[0][lo:hi], held[1][lo:hi])
        del logs[:-4]

    return Run(step=step, samples_per_step=32)


LABEL = Label(
    scenario="dist_slow_rank_compute",
    category="parallel",
    cause="slow_rank",
    expected_cases=["C-MON-006"],
    description=(
        "A 2-rank DDP job (gloo, CPU) in which rank 0 evaluates the model on a 256-sample held-out batch "
        "inside every training step; rank 1 waits for it at each gradient all-reduce."
    ),
    fix="Evaluate every 50 steps, each rank on its own half of the held-out set (balanced ranks).",
    notes=[
        "DDP's gradient all-reduce on gloo is issued from C++: the monitor does not time it, so the slow "
        "rank shows as the rank burning more CPU per step while both ranks step at the same pace.",
    ],
)

if __name__ == "__main__":
    common_dist.main("dist_slow_rank_compute", make_run, LABEL)
