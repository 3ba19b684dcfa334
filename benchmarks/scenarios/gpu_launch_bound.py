"""GPU scenario gpu_launch_bound: a small MLP at batch 8, one tiny kernel after another.

Model: 24 blocks of Linear(256, 256) + LayerNorm + GELU and a 10-way head (1.6 M parameters),
trained at batch 8 with fused AdamW: each step launches about 300 kernels of a few microseconds
each, and the host takes longer to launch each one than the GPU takes to run it.

Injected (bad): eager execution: the GPU idles between kernels while the host dispatches the next.

Fix (fixed): the whole step (forward, backward, AdamW with ``capturable=True``) captured once
into a CUDA graph and replayed each step after copying the batch into the graph's static input
(PyTorch's "whole network capture" recipe): one launch per step.

Expected: C-CPU-001 (launch-bound: kernels shorter than their launches) or C-CPU-002 (the device
waits for the host between kernels).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

BATCH, WIDTH, DEPTH = 8, 256, 24


def make_run(variant: str) -> Run:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10)).to(g.DEV)
    graphed = variant == "fixed" and g.CUDA
    opt = g.adamw(model.parameters(), capturable=graphed)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, WIDTH, generator=gen).to(g.DEV), torch.randint(0, 10, (BATCH,), generator=gen).to(g.DEV))
            for _ in range(16)]  # fmt: skip

    def eager(x, y) -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    if not graphed:
        return Run(step=lambda i: eager(*data[i % len(data)]), samples_per_step=BATCH, device=g.DEV, timed_steps=200)

    sx, sy = data[0][0].clone(), data[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before capture, as the recipe says
        for _ in range(3):
            eager(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(sx), sy).backward()
        opt.step()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()

    return Run(step=step, samples_per_step=BATCH, device=g.DEV, timed_steps=200)


LABEL = Label(
    scenario="gpu_launch_bound",
    category="cpu",
    cause="kernel_launch_bound",
    expected_cases=["C-CPU-001", "C-CPU-002"],
    description="A 24-block MLP of width 256 at batch 8 in eager mode: ~300 kernels of a few microseconds "
    "per step, each shorter than its launch.",
    fix="The whole training step captured once into a CUDA graph and replayed (AdamW capturable=True).",
)

if __name__ == "__main__":
    common.main("gpu_launch_bound", make_run, LABEL)
