"""GPU scenario gpu_sdpa_math: the fused attention backends switched off, SDPA on its math path.

Model: the shared GPT loop (``gpu_common``, "device" size: 8 layers, d_model 1024, 16 heads of 64,
context 1024, batch 16, bf16 autocast, fused AdamW).

Injected (bad): ``torch.backends.cuda.enable_flash_sdp(False)``, ``enable_mem_efficient_sdp(False)``
and ``enable_cudnn_sdp(False)``, as left behind from chasing a numerical difference: every
``F.scaled_dot_product_attention`` call runs the math path (a batched matmul for the scores, the
full 1024 x 1024 score matrix per head in memory, softmax, a second matmul; the same in backward).

Fix (fixed): the switches left at their defaults: FlashAttention.

Expected: C-COMP-007 (SDPA falls back to its unfused math path).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402


def make_run(variant: str) -> Run:
    import torch

    on = variant == "fixed"
    torch.backends.cuda.enable_flash_sdp(on)
    torch.backends.cuda.enable_mem_efficient_sdp(on)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(on)
    return g.gpt_run("device", timed_steps=30)


LABEL = Label(
    scenario="gpu_sdpa_math",
    category="computation",
    cause="sdpa_math_fallback",
    expected_cases=["C-COMP-007"],
    description="A bf16 GPT trained with SDPA's flash, memory-efficient and cuDNN backends switched "
    "off: attention runs the unfused math path (score matrix in memory, separate softmax).",
    fix="The SDPA backend switches left at their defaults (FlashAttention).",
)

if __name__ == "__main__":
    common.main("gpu_sdpa_math", make_run, LABEL)
