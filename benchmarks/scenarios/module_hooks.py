"""Scenario module_hooks: activation and gradient monitoring hooks on every module, every step.

Model: an MLP with eight hidden layers (256 wide, ReLU), a 10-class head, AdamW (fused=True in
both variants), synthetic data, batch 64, one intra-op thread.

Injected (bad): a monitoring utility registers a forward hook on every module that records the
mean absolute activation, and a full backward hook on every Linear that records the norm of the
output gradient (the usual "watch the activations" debugging helper), and leaves them attached:
each hook is a Python call per module per step, and every full backward hook wraps the module's
inputs and outputs in BackwardHookFunction autograd nodes.

Fix (fixed): no hooks during the training steps (attach them for one step every few hundred
steps, or use the profiler / torch.nn.utils for occasional checks).
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
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(WIDTH, WIDTH)]
    for _ in range(DEPTH - 1):
        layers += [nn.ReLU(), nn.Linear(WIDTH, WIDTH)]
    model = nn.Sequential(*layers, nn.ReLU(), nn.Linear(WIDTH, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, WIDTH, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    stats: dict[str, torch.Tensor] = {}
    handles: list = []

    def watch_activation(name):
        def hook(module, args, output):
            stats[name] = output.detach().abs().mean()
        return hook

    def watch_gradient(name):
        def hook(module, grad_input, grad_output):
            stats[name + ".grad"] = grad_output[0].detach().norm()
        return hook

    def setup() -> None:
        if variant == "bad":
            for name, m in model.named_modules():
                if name:
                    handles.append(m.register_forward_hook(watch_activation(name)))
                if isinstance(m, nn.Linear):
                    handles.append(m.register_full_backward_hook(watch_gradient(name)))

    def teardown() -> None:
        for h in handles:
            h.remove()
        handles.clear()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="module_hooks",
    category="cpu",
    cause="module_hooks",
    expected_cases=["C-CPU-031"],
    description=(
        "A forward hook on each of the 17 modules and a full backward hook on each of the 9 Linear "
        "layers record activation and gradient statistics in every step."
    ),
    fix="No hooks during the training steps (attach them for one step every few hundred steps).",
    notes=[
        "The hooks show with with_stack=True as Python frames called from torch/nn/modules/module.py's "
        "hook-calling wrapper (other than the module's forward), torch/utils/hooks.py frames, and "
        "BackwardHookFunction / BackwardHookFunctionBackward operators.",
    ],
)

if __name__ == "__main__":
    common.main("module_hooks", make_run, LABEL)
