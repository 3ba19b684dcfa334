"""GPU scenario gpu_conv_nchw: a conv net trained in bf16 in the default NCHW memory format.

Model: the ResNet-style network of ``gpu_cudnn_benchmark`` (3 stages of residual blocks, 64/128/256
channels) with bf16 autocast, fused AdamW and ``cudnn.benchmark`` on, on device-resident batches
of 128 images of 3 x 128 x 128.

Injected (bad): model and inputs left in NCHW (PyTorch's default): cuDNN's tensor-core kernels
for bf16 work in NHWC, so the convolutions convert their inputs and outputs around each call
(``nchwToNhwc`` / ``nhwcToNchw`` kernels), and batch norm and the element-wise ops run on NCHW.

Fix (fixed): ``model.to(memory_format=torch.channels_last)`` and channels_last inputs.

Expected: C-COMP-022 (convolutions convert NCHW tensors to NHWC and back around every call).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402
from gpu_cudnn_benchmark import BATCH, SIDE, resnet  # noqa: E402


def make_run(variant: str) -> Run:
    import torch

    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if variant == "fixed" else torch.contiguous_format
    torch.manual_seed(0)
    model = resnet().to(g.DEV, memory_format=fmt)
    return g.classifier_run(model, g.adamw(model.parameters()), (BATCH, 3, SIDE, SIDE), 100, timed_steps=30,
                            memory_format=fmt)


LABEL = Label(
    scenario="gpu_conv_nchw",
    category="computation",
    cause="conv_layout_transposes",
    expected_cases=["C-COMP-022"],
    description="A ResNet-style conv net trained in bf16 with model and inputs in NCHW: cuDNN converts "
    "layouts around every convolution.",
    fix="model and inputs in torch.channels_last.",
)

if __name__ == "__main__":
    common.main("gpu_conv_nchw", make_run, LABEL)
