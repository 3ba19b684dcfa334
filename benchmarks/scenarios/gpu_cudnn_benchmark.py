"""GPU scenario gpu_cudnn_benchmark: convolutions with fixed shapes and cuDNN's autotuner off.

Model: a ResNet-style network (stem, 3 stages of 2 residual basic blocks with 64/128/256
channels, 3x3 convolutions) in channels_last with bf16 autocast and fused AdamW, on device-
resident batches of 128 images of 3 x 128 x 128: the input shape never changes.

Injected (bad): ``torch.backends.cudnn.benchmark = False`` (PyTorch's default): cuDNN picks each
convolution's algorithm by its heuristics.

Fix (fixed): ``torch.backends.cudnn.benchmark = True``: cuDNN times its algorithms for each
shape once (in the warm-up steps) and keeps the fastest.

Expected: none of the cases as written names this; the recording says how much the autotuner is
worth on this GPU (docs/accuracy.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

BATCH, SIDE = g.size(128, 4), g.size(128, 32)


def resnet():
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())  # fmt: skip

        def forward(self, x):
            h = self.b1(self.c1(x)).relu_()
            return (self.b2(self.c2(h)) + self.skip(x)).relu_()

    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2)):
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 100))


def make_run(variant: str) -> Run:
    import torch

    torch.backends.cudnn.benchmark = variant == "fixed"
    torch.manual_seed(0)
    model = resnet().to(g.DEV, memory_format=torch.channels_last)
    return g.classifier_run(model, g.adamw(model.parameters()), (BATCH, 3, SIDE, SIDE), 100, timed_steps=30,
                            memory_format=torch.channels_last)


LABEL = Label(
    scenario="gpu_cudnn_benchmark",
    category="computation",
    cause="cudnn_autotuner_off",
    expected_cases=[],
    description="A ResNet-style conv net with fixed 128 x 3 x 128 x 128 inputs (channels_last, bf16) "
    "trained with torch.backends.cudnn.benchmark = False.",
    fix="torch.backends.cudnn.benchmark = True.",
)

if __name__ == "__main__":
    common.main("gpu_cudnn_benchmark", make_run, LABEL)
