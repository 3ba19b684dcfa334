"""Scenario optimizer_for_loop: AdamW updates the parameters one tensor at a time.

Model: a two-tower recommendation model (user and item nn.EmbeddingBag tables, 20k rows x 64
each, mean of 16 ids per sample, then an MLP 128 -> 256 -> 64 -> 1 on the concatenation),
2.6 M parameters in 8 tensors, 95% of them in the two tables; trained with AdamW on synthetic
click labels, batch 256, one intra-op thread. The embedding gradients are dense (the
nn.EmbeddingBag default), so every step the optimizer updates both whole tables and their two
state tensors.

Injected (bad): torch.optim.AdamW built with its defaults. For CPU parameters PyTorch picks the
for-loop implementation: for every tensor a chain of separate operators (lerp_, mul_, addcmul_,
sqrt, div, addcdiv_, ...), each one a pass over the tensor and its states: about a dozen passes
over 10 MB tables per step, plus per-operator dispatch.

Fix (fixed): the same optimizer with fused=True (a single vectorised C++ loop per tensor, CPU
support since PyTorch 2.4): same model, data, hyper-parameters and numerics.

This model differs on purpose from the small_batch MLP that C-CPU-027's gain range was measured
on (benchmarks/optimizer_impl_cpu.py): there the loop's cost is mostly dispatch over 10 mid-sized
tensors, here memory passes over two large ones.

    python benchmarks/scenarios/optimizer_for_loop.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

ROWS = 20_000
DIM = 64
BATCH = 256
BAG = 16


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)  # 2 shared cores: keep OpenMP noise out of the comparison
    torch.manual_seed(0)

    class TwoTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.user = nn.EmbeddingBag(ROWS, DIM, mode="mean")
            self.item = nn.EmbeddingBag(ROWS, DIM, mode="mean")
            self.mlp = nn.Sequential(nn.Linear(2 * DIM, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            return self.mlp(torch.cat([self.user(users), self.item(items)], dim=1)).squeeze(1)

    model = TwoTower()
    kwargs = {"fused": True} if variant == "fixed" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
    gen = torch.Generator().manual_seed(1)
    data = [
        (torch.randint(0, ROWS, (BATCH, BAG), generator=gen), torch.randint(0, ROWS, (BATCH, BAG), generator=gen),
         torch.rand(BATCH, generator=gen).round())
        for _ in range(8)
    ]  # fmt: skip
    loss_fn = nn.BCEWithLogitsLoss()

    def step(i: int) -> None:
        users, items, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(users, items), y)
        loss.backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="optimizer_for_loop",
    category="cpu",
    cause="per_parameter_optimizer",
    expected_cases=["C-CPU-027"],
    description=(
        "AdamW with its CPU default (the for-loop implementation) on a two-tower recommender whose "
        "two 20k x 64 embedding tables get dense gradients: every step a dozen separate operators "
        "per tensor, each a pass over the tables and their optimizer states."
    ),
    fix="torch.optim.AdamW(..., fused=True): same model, data and hyper-parameters.",
    notes=[
        "A different model from the one C-CPU-027's gain range was measured on (the small_batch "
        "MLP in benchmarks/optimizer_impl_cpu.py): large tensors, memory passes rather than dispatch.",
        "One intra-op thread in both variants (2 shared cores).",
    ],
)

if __name__ == "__main__":
    common.main("optimizer_for_loop", make_run, LABEL)
