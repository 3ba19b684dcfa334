"""Scenario anomaly_detection: autograd anomaly detection left on in a training run.

Model: a small MLP classifier (256 -> 512 -> 512 -> 10) trained with AdamW (fused=True in both
variants) on synthetic data, batch 64, one intra-op thread (as sync_logging.py).

Injected (bad): torch.autograd.set_detect_anomaly(True) stays on for the whole run (debugging
code that was never removed, or a `detect_anomaly` context around the training loop). In
anomaly mode every operator that records an autograd node captures the Python stack of its
caller (torch.fx.traceback.format_stack, formatted text stored in the node's metadata), and the
autograd engine checks every gradient each backward node returns for NaN (isnan, any, and a
read-back of the answer to the host: a synchronisation per node on a GPU).

Fix (fixed): anomaly detection off (the default); turn it on only to hunt a NaN, for a few steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def setup() -> None:
        torch.autograd.set_detect_anomaly(variant == "bad")

    def teardown() -> None:
        torch.autograd.set_detect_anomaly(False)  # global: the next run of the same process starts clean

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="anomaly_detection",
    category="cpu",
    cause="autograd_anomaly_detection",
    expected_cases=["C-CPU-029"],
    description=(
        "torch.autograd.set_detect_anomaly(True) stays on during training: every forward operator "
        "captures and formats the Python stack, and every backward node's gradients are checked for NaN."
    ),
    fix="Anomaly detection off (the default); enable it only for the few steps of a NaN hunt.",
    notes=[
        "With with_stack=True the stack captures show as torch/fx/traceback.py format_stack frames "
        "inside the forward operators, the NaN checks as aten::isnan / aten::_is_any_true / aten::item "
        "operators inside each 'autograd::engine::evaluate_function:' node.",
    ],
)

if __name__ == "__main__":
    common.main("anomaly_detection", make_run, LABEL)
