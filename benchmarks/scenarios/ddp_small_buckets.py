"""Scenario ddp_small_buckets: DDP reduces the gradients in dozens of tiny buckets.

Model: a residual tabular network (an input projection 96 -> 320, 16 residual blocks of
LayerNorm -> Linear(320, 320) -> GELU with a skip connection, a 4-class head; 70 parameter
tensors, 1.69 M parameters) wrapped in DistributedDataParallel (gloo, 2 ranks on one host, one
process and one intra-op thread each), SGD with momentum (foreach), synthetic data, batch 96 per
rank (common_dist.py runs the job).

Injected (bad): ``DistributedDataParallel(model, bucket_cap_mb=0.001)``: a bucket closes as soon
as it holds 1 kB, so the reducer all-reduces every gradient on its own (the head's 16-byte bias
rides with the next one): 69 gloo all-reduces a step (counted in a one-rank profile), of 1.3 kB
(biases, norms) to 400 kB (weights), each paying gloo's fixed cost (a rendezvous of both ranks
over the loopback, and work for gloo's threads on cores the ranks' compute needs) and each a
point where the ranks wait for each other; the last ones run after the backward has ended.

Fix (fixed): the default ``bucket_cap_mb`` (25 MB): the gradients travel in two buckets.

Expected: C-COMM-001 (gradients synchronised in many small collectives). Nothing in the user's
Python issues these: DDP's C++ reducer does, from the autograd hooks, so the monitor (which times
collectives called from Python) does not see them; the trace records each as a ``c10d::allreduce_``
operator inside the backward and a ``gloo:all_reduce`` span on gloo's threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common_dist  # noqa: E402
from common_dist import Label, Run  # noqa: E402

IN, WIDTH, BLOCKS, CLASSES, BATCH = 96, 320, 16, 4, 96
BAD_BUCKET_MB = 0.001


def make_run(variant: str, rank: int, world: int) -> Run:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.lin = nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            return x + nn.functional.gelu(self.lin(self.norm(x)))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(IN, WIDTH), *[Block() for _ in range(BLOCKS)], nn.LayerNorm(WIDTH),
                        nn.Linear(WIDTH, CLASSES))  # fmt: skip
    model = DDP(net, bucket_cap_mb=BAD_BUCKET_MB) if variant == "bad" else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    gen = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randn(BATCH, IN, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
            for _ in range(8)]  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="ddp_small_buckets",
    category="communication",
    cause="small_messages",
    expected_cases=["C-COMM-001"],
    description=(
        "A 2-rank DDP job (gloo, CPU) whose bucket_cap_mb of 0.001 makes DDP's reducer all-reduce the gradients in "
        "69 tiny buckets every step (one per gradient)."
    ),
    fix="DDP's default bucket_cap_mb (25 MB): two buckets a step.",
    notes=[
        (
            "Recorded for issue 32 (collectives DDP issues from C++ on gloo, read from the trace's c10d:: operators "
            "and gloo:* spans); the monitor does not time these (they are not called from Python)."
        ),
    ],
)

if __name__ == "__main__":
    common_dist.main("ddp_small_buckets", make_run, LABEL)
