"""Scenario compiled_small_fn: a tiny helper wrapped in torch.compile and called many times per step.

Model: an eager MLP with eight hidden layers (256 wide) whose activation is a small custom
function (a scaled GELU with a learnable-free bias shift), a 10-class head, AdamW (fused=True in
both variants), synthetic data, batch 64, one intra-op thread.

Injected (bad): the activation helper is decorated with torch.compile "to fuse it". It is called
eight times in the forward of every step; each call goes through Dynamo's frame evaluation and
guard check, the AOTAutograd runtime wrappers and the compiled graph, and its backward through a
compiled backward graph: a fixed per-call host cost that is larger than the few element-wise
operations it replaces on a (64, 256) activation.

Fix (fixed): the helper runs eagerly (no torch.compile on it). Compiling the whole model (one
region per step) is the other fix; the twin keeps the model eager so that the difference is the
per-call cost alone. Each run starts with torch._dynamo.reset(); compilation happens in the
harness's warm-up steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

WIDTH, DEPTH = 256, 8


def make_run(variant: str) -> Run:
    import torch
    import torch._dynamo
    import torch._inductor.config
    from torch import nn

    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1

    def scaled_gelu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x - 0.1) * 1.1

    state: dict = {"act": scaled_gelu}

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
            self.head = nn.Linear(WIDTH, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for lin in self.layers:
                x = state["act"](lin(x))
            return self.head(x)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, WIDTH, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def setup() -> None:
        torch._dynamo.reset()
        state["act"] = torch.compile(scaled_gelu) if variant == "bad" else scaled_gelu

    def teardown() -> None:
        state["act"] = scaled_gelu
        torch._dynamo.reset()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="compiled_small_fn",
    category="cpu",
    cause="compiled_call_overhead",
    expected_cases=["C-CPU-033"],
    description=(
        "A two-operation activation helper wrapped in torch.compile is called 8 times per forward: "
        "16 compiled calls per step (forward and backward), each paying Dynamo's guard check and the "
        "compiled-code wrappers for a few microseconds of arithmetic."
    ),
    fix="The helper runs eagerly (or the whole model is compiled as one region).",
    notes=[
        "The calls show as 'Torch-Compiled Region: 0/0' (8 per step), 'TorchDynamo Cache Lookup' and "
        "CompiledFunction / CompiledFunctionBackward, each with a short '## Call CompiledFxGraph ##' inside.",
    ],
)

if __name__ == "__main__":
    common.main("compiled_small_fn", make_run, LABEL)
