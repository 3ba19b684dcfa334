"""Scenario dynamic_recompile: torch.compile recompiles every step because the shape changes.

Model: a small token model (embedding 64, one pre-norm residual MLP block, mean-pool, linear
head) compiled with torch.compile (Inductor, C++ backend on the CPU) and trained with AdamW on
synthetic token batches (batch 8) whose sequence length changes every step (variable-length
text without bucketing). One intra-op thread.

Injected (bad): automatic dynamic shapes are off (torch._dynamo.config.automatic_dynamic_shapes
= False, as in code that relies on static shapes for speed) and the recompile limit is raised so
that Dynamo never falls back to eager: every step with a new sequence length fails the shape
guard and compiles a new forward + backward graph (Dynamo trace, AOTAutograd, Inductor C++
code generation and gcc) inside the step, seconds per step.

Fix (fixed): the same compiled model with the same static-shape setting, but the collate pads
each batch up to one of four bucket lengths (64, 96, 128, 160) and masks the padding in the
mean-pool: only four graphs exist, compiled once during warm-up, and the steady-state steps
compile nothing. (The FX graph cache is off in both variants, so every run compiles cold.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

BATCH = 8
VOCAB = 1000
BUCKETS = (64, 96, 128, 160)
# lengths: a new one every step, spread over 33-160; the warm-up steps (0-2) cover all 4 buckets
# only if they hit them, so the fixed variant pre-compiles the buckets in setup (see below)


def _length(i: int) -> int:
    return 33 + (i * 37) % 128


def make_run(variant: str) -> Run:
    import torch
    import torch._dynamo
    import torch._inductor.config
    from torch import nn

    torch.set_num_threads(1)
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.recompile_limit = 256
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.compile_threads = 1

    class TokenModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 64)
            self.norm = nn.LayerNorm(64)
            self.up = nn.Linear(64, 128)
            self.down = nn.Linear(128, 64)
            self.head = nn.Linear(64, 10)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.emb(ids)
            h = h + self.down(torch.relu(self.up(self.norm(h))))
            m = mask.unsqueeze(-1)
            return self.head((h * m).sum(1) / m.sum(1))

    torch.manual_seed(0)
    model = TokenModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def batch(i: int):
        g = torch.Generator().manual_seed(i)
        n = _length(i)
        ids = torch.randint(1, VOCAB, (BATCH, n), generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        if variant == "fixed":
            L = next(b for b in BUCKETS if b >= n)
            ids = torch.nn.functional.pad(ids, (0, L - n))  # pad id 0
        mask = (torch.arange(ids.shape[1]) < n).float().expand(BATCH, -1)
        return ids, mask, y

    def train(ids, mask, y) -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(state["cmodel"](ids, mask), y)
        loss.backward()
        opt.step()

    def setup() -> None:
        torch._dynamo.reset()
        state["cmodel"] = torch.compile(model)
        if variant == "fixed":  # warm-up: compile each bucket once, before the measured steps
            for L in BUCKETS:
                g = torch.Generator().manual_seed(10_000 + L)
                ids = torch.randint(1, VOCAB, (BATCH, L), generator=g)
                train(ids, torch.ones(BATCH, L), torch.randint(0, 10, (BATCH,), generator=g))

    def teardown() -> None:
        state.clear()
        torch._dynamo.reset()

    def step(i: int) -> None:
        train(*batch(i))

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="dynamic_recompile",
    category="cpu",
    cause="operator_compilation",
    expected_cases=["C-CPU-012"],
    description=(
        "A torch.compile'd token model with static shapes (automatic_dynamic_shapes=False) gets a "
        "new sequence length every step: every step recompiles forward and backward (Dynamo, "
        "AOTAutograd, Inductor C++ + gcc) inside the step."
    ),
    fix="Pad batches to 4 bucket lengths (64/96/128/160) with a mask: 4 graphs compiled in warm-up, none in the steps.",
    notes=[],
)

if __name__ == "__main__":
    common.main("dynamic_recompile", make_run, LABEL)
