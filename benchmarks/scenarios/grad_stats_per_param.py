"""Scenario grad_stats_per_param: gradient statistics read back parameter by parameter every step.

Model: an embedding bag recommender (two 5,000 x 32 embedding tables, an MLP 64 -> 128 -> 64 ->
1 over their concatenation, 10 parameter tensors), binary cross-entropy, SGD (foreach), batch
256 with 20 ids per bag, one intra-op thread.

Injected (bad): before the optimizer step the loop records, for every parameter, the norm, the
largest absolute value and the fraction of zero entries of its gradient, each read back as a
Python float (``.item()``) into a dict of lists, the "track the gradients" habit: a loop over
the parameters issuing several reductions and read-backs per tensor in every step.

Fix (fixed): ``torch._foreach_norm`` over the gradients once per step, kept on the device in a
preallocated buffer, and read back every 100 steps (none falls in the timed or recorded steps).

Expected: C-PROG-001 or C-PROG-002 (the loop in ``grad_stats_per_param.py: record_grad_stats``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

ROWS, DIM, BATCH, BAG, EVERY = 5000, 32, 256, 20, 100


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Recommender(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = nn.EmbeddingBag(ROWS, DIM, mode="mean")
            self.items = nn.EmbeddingBag(ROWS, DIM, mode="mean")
            self.mlp = nn.Sequential(nn.Linear(2 * DIM, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, u, v):
            return self.mlp(torch.cat([self.users(u), self.items(v)], 1)).squeeze(1)

    model = Recommender()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, foreach=True)
    named = list(model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, ROWS, (BATCH, BAG), generator=gen), torch.randint(0, ROWS, (BATCH, BAG), generator=gen),
             torch.randint(0, 2, (BATCH,), generator=gen).float()) for _ in range(8)]
    loss_fn = nn.BCEWithLogitsLoss()
    stats: dict[str, list[tuple[float, float, float]]] = {n: [] for n, _ in named}
    norms = torch.zeros(EVERY, len(named))

    @torch.no_grad()
    def record_grad_stats(i: int) -> None:
        if variant == "bad":
            for name, p in named:
                g = p.grad
                stats[name].append((g.norm().item(), g.abs().max().item(), (g == 0).float().mean().item()))
        else:
            norms[i % EVERY] = torch.stack(torch._foreach_norm([p.grad for _, p in named]))
            if (i + 1) % EVERY == 0:
                stats["all"] = norms.tolist()

    def step(i: int) -> None:
        u, v, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(u, v), y)
        loss.backward()
        record_grad_stats(i)
        opt.step()

    return Run(step=step)


LABEL = Label(
    scenario="grad_stats_per_param",
    category="cpu",
    cause="per_tensor_python_loop",
    expected_cases=["C-PROG-002", "C-PROG-001"],
    description=("Norm, max and zero fraction of every parameter's gradient read back with .item() in a loop over the "
                 "10 parameters before every optimizer step (30 reductions and read-backs a step)."),
    fix="torch._foreach_norm over the gradients into a device buffer, read back every 100 steps.",
    notes=["Recorded for issue 32, written from the mechanism: a Python loop that issues operators once per tensor, "
           "with a read-back each."],
)

if __name__ == "__main__":
    common.main("grad_stats_per_param", make_run, LABEL)
