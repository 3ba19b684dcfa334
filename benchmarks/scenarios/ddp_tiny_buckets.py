"""Scenario ddp_tiny_buckets: DDP's gradient all-reduce split into dozens of tiny buckets.

Model: a residual MLP (512 wide, 6 blocks of Linear-LayerNorm-ReLU, 26 parameter tensors, 1.6 M
parameters) wrapped in DistributedDataParallel (gloo, 2 ranks on one host, one process and one
intra-op thread each), SGD (foreach), synthetic regression data, batch 64 per rank.

Injected (bad): ``DistributedDataParallel(..., bucket_cap_mb=0.05)``: DDP's C++ reducer cuts the
6.4 MB of gradients into buckets of at most 50 kB, so every backward issues about 30 small
all-reduces (gloo on CPU), each with its own fixed cost, from C++ (no Python frame issues them).

Fix (fixed): the default bucket size (25 MB: the gradients go in one or two all-reduces).

Expected: a communication finding (C-COMM-010, the bucket size search, or C-COMM-022, many small
all-reduces a step) from the collectives the trace records on gloo's threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common_dist  # noqa: E402
from common_dist import Label, Run  # noqa: E402

WIDTH, BLOCKS, BATCH = 512, 6, 64


def make_run(variant: str, rank: int, world: int) -> Run:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH)

        def forward(self, x):
            return x + torch.relu(self.norm(self.lin(x)))

    net = nn.Sequential(*[Block() for _ in range(BLOCKS)], nn.Linear(WIDTH, 1))
    model = DDP(net, bucket_cap_mb=0.05) if variant == "bad" else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)
    gen = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, 1, generator=gen)) for _ in range(8)]
    loss_fn = nn.MSELoss()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="ddp_tiny_buckets",
    category="communication",
    cause="small_gradient_buckets",
    expected_cases=["C-COMM-010", "C-COMM-022"],
    description=("A 2-rank DDP job (gloo, CPU) with bucket_cap_mb=0.05: DDP's C++ reducer issues about 30 small "
                 "gradient all-reduces in every backward."),
    fix="The default bucket size (25 MB).",
    notes=["Recorded for issue 32: collectives issued from C++ (DDP's reducer) on a CPU (gloo) trace, which the trace "
           "records only as gloo:all_reduce annotations on gloo's threads and c10d::allreduce_ operators."],
)

if __name__ == "__main__":
    common_dist.main("ddp_tiny_buckets", make_run, LABEL)
