"""GPU scenario gpu_pageable_copy: input batches copied to the device from pageable host memory.

Model: a small convolutional network (4 conv-BN-ReLU stages, channels_last, bf16 autocast, fused
AdamW) on batches of 256 preprocessed FP32 images of 3 x 160 x 160 (78.6 MB a batch) held in host
memory, as a job that preprocesses on the CPU hands them over.

Injected (bad): ``batch.to("cuda")`` from ordinary (pageable) memory: the driver stages the copy
through its own pinned buffer at a fraction of the link's bandwidth, and the host waits for it
(a blocking copy), so nothing is launched meanwhile.

Fix (fixed): the host batches pinned once (``pin_memory()``, as ``DataLoader(pin_memory=True)``
does) and copied with ``non_blocking=True``: a DMA at full bandwidth, and the host goes on
launching.

Expected: C-IO-002 (batches copied from pageable memory).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

BATCH, SIDE, NBATCH = g.size(256, 8), g.size(160, 32), 6


def convnet():
    from torch import nn

    def stage(cin, cout):
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(*stage(3, 32), *stage(32, 64), *stage(64, 128), *stage(128, 256),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100))  # fmt: skip


def make_run(variant: str) -> Run:
    import torch

    torch.manual_seed(0)
    model = convnet().to(g.DEV, memory_format=torch.channels_last)
    opt = g.adamw(model.parameters())
    gen = torch.Generator().manual_seed(1)
    host = [(torch.randn(BATCH, 3, SIDE, SIDE, generator=gen), torch.randint(0, 100, (BATCH,), generator=gen))
            for _ in range(NBATCH)]  # fmt: skip
    pinned = variant == "fixed" and g.CUDA
    if pinned:
        host = [(x.pin_memory(), y.pin_memory()) for x, y in host]

    def step(i: int) -> None:
        x, y = host[i % NBATCH]
        x, y = x.to(g.DEV, non_blocking=pinned), y.to(g.DEV, non_blocking=pinned)
        g.classifier_step(model, opt, x.contiguous(memory_format=torch.channels_last), y)

    return Run(step=step, samples_per_step=BATCH, device=g.DEV, timed_steps=30)


LABEL = Label(
    scenario="gpu_pageable_copy",
    category="io",
    cause="pageable_host_to_device_copy",
    expected_cases=["C-IO-002"],
    description="78.6 MB FP32 image batches copied to the GPU from pageable host memory every step "
    "(blocking), in front of a small bf16 conv net.",
    fix="Host batches pinned once, copied with non_blocking=True.",
)

if __name__ == "__main__":
    common.main("gpu_pageable_copy", make_run, LABEL)
