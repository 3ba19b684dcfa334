"""Scenario metrics_in_step: per-class precision, recall and F1 computed in Python every step.

Model: an MLP classifier (128 -> 256 -> 256 -> 40 classes) on synthetic features, batch 64, SGD
with momentum (foreach), one intra-op thread: a step of about a millisecond of training.

Injected (bad): after the optimizer step the loop computes a classification report for the
batch, the way a hand-written training script logs it: for each class, true positives, false
positives and false negatives by boolean masks, each read back with ``.item()``, then precision,
recall and F1 in Python floats, for all 40 classes, in every step. None of it is forward,
backward or the optimizer: it is the user's own function in the step.

Fix (fixed): the predictions go into a confusion matrix kept on the device with one
``torch.bincount`` per step (no read-back), and the report is computed from it every 100 steps
(none falls in the timed or recorded steps).

Expected: C-PROG-001 (a function of the step does work besides training in every step), naming
``metrics_in_step.py: class_report``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

FEATURES, CLASSES, BATCH, EVERY = 128, 40, 64, 100


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, FEATURES, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
            for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    confusion = torch.zeros(CLASSES * CLASSES, dtype=torch.long)
    reports: list[dict] = []

    def class_report(pred, y) -> dict:
        out = {}
        for c in range(CLASSES):
            tp = ((pred == c) & (y == c)).sum().item()
            fp = ((pred == c) & (y != c)).sum().item()
            fn = ((pred != c) & (y == c)).sum().item()
            p = tp / (tp + fp) if tp + fp else 0.0
            r = tp / (tp + fn) if tp + fn else 0.0
            out[c] = (p, r, 2 * p * r / (p + r) if p + r else 0.0)
        return out

    def report_from_confusion() -> dict:
        m = confusion.view(CLASSES, CLASSES).double()
        tp = m.diag()
        p, r = tp / m.sum(0).clamp(min=1), tp / m.sum(1).clamp(min=1)
        return {"f1": (2 * p * r / (p + r).clamp(min=1e-9)).tolist()}

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        pred = out.detach().argmax(1)
        if variant == "bad":
            reports.append(class_report(pred, y))
        else:
            confusion.add_(torch.bincount(y * CLASSES + pred, minlength=CLASSES * CLASSES))
            if (i + 1) % EVERY == 0:
                reports.append(report_from_confusion())

    return Run(step=step)


LABEL = Label(
    scenario="metrics_in_step",
    category="cpu",
    cause="user_code_in_step",
    expected_cases=["C-PROG-001"],
    description=("Per-class precision, recall and F1 computed in Python after every optimizer step: 120 boolean-mask "
                 "reductions each read back with .item(), then Python arithmetic, for 40 classes."),
    fix="A confusion matrix updated on the device with one bincount per step; the report computed every 100 steps.",
    notes=["Recorded for issue 32 (the program-phase breakdown and its general cases), written from the mechanism: "
           "work the user's code adds to every step besides training."],
)

if __name__ == "__main__":
    common.main("metrics_in_step", make_run, LABEL)
