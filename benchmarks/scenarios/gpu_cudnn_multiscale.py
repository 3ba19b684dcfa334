"""GPU scenario gpu_cudnn_multiscale: cuDNN's autotuner on while every batch has a new image size.

Model: the ResNet-style network of ``gpu_cudnn_benchmark`` (channels_last, bf16 autocast, fused
AdamW) trained multi-scale: each batch of 64 images is resized to its own height and width, drawn
from 96..320 pixels in steps of 8 (841 shapes), as detection and segmentation training does.

Injected (bad): ``torch.backends.cudnn.benchmark = True``: cuDNN times every algorithm of every
convolution for each new input shape, inside the step that first meets it; with hundreds of
shapes nearly every step meets a new one.

Fix (fixed): ``torch.backends.cudnn.benchmark = False`` (heuristic algorithm choice; tuning pays
only when shapes repeat).

Expected: C-CPU-015 (kernel autotuning runs inside the training steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402
from gpu_cudnn_benchmark import resnet  # noqa: E402

BATCH = g.size(64, 4)
SIDES = list(range(96, 321, 8)) if not g.SMOKE else [24, 32]
RUNS = {"bad": 0, "fixed": 0}  # runs made per variant in this process: each starts at its own offset


def make_run(variant: str) -> Run:
    import torch

    torch.backends.cudnn.benchmark = variant == "bad"
    torch.manual_seed(0)
    model = resnet().to(g.DEV, memory_format=torch.channels_last)
    opt = g.adamw(model.parameters())
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, max(SIDES), max(SIDES), generator=gen).to(g.DEV)
    labels = torch.randint(0, 100, (BATCH,), generator=gen).to(g.DEV)
    # one shape sequence for both variants; the recording and each timing round start at their own
    # offset, so the two variants meet the same shapes in the same order in each round
    order = torch.randint(0, len(SIDES), (8192, 2), generator=torch.Generator().manual_seed(7))
    base = 1000 * RUNS[variant]
    RUNS[variant] += 1

    def step(i: int) -> None:
        h, w = (SIDES[int(j)] for j in order[(base + i) % len(order)])
        x = images[:, :, :h, :w].contiguous(memory_format=torch.channels_last)
        g.classifier_step(model, opt, x, labels)

    # 8 steps per timing round: a tuning step takes ~2 s on the H200 (30 did not fit the lease)
    return Run(step=step, samples_per_step=BATCH, device=g.DEV, timed_steps=8)


LABEL = Label(
    scenario="gpu_cudnn_multiscale",
    category="cpu",
    cause="autotuning_in_steps",
    expected_cases=["C-CPU-015"],
    description="A ResNet-style conv net trained multi-scale (a new image size nearly every batch, "
    "841 shapes) with torch.backends.cudnn.benchmark = True: cuDNN autotunes inside the steps.",
    fix="torch.backends.cudnn.benchmark = False.",
)

if __name__ == "__main__":
    common.main("gpu_cudnn_multiscale", make_run, LABEL)
