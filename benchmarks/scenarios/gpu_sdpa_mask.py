"""GPU scenario gpu_sdpa_mask: causal attention passed as an explicit mask tensor keeps SDPA off
FlashAttention.

Model: the shared GPT loop (``gpu_common``, "device" size: 8 layers, d_model 1024, 16 heads of 64,
context 1024, batch 16, bf16 autocast, fused AdamW).

Injected (bad): attention calls ``F.scaled_dot_product_attention(q, k, v, attn_mask=causal)``
with a boolean lower-triangular mask built once, as code ported from a masked implementation
does, instead of ``is_causal=True``. FlashAttention takes no arbitrary mask, so SDPA dispatches
to the memory-efficient kernel, which reads the mask and computes the masked half too.

Fix (fixed): ``is_causal=True`` (the shared loop): SDPA runs FlashAttention.

Expected: C-COMP-032 (attention on the memory-efficient kernel instead of flash) as written; on
torch 2.11 on an H200 both variants ran cuDNN attention, and the mask cost the causal skip:
C-COMP-045 (explicit mask tensor) was added after that recording (label.json's notes).
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
    import torch.nn.functional as F

    attend = g.causal_attention
    if variant == "bad":
        ctx = g.gpt_config("device")["ctx"]
        causal = torch.ones(ctx, ctx, dtype=torch.bool, device=g.DEV).tril()

        def attend(q, k, v):
            t = q.shape[-2]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal[:t, :t])

    return g.gpt_run("device", timed_steps=30, attend=attend)


LABEL = Label(
    scenario="gpu_sdpa_mask",
    category="computation",
    cause="sdpa_efficient_not_flash",
    expected_cases=["C-COMP-045", "C-COMP-032"],
    description="A bf16 GPT whose causal attention passes a boolean mask tensor to "
    "F.scaled_dot_product_attention: SDPA runs the memory-efficient kernel, not FlashAttention.",
    fix="is_causal=True instead of the mask tensor.",
)

if __name__ == "__main__":
    common.main("gpu_sdpa_mask", make_run, LABEL)
