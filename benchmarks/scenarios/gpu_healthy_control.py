"""GPU scenario gpu_healthy_control: a well-configured GPT training loop on the GPU, recorded twice.

Nothing is injected. A GPT (8 layers, d_model 1024, 16 heads, context 1024, vocabulary 8192) is
trained at batch 16 in bf16 autocast with fused AdamW and ``F.scaled_dot_product_attention``;
token windows are gathered on the host, pinned and copied with ``non_blocking=True``; nothing in
the step reads a value back or synchronises. The device is the bottleneck (the host launches a
step in well under the time the GPU takes to run it), as in a healthy job.

Both variants run the same code ("bad" and "fixed" are identical twins): the measured "speedup"
is run-to-run noise, and hermes should raise no high-severity finding on either recording. A
finding on the computation itself (GEMMs and attention are the step) is the expected residual.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    return g.gpt_run("device", timed_steps=30)


LABEL = Label(
    scenario="gpu_healthy_control",
    category="none",
    cause="none",
    expected_cases=[],
    description="A healthy bf16 GPT training loop on the GPU (device-bound, no synchronisation, "
    "pinned non-blocking input copies, fused AdamW, flash attention through SDPA).",
    fix="-",
    healthy=True,
    notes=["Both variants are the same code: the recorded pair is the healthy control recorded twice."],
)

if __name__ == "__main__":
    common.main("gpu_healthy_control", make_run, LABEL)
