"""GPU scenario gpu_embedding_dense: a large embedding table gets a dense gradient and a dense
AdamW update every step although each batch looks up a tiny share of its rows.

Model: a recommendation-style network: one table of 2M x 128 embeddings (256M parameters), 26
lookups per sample summed per field and concatenated, a 3-layer MLP on top (bf16 autocast);
batches of 4096 samples whose ids are drawn from a Zipf law (106k lookups per step, most of them
of a few thousand hot rows), resident on the device.

Injected (bad): ``nn.Embedding(..., sparse=False)`` (the default) with fused AdamW over all
parameters: backward writes a zero-filled 2M x 128 gradient and scatters the looked-up rows into
it, and AdamW then reads and writes the whole table and both its moments (about 7 GB) every step.

Fix (fixed): ``nn.Embedding(..., sparse=True)`` with ``torch.optim.SparseAdam`` for the table
(only the rows looked up are updated) and fused AdamW for the MLP.

Expected: C-COMP-030 (embedding tables get a dense gradient every step).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

ROWS, DIM, FIELDS, BATCH = g.size(2_000_000, 10_000), 128, 26, g.size(4096, 64)


def make_run(variant: str) -> Run:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    sparse = variant == "fixed"
    torch.manual_seed(0)
    table = nn.Embedding(ROWS, DIM, sparse=sparse).to(g.DEV)
    mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                        nn.Linear(512, 1)).to(g.DEV)  # fmt: skip
    if sparse:
        opts = [torch.optim.SparseAdam(table.parameters(), lr=1e-3), g.adamw(mlp.parameters())]
    else:
        opts = [g.adamw([*table.parameters(), *mlp.parameters()])]
    rng = np.random.default_rng(1)
    data = []
    for _ in range(4):
        ids = (rng.zipf(1.2, (BATCH, FIELDS)) % ROWS).astype(np.int64)
        data.append((torch.from_numpy(ids).to(g.DEV), torch.rand(BATCH, 1).to(g.DEV)))

    def step(i: int) -> None:
        ids, y = data[i % len(data)]
        for o in opts:
            o.zero_grad(set_to_none=True)
        with g.autocast():
            out = mlp(table(ids).flatten(1))
        F.binary_cross_entropy_with_logits(out.float(), y).backward()
        for o in opts:
            o.step()

    return Run(step=step, samples_per_step=BATCH, device=g.DEV, timed_steps=40)


LABEL = Label(
    scenario="gpu_embedding_dense",
    category="computation",
    cause="embedding_dense_gradient",
    expected_cases=["C-COMP-030"],
    description="A recommendation model with a 2M x 128 embedding table (26 Zipf-distributed lookups per "
    "sample, batch 4096) trained with dense gradients and AdamW over the whole table.",
    fix="nn.Embedding(sparse=True) with torch.optim.SparseAdam for the table.",
)

if __name__ == "__main__":
    common.main("gpu_embedding_dense", make_run, LABEL)
