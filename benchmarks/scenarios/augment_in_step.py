"""Scenario augment_in_step: per-sample augmentation in a Python loop inside the training step.

Model: a 1-D convolutional audio classifier (conv 1->16->32 over 1,000-sample clips, global
average pooling, 12 classes), batch 128, AdamW (fused=True in both variants), one intra-op
thread. The batches come from an in-memory list, as a pre-decoded dataset would give them.

Injected (bad): the step augments its batch sample by sample in Python before the forward:
for each clip a random gain, a random time shift (``torch.roll``), for half of them added noise,
and a peak normalisation, each a separate small operator on one row, 128 times a step. It is in the step, not in
the DataLoader, so no worker can take it.

Fix (fixed): the same augmentation for the whole batch at once: gains and noise as batched
tensor operations, the shifts as one gather with per-row offsets.

Expected: C-PROG-001 (a function of the step does work besides training), naming
``augment_in_step.py: augment``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

CLIP, BATCH, CLASSES = 1000, 128, 12
# verify_secondary.py --check augment_off_step sets this False: the batches come augmented (as from
# DataLoader workers), a second fix for the twin's remaining, vectorised augmentation
AUGMENT_IN_STEP = True


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 16, 9, stride=4), nn.ReLU(), nn.Conv1d(16, 32, 9, stride=4), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, CLASSES))  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, 1, CLIP, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
            for _ in range(8)]
    aug = torch.Generator().manual_seed(2)
    loss_fn = nn.CrossEntropyLoss()
    positions = torch.arange(CLIP)

    def augment(x):
        if variant == "bad":
            out = []
            for clip in x:
                gain = float(torch.empty(1).uniform_(0.8, 1.2, generator=aug))
                shift = int(torch.randint(-100, 100, (1,), generator=aug))
                c = torch.roll(clip * gain, shift, dims=-1)
                if float(torch.rand(1, generator=aug)) < 0.5:
                    c = c + 0.01 * torch.randn(c.shape, generator=aug)
                c = c / c.abs().max().clamp(min=1e-6)  # peak-normalise the clip
                out.append(c)
            return torch.stack(out)
        gain = torch.empty(BATCH, 1, 1).uniform_(0.8, 1.2, generator=aug)
        shift = torch.randint(-100, 100, (BATCH, 1, 1), generator=aug)
        idx = (positions.view(1, 1, -1) - shift) % CLIP
        out = torch.gather(x * gain, 2, idx)
        noisy = torch.rand(BATCH, generator=aug) < 0.5
        out[noisy] += 0.01 * torch.randn((int(noisy.sum()), 1, CLIP), generator=aug)
        return out / out.abs().amax(2, keepdim=True).clamp(min=1e-6)

    ready = None if AUGMENT_IN_STEP else [(augment(x), y) for x, y in data]

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        x = augment(x) if ready is None else ready[i % len(ready)][0]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step)


LABEL = Label(
    scenario="augment_in_step",
    category="cpu",
    cause="user_code_in_step",
    expected_cases=["C-PROG-001"],
    description=("Random gain, shift, noise and peak normalisation applied clip by clip in a Python loop inside the "
                 "training step of a 1-D conv audio classifier (128 clips, several small operators each, every step)."),
    fix="The same augmentation as batched tensor operations (one gather for the per-row shifts).",
    notes=["Recorded for issue 32, written from the mechanism: the user's code in the step, outside forward, "
           "backward and the optimizer, and outside the DataLoader (no worker can take it)."],
)

if __name__ == "__main__":
    common.main("augment_in_step", make_run, LABEL)
