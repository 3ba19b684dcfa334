"""GPU scenario gpu_loader_transform: JPEG decoding and augmentation in the training process.

Model: the conv net of ``gpu_pageable_copy`` (channels_last, bf16 autocast, fused AdamW) on
batches of 128 images. The dataset is 512 JPEG files (256 x 256, quality 90, made once with PIL
in a temporary directory); each sample is read, decoded with PIL, randomly cropped and resized to
160 x 160, randomly flipped and normalised into a float tensor: the usual ImageNet-style
per-sample transform, written with PIL and NumPy (torchvision is not needed).

Injected (bad): ``DataLoader(num_workers=0)``, pageable batches: the training process decodes
and transforms every sample while the GPU waits.

Fix (fixed): ``num_workers=12, pin_memory=True, persistent_workers=True, prefetch_factor=4``
and ``non_blocking=True`` copies.

Expected: C-IO-001 (batches prepared in the training process with heavy per-sample work).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402
from gpu_pageable_copy import convnet  # noqa: E402

FILES, SRC, OUTSIDE, BATCH = g.size(512, 32), 256, g.size(160, 32), g.size(128, 8)
WORKERS = g.size(12, 2)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _write_jpegs(d: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(FILES):
        # smooth random images (low-frequency noise, upsampled): JPEG-sized like photos, not like noise
        small = rng.integers(0, 256, (SRC // 16, SRC // 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((SRC, SRC), Image.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        (d / f"{k:05d}.jpg").write_bytes(buf.getvalue())


class JpegFolder:
    def __init__(self, d: Path):
        self.files = sorted(d.glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, k: int):
        import numpy as np
        import torch
        from PIL import Image

        rng = np.random.default_rng(k + int.from_bytes(os.urandom(2), "little"))
        img = Image.open(self.files[k]).convert("RGB")
        s = int(rng.integers(SRC // 2, SRC + 1))
        x0, y0 = (int(v) for v in rng.integers(0, SRC - s + 1, 2))
        img = img.resize((OUTSIDE, OUTSIDE), Image.BILINEAR, box=(x0, y0, x0 + s, y0 + s))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        a = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(a.transpose(2, 0, 1).astype(np.float32)), k % 100


def make_run(variant: str) -> Run:
    import torch
    from torch.utils.data import DataLoader

    d = common.scratch_dir("gpu_jpegs_", _write_jpegs)
    torch.manual_seed(0)
    model = convnet().to(g.DEV, memory_format=torch.channels_last)
    opt = g.adamw(model.parameters())
    fixed = variant == "fixed"
    kw = dict(num_workers=WORKERS, pin_memory=g.CUDA, persistent_workers=True, prefetch_factor=4) if fixed else {}
    loader = DataLoader(JpegFolder(d), batch_size=BATCH, shuffle=True, drop_last=True, **kw)
    state = {"it": iter(loader)}

    def step(i: int) -> None:
        mon = common.running_monitor()
        try:
            x, y = next(state["it"]) if mon is None else next(state.setdefault("wrapped", mon.wrap(state["it"])))
        except StopIteration:
            state["it"] = iter(loader)
            state.pop("wrapped", None)
            x, y = next(state["it"])
        x, y = x.to(g.DEV, non_blocking=fixed), y.to(g.DEV, non_blocking=fixed)
        g.classifier_step(model, opt, x.contiguous(memory_format=torch.channels_last), y)

    def teardown() -> None:
        state.clear()

    return Run(step=step, samples_per_step=BATCH, device=g.DEV, teardown=teardown, timed_steps=20)


LABEL = Label(
    scenario="gpu_loader_transform",
    category="io",
    cause="slow_data_processing",
    expected_cases=["C-IO-001"],
    description="JPEG decode + random resized crop + flip + normalise of 128 images per step in the "
    "training process (num_workers=0, pageable batches) in front of a small bf16 conv net.",
    fix="num_workers=12, pin_memory=True, persistent workers, prefetch_factor=4, non_blocking copies.",
)

if __name__ == "__main__":
    common.main("gpu_loader_transform", make_run, LABEL)
