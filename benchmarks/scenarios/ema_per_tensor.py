"""Scenario ema_per_tensor: an exponential moving average of the weights updated tensor by tensor.

Model: a deep, narrow residual MLP (48 blocks of Linear 64x64 + LayerNorm + ReLU, a 10-class
head: 194 parameter tensors, 0.2 M parameters) on synthetic features, AdamW (fused=True in
both variants), batch 32, one intra-op thread: many small tensors, as in the normalisation and
bias parameters of any deep model.

Injected (bad): after every optimizer step the loop refreshes an EMA copy of the weights the way
many training scripts (and timm's ModelEmaV2) write it: over the two state dicts, ``e.copy_(e *
decay + (1 - decay) * p)`` under no_grad, four operators per tensor, each paying Python and
dispatch, plus two ``state_dict()`` walks, every step.

Fix (fixed): the same two operations on the whole lists, ``torch._foreach_mul_`` and
``torch._foreach_add_``: two calls a step.

Expected: C-PROG-002 (a Python loop issues one operator per tensor) or C-PROG-001 (the EMA
function besides training), naming ``ema_per_tensor.py: update_ema``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

WIDTH, BLOCKS, BATCH, DECAY = 64, 48, 32, 0.999
# verify_secondary.py --check compile_mlp sets this True: the model's forward and backward run
# through torch.compile (the recordings keep it False)
COMPILE_MODEL = False


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH)

        def forward(self, x):
            return x + torch.relu(self.norm(self.lin(x)))

    model = nn.Sequential(*[Block() for _ in range(BLOCKS)], nn.Linear(WIDTH, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    params = [p for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    forward = torch.compile(model) if COMPILE_MODEL else model

    ema_model = copy.deepcopy(model)
    ema = list(ema_model.parameters())

    @torch.no_grad()
    def update_ema() -> None:
        if variant == "bad":
            for e, p in zip(ema_model.state_dict().values(), model.state_dict().values()):
                e.copy_(e * DECAY + (1 - DECAY) * p)
        else:
            torch._foreach_mul_(ema, DECAY)
            torch._foreach_add_(ema, params, alpha=1 - DECAY)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        update_ema()

    return Run(step=step)


LABEL = Label(
    scenario="ema_per_tensor",
    category="cpu",
    cause="per_tensor_python_loop",
    expected_cases=["C-PROG-002", "C-PROG-001", "C-CPU-045"],
    description=("An EMA of a deep narrow MLP's 194 weight tensors refreshed with a Python loop (mul_ and add_ per "
                 "tensor) after every optimizer step."),
    fix="torch._foreach_mul_ and torch._foreach_add_ over the lists: two calls a step.",
    notes=["Recorded for issue 32, written from the mechanism: a Python loop that issues operators once per tensor.",
           "C-CPU-045 (state copied every step, whose second fix is this scenario's: an in-place multi-tensor EMA) was "
           "added to the expected cases after hermes reported it first: the loop walks two state_dict()s every step."],
)

if __name__ == "__main__":
    common.main("ema_per_tensor", make_run, LABEL)
