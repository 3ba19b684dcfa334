"""Scenario unfused_attention: a small transformer trained on CPU computes attention by hand.

Model: a one-layer decoder-only transformer (character-level language model: 256-token
vocabulary, d_model 256, 2 heads of 128, pre-LayerNorm, GELU MLP 4x, causal), context 1024,
batch 1, AdamW (fused=True in both variants), synthetic token data, one intra-op thread.

Injected (bad): the attention is written out the textbook way,
``softmax((q @ k^T) / sqrt(d) masked causally) @ v``: two batched matmuls, a scale, a masked
fill with a freshly built causal mask and a softmax, each a separate operator making its own
pass over the [1, 2, 1024, 1024] score tensor in forward and again in backward (the score matrix
and the softmax output are saved for backward).

Fix (fixed): ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``,
which on CPU runs the fused, blocked flash-attention kernel
(aten::_scaled_dot_product_flash_attention_for_cpu and its backward) and never stores the
full score matrix.

Both variants: glibc keeps freed memory (mallopt M_TRIM_THRESHOLD 1 GiB, M_MMAP_THRESHOLD
32 MiB, what MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ or jemalloc give, as the PyTorch
CPU tuning guide advises). Without it the bad variant's 8 MB score tensors are handed back to
the OS and faulted in again every step (about a tenth of the step in system time): a problem of
its own (C-MON-012), isolated here the way the fused AdamW isolates the optimizer's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

VOCAB, D, HEADS, LAYERS, CONTEXT, BATCH = 256, 256, 2, 1, 1024, 1


def make_run(variant: str) -> Run:
    import torch
    import torch.nn.functional as F
    from torch import nn

    common.keep_freed_memory()  # both variants (see the docstring)
    torch.set_num_threads(1)  # 2 shared cores: keep OpenMP noise out of the comparison
    torch.manual_seed(0)
    fused = variant == "fixed"

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
            if fused:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS)
                mask = torch.ones(n, n, dtype=torch.bool).triu(1)
                a = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, n, D))
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, D)
            self.pos = nn.Parameter(torch.zeros(CONTEXT, D))
            self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
            self.ln = nn.LayerNorm(D)
            self.head = nn.Linear(D, VOCAB)

        def forward(self, idx):
            return self.head(self.ln(self.blocks(self.tok(idx) + self.pos)))

    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=gen) for _ in range(8)]

    def step(i: int) -> None:
        seq = data[i % len(data)]
        x, y = seq[:, :-1], seq[:, 1:]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()

    return Run(step=step, samples_per_step=BATCH)


LABEL = Label(
    scenario="unfused_attention",
    category="computation",
    cause="unfused_attention",
    expected_cases=["C-COMP-008"],
    description=(
        "A one-layer character-level transformer (context 1024, 2 heads of 128) trained on CPU computes "
        "attention as q @ k^T, scale, causal masked_fill, softmax and @ v: separate operators, each passing "
        "over the 1x2x1024x1024 score tensor in forward and backward."
    ),
    fix="F.scaled_dot_product_attention(q, k, v, is_causal=True): the fused CPU flash-attention kernel.",
    notes=[
        "The score product shows as aten::matmul on [1,2,1024,128]x[1,2,128,1024] (bmm inside); with SDPA the "
        "trace has aten::_scaled_dot_product_flash_attention_for_cpu and its backward instead.",
        "One intra-op thread in both variants (2 shared cores); AdamW fused=True in both.",
        "Both variants keep freed memory in the process (glibc mallopt: trim threshold 1 GiB, mmap threshold "
        "32 MiB). Without it the bad variant also shows C-MON-012 (the score tensors' pages are returned to "
        "the OS and faulted in again every step, about 10% of the step in system time on the recording host): "
        "a consequence of materialising the scores, but a problem with a fix of its own, so it is isolated.",
    ],
)

if __name__ == "__main__":
    common.main("unfused_attention", make_run, LABEL)
