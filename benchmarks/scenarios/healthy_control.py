#!/usr/bin/env python3
"""Scenario healthy_control: a well-configured small training loop with no injected problem.

Nothing is injected. A small transformer classifier (token embedding, 2 pre-norm encoder
layers with d_model=64, 4 heads, feed-forward 128, mean pooling, linear head) is trained with
AdamW (fused=True, the fastest implementation on a CPU) on synthetic token sequences (batch 64,
length 32, vocabulary 1000). The data are tensors already in memory, shuffled once; each step
slices its batch (no per-sample Python work), there is no logging, synchronisation,
checkpointing or Python-object churn in the step, the garbage collector keeps its default
settings, and the process uses one intra-op thread (the machine has 2 cores and is shared, so
more threads would oversubscribe it).

Both variants run exactly the same code ("bad" and "fixed" are identical twins): the measured
"speedup" is the run-to-run noise of this machine, and hermes should raise no high-severity
finding on either trace. A finding that names the computation itself (the step is operator
time, as it should be) is the expected residual, not an alarm.

Expected: category "none", expected_cases [] (healthy=True).

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/healthy_control.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "healthy_control"
SEED = 0
BATCH = 64
SEQ = 32
VOCAB = 1000
D_MODEL = 64
STEPS_OF_DATA = 32

torch.set_num_threads(1)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(
            D_MODEL, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.emb(tokens) + self.pos)
        return self.head(h.mean(dim=1))


def make_run(variant: str) -> Run:
    # the variant is ignored on purpose: both twins are the same healthy loop
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    n = BATCH * STEPS_OF_DATA
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    labels = tokens[:, :4].sum(dim=1) % 10  # a learnable target
    perm = torch.randperm(n, generator=g)
    tokens, labels = tokens[perm].contiguous(), labels[perm].contiguous()
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> None:
        j = (i % STEPS_OF_DATA) * BATCH
        x, y = tokens[j : j + BATCH], labels[j : j + BATCH]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="none",
    cause="none",
    expected_cases=[],
    description=(
        "A well-configured small transformer classifier (2 encoder layers, d_model 64) trained "
        "with AdamW on in-memory token batches: no injected problem."
    ),
    fix="none needed: the bad and fixed variants are identical twins",
    healthy=True,
    notes=[
        "Both variants run the same code; speedup_of_fix measures run-to-run noise (expected ~1.0).",
        "Expected from hermes: no high-severity finding; at most a computation finding naming "
        "the operators themselves.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
