#!/usr/bin/env python3
"""Scenario compile_first_in_profile: the profile is taken over the job's first steps and holds
torch.compile's first compilation.

Model: an MLP (256 -> 1024 -> 1024 -> 10) compiled as a whole with torch.compile (Inductor, C++
backend) and trained with AdamW (fused=True) on synthetic data, batch 64, one intra-op thread.
The training is identical in both variants; what differs is which steps the profile holds.

Injected (bad): the profiler is started with the training loop, the way a first profile is
often taken (``with torch.profiler.profile(schedule=schedule(wait=0, warmup=0, active=7))``
around the loop from its first step): the profiled window is the job's first 7 steps, and the
first of them compiles the model (Dynamo, AOTAutograd, Inductor code generation and the C++
compiler), seconds against milliseconds for a compiled step. The __main__ block does this for
the bad run only: the harness's warm-up and monitored steps are skipped (common.WARMUP and
MONITORED_MAX_STEPS set to 0 while it profiles) and the profiler's schedule is replaced by
``schedule(wait=0, warmup=0, active=7)``, so every step from the first is recorded, each with
its ProfilerStep marker.

Fix (fixed): the case's advice, profile the steady state after compilation: the harness's
usual window (3 warm-up steps and the monitored steps first, then a profiler schedule with a
warm-up step and 6 active steps), in which the compiled model runs from its cache.

Both variants are profiled with with_stack=False (as dynamic_recompile.py: with Python stacks
the tracer records every call the compiler makes, a capture of over 100 MB); compilation still
shows as its record_function ranges. Each run starts with torch._dynamo.reset() and a fresh
Inductor cache (torch._inductor.utils.fresh_cache), so that the profiled run compiles from
scratch as a new job would. The timed rounds time the steady state (after the harness's 3
warm-up steps) in both variants: the compile is paid once per process, so the fix does not
speed training up (speedup_of_fix near 1.0, the case's gain range is 0); it makes the profile,
and the other findings, representative.

Expected diagnosis: category cpu, cause warmup_compilation_in_profile, case C-CPU-013.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "compile_first_in_profile"
BATCH = 64


def make_run(variant: str) -> Run:
    import torch
    import torch._dynamo
    import torch._inductor.config
    import torch._inductor.utils
    from torch import nn

    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, 256, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
            for _ in range(8)]  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        torch._dynamo.reset()
        state["cache"] = contextlib.ExitStack()
        state["cache"].enter_context(torch._inductor.utils.fresh_cache())
        state["cmodel"] = torch.compile(model)

    def teardown() -> None:
        state["cache"].close()
        state.clear()
        torch._dynamo.reset()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(state["cmodel"](x), y)
        loss.backward()
        opt.step()

    run = Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)
    run.profile_from_start = variant == "bad"  # read by the __main__ block's _profile wrapper
    return run


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="warmup_compilation_in_profile",
    expected_cases=["C-CPU-013"],
    description=(
        "A compiled MLP profiled over the job's first 7 steps (profiler started with the loop, "
        "schedule(wait=0, warmup=0, active=7)): the first step compiles the model (Dynamo, AOTAutograd, Inductor, C++ compiler) "
        "inside the profiled window."
    ),
    fix="profile after warm-up (the harness's window: warm-up and monitored steps, then a schedule with a warm-up step)",
    notes=[
        "The training is the same in both variants; the compile is paid once per process, so the "
        "timed steady state does not change (speedup near 1.0; the case predicts no gain).",
        "Both variants are profiled without Python stacks (see the module docstring).",
    ],
)


def _patch_harness() -> None:
    """Profile the bad run from its first step: no harness warm-up or monitored steps before the
    profiler, and a schedule without warm-up (every step recorded); no Python stacks in either run."""
    import torch.profiler

    profile_cls = torch.profiler.profile
    from_start = {"on": False}

    def profile(*args, **kwargs):
        kwargs["with_stack"] = False
        if from_start["on"]:
            kwargs["schedule"] = torch.profiler.schedule(wait=0, warmup=0, active=common.PROFILE_STEPS + 1, repeat=1)
        return profile_cls(*args, **kwargs)

    torch.profiler.profile = profile
    base = common._profile

    def _profile(run: Run, run_dir: Path) -> None:
        if not getattr(run, "profile_from_start", False):
            return base(run, run_dir)
        saved = common.WARMUP, common.MONITORED_MAX_STEPS
        common.WARMUP, common.MONITORED_MAX_STEPS = 0, 0
        from_start["on"] = True
        try:
            return base(run, run_dir)
        finally:
            common.WARMUP, common.MONITORED_MAX_STEPS = saved
            from_start["on"] = False

    common._profile = _profile


if __name__ == "__main__":
    _patch_harness()
    common.main(NAME, make_run, LABEL)
