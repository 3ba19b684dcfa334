"""Scenario class_weights_in_step: class-balanced loss weights rebuilt in Python from every batch.

Model: a bag-of-words text classifier (an EmbeddingBag of 5,000 x 64 over 16 tokens a sample, a
linear layer to 100 classes), batch 512, SGD (foreach), one intra-op thread.

Injected (bad): before each forward the step counts the batch's labels with
``collections.Counter(y.tolist())`` and builds a class-balanced weight for every sample (the
"effective number of samples" weighting, (1 - beta) / (1 - beta ** n_class)) by walking the
batch in Python, reading each label back (``int(label)``): 512 read-backs, dictionary lookups
and float powers a step; the weighted loss then uses them.

Fix (fixed): the class counts are taken once over the whole training set with one
``torch.bincount`` before the loop, the class weights computed from them as a tensor, and the
per-sample weights gathered with one indexing operation (``class_weight[y]``).

Expected: C-PROG-001 (a function of the step does work besides training), naming
``class_weights_in_step.py: sample_weights``.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

VOCAB, TOKENS, CLASSES, BATCH, BETA = 5_000, 16, 100, 512, 0.999


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.EmbeddingBag(VOCAB, 64, mode="mean"), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, VOCAB, (BATCH, TOKENS), generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
            for _ in range(8)]
    counts_all = torch.bincount(torch.cat([y for _, y in data]), minlength=CLASSES).clamp(min=1).double()
    class_weight = ((1 - BETA) / (1 - BETA ** counts_all)).float()
    loss_fn = nn.CrossEntropyLoss(reduction="none")

    def sample_weights(y):
        if variant == "bad":
            counts = Counter(y.tolist())
            return torch.tensor([(1 - BETA) / (1 - BETA ** counts[int(label)]) for label in y])
        return class_weight[y]

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        w = sample_weights(y)
        opt.zero_grad(set_to_none=True)
        loss = (loss_fn(model(x), y) * w).sum() / w.sum()
        loss.backward()
        opt.step()

    return Run(step=step)


LABEL = Label(
    scenario="class_weights_in_step",
    category="cpu",
    cause="user_code_in_step",
    expected_cases=["C-PROG-001"],
    description=("Class-balanced loss weights rebuilt from every batch in Python: Counter(y.tolist()) and a walk over "
                 "the 512 labels reading each back with int(label) and computing its weight, before every forward."),
    fix="Class counts taken once with torch.bincount before the loop, weights as a tensor, gathered by indexing.",
    notes=["Recorded for issue 32, written from the mechanism: the user's code in the step, outside forward, "
           "backward and the optimizer (a Python walk over the samples)."],
)

if __name__ == "__main__":
    common.main("class_weights_in_step", make_run, LABEL)
