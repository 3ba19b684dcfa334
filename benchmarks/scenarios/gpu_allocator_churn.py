"""GPU scenario gpu_allocator_churn: variable-length batches near the memory limit fragment the
caching allocator, which then empties its cache and retries cudaMalloc inside the steps.

Model: the shared GPT ("balanced" size, bf16, fused AdamW; ``gpu_common``) on batches of 8
sequences whose length changes every step (a random multiple of 64 between 64 and 512 tokens, as
with unpadded variable-length data). The process may use only 1.25x the peak of live tensors of
a longest-length step (``torch.cuda.set_per_process_memory_fraction``, measured at start in each
variant alike), as when a job is sized to fill the GPU.

Injected (bad): PyTorch's default caching allocator: blocks cached for one step's sizes do not fit
the next step's, reserved memory hits the limit, and the allocator frees every cached block
(a device synchronisation and cudaFree calls) and calls cudaMalloc again: "alloc retries".

Fix (fixed): ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: segments grow and shrink in
place, so freed memory is reusable at any size and the limit is not hit. Both variants run in
fresh child processes (the setting is read when CUDA starts).

Expected: C-CPU-039 (device memory returned to the driver and allocated again inside the steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

HEADROOM = 1.25


def make_run(variant: str) -> Run:
    import torch

    model, opt, batches, train_step, cfg = g.gpt_training("balanced")
    ctx = cfg["ctx"]
    gen = torch.Generator().manual_seed(2)
    lengths = [int(v) * 64 for v in torch.randint(1, ctx // 64 + 1, (64,), generator=gen)] if not g.SMOKE else [32, 64]
    if g.CUDA:
        for _ in range(2):  # the longest step, twice (optimizer state exists after the first)
            x, y = batches.next()
            train_step(x, y)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        x, y = batches.next()
        train_step(x, y)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, HEADROOM * peak / total))
        torch.cuda.empty_cache()

    def step(i: int) -> None:
        x, y = batches.next()
        n = lengths[i % len(lengths)]
        train_step(x[:, :n].contiguous(), y[:, :n].contiguous())

    return Run(step=step, samples_per_step=cfg["batch"], device=g.DEV, timed_steps=40)


LABEL = Label(
    scenario="gpu_allocator_churn",
    category="cpu",
    cause="device_memory_churn",
    expected_cases=["C-CPU-039"],
    description="A bf16 GPT on variable-length batches (64-512 tokens) with the process limited to 1.25x "
    "the live-tensor peak: the default caching allocator fragments, empties its cache and retries "
    "cudaMalloc inside the steps.",
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
)

if __name__ == "__main__":
    common.main("gpu_allocator_churn", make_run, LABEL,
                variant_env={"bad": {"GPU_ZOO_VARIANT": "bad"},
                             "fixed": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
