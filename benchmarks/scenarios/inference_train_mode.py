"""Scenario inference_train_mode: an evaluation loop runs the model without model.eval().

Model: a small Wide-ResNet-style CNN for 3x32x32 images (stem conv 3->32, two pre-activation
residual blocks at 32 channels and 32x32, two at 64 channels and 16x16, each
BN-ReLU-conv3x3-Dropout(0.3)-BN-ReLU-conv3x3 as in WRN, global pooling, a 10-class head),
batch 32, synthetic images, one intra-op thread, forward only under torch.inference_mode() in
both variants (the usual evaluation / offline-inference loop: a validation pass, a throughput
benchmark, batch scoring).

Injected (bad): the model is left in training mode (it is built and loaded, never switched with
model.eval()): every Dropout draws a Bernoulli mask over its 32x32x32x32 or 32x64x16x16
activation, rescales it and multiplies it in, and every BatchNorm computes the batch's mean and
variance, normalises with them and updates its running averages. Besides the time, the outputs
are random and depend on the batch.

Fix (fixed): model.eval() before the loop (dropout becomes the identity, batch norm uses its
running statistics in a single pass), as the case advises; the loop stays under
torch.inference_mode().
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

BATCH = 32


def make_run(variant: str) -> Run:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)  # 2 shared cores: keep OpenMP noise out of the comparison
    torch.manual_seed(0)

    class WideBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.drop = nn.Dropout(0.3)
            self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.short = None if cin == cout and stride == 1 else nn.Conv2d(cin, cout, 1, stride, bias=False)

        def forward(self, x):
            o = F.relu(self.bn1(x))
            y = self.conv2(F.relu(self.bn2(self.drop(self.conv1(o)))))
            return y + (x if self.short is None else self.short(o))

    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        WideBlock(32, 32, 1), WideBlock(32, 32, 1),
        WideBlock(32, 64, 2), WideBlock(64, 64, 1),
        nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    if variant == "fixed":
        model.eval()
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(BATCH, 3, 32, 32, generator=gen) for _ in range(8)]
    preds: list = []

    def step(i: int) -> None:
        with torch.inference_mode():
            preds.append(model(data[i % len(data)]).argmax(-1))
        if len(preds) > 16:
            preds.clear()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="inference_train_mode",
    category="computation",
    cause="train_mode_inference",
    expected_cases=["C-COMP-039"],
    description=(
        "A forward-only evaluation loop (torch.inference_mode) of a small Wide-ResNet-style CNN with "
        "BatchNorm and Dropout(0.3) in each block, left in training mode: every forward draws dropout masks "
        "and computes batch-norm batch statistics."
    ),
    fix="model.eval() before the loop (still under torch.inference_mode()).",
    notes=[
        "Not a training run: the step is one forward pass of a validation / batch-scoring loop, the "
        "situation the case describes; samples_per_step is the batch.",
        "On CPU the training behaviour shows as aten::dropout(train=True) calling aten::bernoulli_, div_ "
        "and mul, and aten::native_batch_norm with training=True (its Concrete Inputs, recorded with "
        "record_shapes).",
        "One intra-op thread in both variants (2 shared cores).",
    ],
)

if __name__ == "__main__":
    common.main("inference_train_mode", make_run, LABEL)
