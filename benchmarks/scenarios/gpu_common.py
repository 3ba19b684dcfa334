"""What the GPU scenarios share: the device, a small GPT trained in bf16, and its token batches.

The GPU zoo (``gpu_*.py``) is recorded on a real GPU with ``common.py``'s protocol (``Run(device=
"cuda")``). Every twin must be healthy apart from the one injected problem, so the shared training
step is the well-configured one: bf16 autocast, fused AdamW, ``F.scaled_dot_product_attention``,
batches staged through pinned memory and copied with ``non_blocking=True``, no synchronisation.

Without a GPU the scripts fall back to the CPU with small sizes (``SMOKE``): that only checks that
they run; such a run is never committed (``record_gpu.sh`` refuses to record without a GPU).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
SMOKE = not CUDA


def size(gpu: int, smoke: int) -> int:
    """``gpu`` on the GPU, ``smoke`` in a CPU smoke run."""
    return smoke if SMOKE else gpu


def autocast():
    """bf16 autocast on the GPU (nothing in a CPU smoke run)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if CUDA else contextlib.nullcontext()


def adamw(params, **kw) -> torch.optim.Optimizer:
    """AdamW with its fused multi-tensor kernel (one launch for all parameters)."""
    return torch.optim.AdamW(params, lr=3e-4, fused=True, **kw)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal self-attention through SDPA with ``is_causal=True`` (FlashAttention on the GPU)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, attend=causal_attention):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attend(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int, attend=causal_attention):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, attend) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class TokenBatches:
    """Random windows of a token corpus held on the host, gathered each step, pinned and copied
    to the device with ``non_blocking=True``, as a DataLoader with ``pin_memory=True`` hands them
    over (the caching host allocator reuses a pinned block only once its copy has finished)."""

    def __init__(self, batch: int, ctx: int, vocab: int, tokens: int = 1 << 22, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.corpus = torch.randint(0, vocab, (tokens,), generator=g, dtype=torch.int64)
        self.g, self.batch, self.ctx = g, batch, ctx

    def host(self) -> torch.Tensor:
        starts = torch.randint(0, self.corpus.numel() - self.ctx - 1, (self.batch,), generator=self.g)
        return torch.stack([self.corpus[i : i + self.ctx + 1] for i in starts.tolist()])

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.host()
        dev = (x.pin_memory() if CUDA else x).to(DEV, non_blocking=True)
        return dev[:, :-1], dev[:, 1:]


def gpt_config(scale: str) -> dict:
    """Model and batch sizes: "device" keeps the GPU busy (the device is the bottleneck, host time
    under half the device time); "balanced" gives host and device similar time per step."""
    if SMOKE:
        return {"vocab": 512, "d": 64, "layers": 2, "heads": 2, "ctx": 64, "batch": 4}
    if scale == "device":
        return {"vocab": 8192, "d": 1024, "layers": 8, "heads": 16, "ctx": 1024, "batch": 16}
    return {"vocab": 8192, "d": 768, "layers": 6, "heads": 12, "ctx": 512, "batch": 8}


def gpt_training(scale: str, seed: int = 0, attend=causal_attention, vocab: int | None = None, logits_fn=None):
    """(model, optimizer, batches, train_step, cfg) of the shared healthy GPT loop; ``train_step(x,
    y)`` returns the loss tensor without reading it. ``attend`` replaces the attention call,
    ``vocab`` the vocabulary size, ``logits_fn`` what is done to the FP32 logits before the loss
    (the scenarios that inject a problem there)."""
    cfg = gpt_config(scale)
    if vocab and not SMOKE:
        cfg["vocab"] = vocab
    torch.manual_seed(seed)
    model = GPT(cfg["vocab"], cfg["d"], cfg["layers"], cfg["heads"], cfg["ctx"], attend).to(DEV)
    opt = adamw(model.parameters())
    batches = TokenBatches(cfg["batch"], cfg["ctx"], cfg["vocab"])

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = model(x)
        logits = logits.float() if logits_fn is None else logits_fn(logits.float())
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, batches, train_step, cfg


def classifier_step(model, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, cast=autocast) -> None:
    """One training step of a classifier: forward under ``cast()``, FP32 cross-entropy, backward,
    optimizer step (the loss is never read back)."""
    opt.zero_grad(set_to_none=True)
    with cast():
        out = model(x)
    F.cross_entropy(out.float(), y).backward()
    opt.step()


def classifier_run(model, opt: torch.optim.Optimizer, x_shape: tuple[int, ...], classes: int, timed_steps: int,
                   cast=autocast, memory_format=torch.contiguous_format):
    """A classifier trained on four device-resident batches of random inputs (``x_shape``, the batch
    first) and labels, taken in turn: the input path costs nothing, as the scenarios need."""
    from common import Run

    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(*x_shape, generator=gen).to(DEV, memory_format=memory_format),
             torch.randint(0, classes, (x_shape[0],), generator=gen).to(DEV)) for _ in range(4)]  # fmt: skip
    return Run(step=lambda i: classifier_step(model, opt, *data[i % len(data)], cast=cast), samples_per_step=x_shape[0],
               device=DEV, timed_steps=timed_steps)


def gpt_run(scale: str, timed_steps: int, **training):
    """The shared GPT loop as a scenario Run (every step: next batch, train step); ``training``
    goes to gpt_training (attend, vocab, logits_fn)."""
    from common import Run

    _, _, batches, train_step, cfg = gpt_training(scale, **training)
    return Run(step=lambda i: train_step(*batches.next()), samples_per_step=cfg["batch"], device=DEV,
               timed_steps=timed_steps)


def gelu_tanh_by_hand(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def rmsnorm_by_hand(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w
