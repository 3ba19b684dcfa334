"""GPU scenario gpu_allocator_churn: variable-length batches near the memory limit fragment the
caching allocator, which then empties its cache and retries cudaMalloc inside the steps.

Model: the shared GPT ("balanced" size, bf16, fused AdamW; ``gpu_common``) on batches of 8
sequences whose length changes every step (a random multiple of 64 between 64 and 512 tokens, as
with unpadded variable-length data). The process may use only a little more than the peak of live
tensors of a longest-length step (``torch.cuda.set_per_process_memory_fraction``), as when a job
is sized to fill the GPU. The margin is found once, in the bad variant's process, before anything
is recorded: the largest of 1.15x, 1.08x, 1.04x, 1.02x the peak under which the default allocator
retries cudaMalloc in 24 variable-length steps (1.25x gave none on the H200 on 2026-11-28); it is
written to ``memory_limit.json`` beside the recordings and the fixed variant uses the same limit.

Injected (bad): PyTorch's default caching allocator: blocks cached for one step's sizes do not fit
the next step's, reserved memory hits the limit, and the allocator frees every cached block
(a device synchronisation and cudaFree calls) and calls cudaMalloc again: "alloc retries".

Fix (fixed): ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: segments grow and shrink in
place, so freed memory is reusable at any size and the limit is not hit. Both variants run in
fresh child processes (the setting is read when CUDA starts).

Expected: C-CPU-039 (device memory returned to the driver and allocated again inside the steps).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import gpu_common as g  # noqa: E402
from common import Label, Run  # noqa: E402

HEADROOMS = (1.15, 1.08, 1.04, 1.02)
LIMIT_FILE = Path(__file__).parent / "recorded" / "gpu_allocator_churn" / "memory_limit.json"


def _retries() -> int:
    import torch

    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))


def _calibrate(peak: int, total: int, run_steps) -> float:
    """The largest headroom under which the default allocator retries (see the module docstring)."""
    import torch

    chosen, tried = HEADROOMS[-1], []
    for h in HEADROOMS:
        torch.cuda.set_per_process_memory_fraction(min(1.0, h * peak / total))
        torch.cuda.empty_cache()
        before = _retries()
        try:
            run_steps(24)
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            tried.append({"headroom": h, "oom": True})
            chosen = tried[-2]["headroom"] if len(tried) > 1 else h
            break
        tried.append({"headroom": h, "retries": _retries() - before})
        chosen = h
        if tried[-1]["retries"] >= 3:
            break
    LIMIT_FILE.parent.mkdir(parents=True, exist_ok=True)
    LIMIT_FILE.write_text(json.dumps({"headroom": chosen, "peak_allocated_bytes": peak, "tried": tried}, indent=1) + "\n")
    return chosen


def make_run(variant: str) -> Run:
    import torch

    if g.CUDA:  # a previous run's model (the recording before a timing round) must be gone first
        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    model, opt, batches, train_step, cfg = g.gpt_training("balanced")
    ctx = cfg["ctx"]
    gen = torch.Generator().manual_seed(2)
    lengths = [int(v) * 64 for v in torch.randint(1, ctx // 64 + 1, (64,), generator=gen)] if not g.SMOKE else [32, 64]

    def step(i: int) -> None:
        x, y = batches.next()
        n = lengths[i % len(lengths)]
        train_step(x[:, :n].contiguous(), y[:, :n].contiguous())

    if g.CUDA:
        for _ in range(2):  # the longest step, twice (optimizer state exists after the first)
            train_step(*batches.next())
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        train_step(*batches.next())
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        total = torch.cuda.get_device_properties(0).total_memory
        if variant == "bad" and not LIMIT_FILE.is_file():
            headroom = _calibrate(peak, total, lambda n: [step(1000 + j) for j in range(n)])
        else:
            headroom = json.loads(LIMIT_FILE.read_text())["headroom"]
        torch.cuda.set_per_process_memory_fraction(min(1.0, headroom * peak / total))
        torch.cuda.empty_cache()

    return Run(step=step, samples_per_step=cfg["batch"], device=g.DEV, timed_steps=40)


LABEL = Label(
    scenario="gpu_allocator_churn",
    category="cpu",
    cause="device_memory_churn",
    expected_cases=["C-CPU-039"],
    description="A bf16 GPT on variable-length batches (64-512 tokens) with the process limited to a "
    "little more than the live-tensor peak (memory_limit.json): the default caching allocator fragments, empties its cache and retries "
    "cudaMalloc inside the steps.",
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
)

if __name__ == "__main__":
    common.main("gpu_allocator_churn", make_run, LABEL,
                variant_env={"bad": {"GPU_ZOO_VARIANT": "bad"},
                             "fixed": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
