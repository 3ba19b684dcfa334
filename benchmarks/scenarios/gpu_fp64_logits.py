"""GPU scenario gpu_fp64_logits: a float64 tensor from NumPy silently turns the loss into FP64.

Model: the shared GPT loop (``gpu_common``, "device" size with a 32768-token vocabulary: 8 layers,
d_model 1024, context 1024, batch 16, bf16 autocast, fused AdamW).

Injected (bad): logit adjustment by a unigram prior (``logits + log_prior``) whose prior was built
with NumPy (``torch.from_numpy(np.log(freq))`` is float64): adding it to the FP32 logits promotes
the (16 x 1024 x 32768) logits to float64, so the addition, log-softmax, loss and their backward
run as FP64 kernels over half a billion elements.

Fix (fixed): the prior converted once with ``.float()``: the same arithmetic in FP32.

Expected: C-COMP-028 (kernels compute in double precision on the device).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

VOCAB = 32768


def make_run(variant: str) -> Run:
    import numpy as np
    import torch

    vocab = g.size(VOCAB, g.gpt_config("device")["vocab"])
    freq = np.random.default_rng(3).zipf(1.3, vocab).astype(np.float64)
    prior = torch.from_numpy(np.log(freq / freq.sum())).to(g.DEV)  # float64, as NumPy made it
    if variant == "fixed":
        prior = prior.float()
    return g.gpt_run("device", timed_steps=30, vocab=VOCAB, logits_fn=lambda z: z + prior)


LABEL = Label(
    scenario="gpu_fp64_logits",
    category="computation",
    cause="fp64_on_device",
    expected_cases=["C-COMP-028"],
    description="A bf16 GPT (32k vocabulary) whose logits get a float64 NumPy prior added before the "
    "loss: the logits, log-softmax and loss run in FP64.",
    fix="The prior converted to float32 once (.float()).",
)

if __name__ == "__main__":
    common.main("gpu_fp64_logits", make_run, LABEL)
