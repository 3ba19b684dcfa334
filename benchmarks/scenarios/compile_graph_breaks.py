#!/usr/bin/env python3
"""Scenario compile_graph_breaks: a data-dependent check in every block splits the compiled model.

Model: an MLP of four residual blocks (Linear 256-256, GELU, LayerNorm), a 10-class head,
compiled as a whole with torch.compile (Inductor, C++ backend), AdamW (fused=True in both
variants), synthetic data, batch 64, one intra-op thread.

Injected (bad): each block guards its activations with a Python branch on a tensor value,
``if h.abs().amax() > LIMIT: h = h.clamp(-LIMIT, LIMIT)`` (a "safety clamp" against
exploding activations, written the way eager code writes it). ``bool(tensor)`` in the branch
is data-dependent control flow: Dynamo breaks the graph there, runs the branch in Python and
resumes in a new frame (``torch_dynamo_resume_in_forward_at_*``), so the forward runs as
several compiled regions per step, each with its own guard check, runtime wrappers and
autograd function, and nothing is fused across the breaks. The activations stay below the
limit, so the branch is never taken (one resume frame per block, each compiled once in the
harness's warm-up steps: no recompilation in the measured steps).

Fix (fixed): the case's advice: the branch becomes a tensor operation with the same values,
``h = h.clamp(-LIMIT, LIMIT)`` (a no-op while the activations stay below the limit, the clamp
when they do not), and the model is compiled with ``fullgraph=True`` so that any new break
fails loudly: one compiled region per step.

Each run starts with torch._dynamo.reset(); compilation happens in the harness's warm-up steps.

Expected diagnosis: category cpu, cause compile_graph_breaks, case C-CPU-032 (graph breaks split
the model into several compiled regions per step; the resume frames name them).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "compile_graph_breaks"
WIDTH, BLOCKS, BATCH = 256, 4, 64
LIMIT = 1e4  # far above the activations: the clamp never changes a value


def make_run(variant: str) -> Run:
    import torch
    import torch._dynamo
    import torch._inductor.config
    from torch import nn

    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(WIDTH, WIDTH)
            self.norm = nn.LayerNorm(WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = nn.functional.gelu(self.lin(x))
            if variant == "bad":
                if h.abs().amax() > LIMIT:  # data-dependent branch: a graph break
                    h = h.clamp(-LIMIT, LIMIT)
            else:
                h = h.clamp(-LIMIT, LIMIT)  # same values, no branch
            return self.norm(x + h)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
            self.head = nn.Linear(WIDTH, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
            for _ in range(8)]  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        torch._dynamo.reset()
        state["cmodel"] = torch.compile(model, fullgraph=variant == "fixed")

    def teardown() -> None:
        state.clear()
        torch._dynamo.reset()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(state["cmodel"](x), y)
        loss.backward()
        opt.step()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="compile_graph_breaks",
    expected_cases=["C-CPU-032"],
    description=(
        "A whole-model torch.compile of 4 residual MLP blocks, each with a safety clamp written as a "
        "Python branch on a tensor value (if h.abs().amax() > LIMIT: ...): a graph break per block, "
        "the forward runs as several compiled regions plus Dynamo resume frames every step."
    ),
    fix="h = h.clamp(-LIMIT, LIMIT) without the branch, torch.compile(model, fullgraph=True): one region per step",
    notes=[
        "The branch is never taken (activations stay far below LIMIT), so the two variants compute "
        "the same values and no frame recompiles in the measured steps.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
