"""GPU scenario gpu_launch_blocking: ``CUDA_LAUNCH_BLOCKING=1`` left set in the job's environment.

Model: the shared GPT loop ("balanced" size, bf16, fused AdamW; ``gpu_common``).

Injected (bad): the process starts with ``CUDA_LAUNCH_BLOCKING=1`` (a debugging setting for
reading CUDA errors at the line that caused them): every kernel launch returns only when the
kernel has finished, so host and device never overlap: a step costs the host's launch time plus
the device's run time.

Fix (fixed): the variable unset. Both variants run in fresh child processes (the setting is read
when CUDA starts).

Expected: C-MON-010 (launch blocking on, from the monitor's record of the environment) or
C-CPU-008 (synchronous launches, from the trace).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    return g.gpt_run("balanced", timed_steps=30)


LABEL = Label(
    scenario="gpu_launch_blocking",
    category="cpu",
    cause="synchronous_kernel_launch",
    expected_cases=["C-MON-010", "C-CPU-008"],
    description="CUDA_LAUNCH_BLOCKING=1 in the environment of a bf16 GPT training job: every launch waits "
    "for its kernel.",
    fix="CUDA_LAUNCH_BLOCKING unset.",
)

if __name__ == "__main__":
    common.main("gpu_launch_blocking", make_run, LABEL,
                variant_env={"bad": {"CUDA_LAUNCH_BLOCKING": "1"}, "fixed": {"GPU_ZOO_VARIANT": "fixed"}})
