#!/usr/bin/env python3
"""Scenario torch_logs_left_on: torch.compile's debug logging left on in a training run.

Model: an MLP (256 -> 1024 -> 1024 -> 10) compiled with torch.compile (Inductor, C++ backend)
and trained with AdamW (fused=True) on synthetic data, batch 64, one intra-op thread.

Injected (bad): the job runs with ``TORCH_LOGS="+dynamo,+aot,+inductor,graph_breaks,recompiles"``
exported, left over from debugging a compilation problem (the scenario sets it in the process
environment before the run and applies it with ``torch._logging._init_logs()``, what torch does
at import when the variable is set). Dynamo, AOTAutograd and Inductor then log at DEBUG level:
every traced bytecode instruction, every graph, the generated code; tens of thousands of lines
on stderr while the model compiles.

Fix (fixed): the variable unset (torch's default logging: warnings only), the case's advice.

What it costs: the compilation (the harness's first warm-up step) takes longer with the debug
logs; once compiled, the steady-state steps log nothing (the guards and compiled code run
without logging), so the timed steps of both variants should match: the measured
speedup_of_fix is expected near 1.0, inside the case's own gain range (0-10%: "none when the
variable only logs at start-up"). The monitor records the environment of the run (TORCH_*
variables) and flags the setting; it cannot measure the cost, and says so.

Expected diagnosis: category cpu, cause debug_logging, case C-MON-011.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "torch_logs_left_on"
TORCH_LOGS = "+dynamo,+aot,+inductor,graph_breaks,recompiles"


def make_run(variant: str) -> Run:
    import torch
    import torch._logging._internal as tlog
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        # before the monitor starts (it records the environment at start) and before compiling
        state["old"] = os.environ.get("TORCH_LOGS")
        if variant == "bad":
            os.environ["TORCH_LOGS"] = TORCH_LOGS
        else:
            os.environ.pop("TORCH_LOGS", None)
        tlog._init_logs()
        torch._dynamo.reset()
        state["cmodel"] = torch.compile(model)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(state["cmodel"](x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        if state.get("old") is None:
            os.environ.pop("TORCH_LOGS", None)
        else:
            os.environ["TORCH_LOGS"] = state["old"]
        tlog._init_logs()

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=64)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="debug_logging",
    expected_cases=["C-MON-011"],
    description=(
        "A compiled MLP trained with TORCH_LOGS='+dynamo,+aot,+inductor,graph_breaks,recompiles' "
        "left exported from a debugging session: DEBUG logs of Dynamo, AOTAutograd and Inductor "
        "while compiling."
    ),
    fix="TORCH_LOGS unset (torch's default logging)",
    notes=[
        "The logs are written while the model compiles (the first warm-up step); the steady-state "
        "steps log nothing, so the timed steps of the two variants are expected to match "
        "(speedup near 1.0, within the case's 0-10% gain range).",
        "The variable is set in the process environment in setup(), before the harness starts the "
        "monitor (which records TORCH_* variables at start), and applied with torch._logging._init_logs().",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
