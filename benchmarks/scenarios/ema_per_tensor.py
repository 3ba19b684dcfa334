"""Scenario ema_per_tensor: an exponential moving average of the weights updated tensor by tensor.

Model: a small Transformer encoder (2 layers, d_model 128, 4 heads, feed-forward 256) over
sequences of 32 tokens from a 1,000-word vocabulary, a mean-pooled 4-class head; AdamW
(fused=True in both variants), batch 16, one intra-op thread. 30 parameter tensors.

Injected (bad): after every optimizer step the loop refreshes an EMA copy of the weights the way
many training scripts write it: ``for e, p in zip(ema, params): e.mul_(decay).add_(p, alpha=1 -
decay)`` under no_grad, two operators per tensor, each paying Python and dispatch, 60 calls a
step.

Fix (fixed): one multi-tensor call, ``torch._foreach_lerp_(ema, params, 1 - decay)``.

Expected: C-PROG-002 (a Python loop issues one operator per tensor) or C-PROG-001 (the EMA
function besides training), naming ``ema_per_tensor.py: update_ema``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

VOCAB, SEQ, BATCH, DECAY = 1000, 32, 16, 0.999


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 128)
            layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(128, 4)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)).mean(1))

    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    params = [p for p in model.parameters()]
    ema = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen), torch.randint(0, 4, (BATCH,), generator=gen))
            for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    @torch.no_grad()
    def update_ema() -> None:
        if variant == "bad":
            for e, p in zip(ema, params):
                e.mul_(DECAY).add_(p, alpha=1 - DECAY)
        else:
            torch._foreach_lerp_(ema, params, 1 - DECAY)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        update_ema()

    return Run(step=step)


LABEL = Label(
    scenario="ema_per_tensor",
    category="cpu",
    cause="per_tensor_python_loop",
    expected_cases=["C-PROG-002", "C-PROG-001"],
    description=("An EMA of a Transformer encoder's 30 weight tensors refreshed with a Python loop (mul_ and add_ per "
                 "tensor) after every optimizer step."),
    fix="One torch._foreach_lerp_ over the lists.",
    notes=["Recorded for issue 32, written from the mechanism: a Python loop that issues operators once per tensor."],
)

if __name__ == "__main__":
    common.main("ema_per_tensor", make_run, LABEL)
