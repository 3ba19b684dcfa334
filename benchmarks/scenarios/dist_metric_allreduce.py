"""Scenario dist_metric_allreduce: every step all-reduces each logged metric on its own.

Model: an MLP (256 -> 256 x 4 hidden layers, ReLU, 10-class head) wrapped in
DistributedDataParallel (gloo, 2 ranks on one host, one process and one intra-op thread each),
AdamW (fused=True), synthetic data, batch 64 per rank, gradient clipping at norm 1.0
(common_dist.py runs the job).

Injected (bad): the loop logs five metrics averaged over the ranks in every step (loss,
accuracy, gradient norm, mean logit, mean target-class probability: a hand-written
``dist.all_reduce(t); t.item()`` per value, what Lightning's ``self.log(..., sync_dist=True)``
or torchmetrics' ``dist_sync_on_step=True`` do): five blocking all-reduces of one float each,
each a point where every rank waits for the other, on top of DDP's gradient all-reduce.

Fix (fixed): the five values are summed locally into one tensor (they stay tensors: no
.item()), and one all-reduce of the stacked 5-element tensor every 50 steps averages them over
the ranks for the log (no such reduction falls in the timed or recorded steps).

Expected: C-COMM-022 (several tiny all-reduces every step hold the step). The monitor times
these all-reduces (they are called from Python); in the trace they are c10d::allreduce_
operators on the main thread and gloo:all_reduce annotations on gloo's threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common_dist  # noqa: E402
from common_dist import Label, Run  # noqa: E402

WIDTH, DEPTH, BATCH, EVERY = 256, 4, 64, 50


def make_run(variant: str, rank: int, world: int) -> Run:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(WIDTH, WIDTH)]
    for _ in range(DEPTH - 1):
        layers += [nn.ReLU(), nn.Linear(WIDTH, WIDTH)]
    model = DDP(nn.Sequential(*layers, nn.ReLU(), nn.Linear(WIDTH, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    running = torch.zeros(5)
    log: list[list[float]] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            metrics = [loss.detach(), (out.argmax(1) == y).float().mean(), gnorm, out.mean(),
                       out.softmax(1).gather(1, y[:, None]).mean()]  # fmt: skip
        if variant == "bad":
            vals = []
            for m in metrics:  # one all-reduce per value, and .item() to log it
                t = m.clone()
                dist.all_reduce(t)
                vals.append(t.item() / world)
            log.append(vals)
        else:
            running.add_(torch.stack(metrics))
            if i % EVERY == EVERY - 1:
                dist.all_reduce(running)
                log.append((running / (world * EVERY)).tolist())
                running.zero_()
        del log[:-4]

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="dist_metric_allreduce",
    category="communication",
    cause="metric_sync_every_step",
    expected_cases=["C-COMM-022"],
    description=(
        "A 2-rank DDP job (gloo, CPU) that all-reduces each of five logged scalar metrics on its own and reads "
        "it with .item() in every step."
    ),
    fix="Accumulate the metrics locally and all-reduce them as one stacked tensor every 50 steps.",
    notes=[
        "The scalar all-reduces are blocking gloo collectives issued from Python: the monitor times them "
        "(comm_s); DDP's gradient all-reduce, issued from C++, it does not.",
        "A CPU trace of torch 2.13 with gloo records no record_param_comms: hermes reads each collective from its "
        "c10d::allreduce_ operator (size) and its gloo:all_reduce span on gloo's threads (time), source host "
        "(issue 32; before it, the expected case could not fire on this recording).",
    ],
)

if __name__ == "__main__":
    common_dist.main("dist_metric_allreduce", make_run, LABEL)
