"""Scenario dist_slow_rank_data: one rank of a 2-rank DDP job waits longer for its batches.

Model: the zoo's small CNN (conv 3->16->32, two linear layers; common.small_cnn) on 3x32x32
images, wrapped in DistributedDataParallel (gloo, 2 ranks on one host, one process and one
intra-op thread each), AdamW (fused=True), batch 32 per rank, 10 classes. Each rank reads its own
shard of uint8 images through a DataLoader (num_workers=0: the batches are prepared in the
training process; a batch is read with one indexing operation, ``Dataset.__getitems__``) and a
batched transform that converts the images to float and normalises them.
The loop is ``for batch in mon.wrap(loader)``, so the monitor records the time blocked on the
next batch (common_dist.py runs the job).

Injected (bad): rank 1's shard was written at the source resolution (3x256x256) while rank 0's
was pre-resized to 3x32x32 when the shards were made, so rank 1's transform also downsamples
every batch of images (bilinear, antialiased) to 32x32 on the fly: rank 1 takes several ms longer than
rank 0 to prepare each batch, and rank 0 waits for it at every gradient all-reduce.

Fix (fixed): rank 1's shard pre-resized like the others (the resize done once, offline): both
ranks prepare equal batches with the same transform.

Both variants: glibc keeps freed memory (common.keep_freed_memory). Without it both variants
fault ~1.4k pages per step back in and C-MON-012 reports it on the fixed twin too (its fix timed
1.04x, 1.25x and 1.04x there in three checks): a problem of its own, isolated here.

Expected: C-MON-005 (one rank waits longer for its data, the job runs at its pace), from the
monitor logs of both ranks: rank 1's data wait per step exceeds rank 0's while both step at the
same pace.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
import common_dist  # noqa: E402
from common import small_cnn  # noqa: E402
from common_dist import Label, Run  # noqa: E402

BATCH, SHARD, RAW = 32, 256, 256


def _as_is(batch):
    return batch


def make_run(variant: str, rank: int, world: int) -> Run:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    common.keep_freed_memory()  # both variants (see the docstring)
    torch.manual_seed(0)
    model = DDP(small_cnn())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    raw = RAW if variant == "bad" and rank == 1 else 32  # the resolution this rank's shard is stored at
    gen = torch.Generator().manual_seed(1 + rank)
    images = torch.randint(0, 256, (SHARD, 3, raw, raw), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (SHARD,), generator=gen)
    mean = torch.tensor([0.49, 0.48, 0.45]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.24, 0.26]).view(1, 3, 1, 1)

    class Shard(Dataset):
        """A batch is read with one indexing operation (``__getitems__``), not sample by sample."""

        def __len__(self) -> int:
            return SHARD

        def __getitems__(self, idx: list[int]):
            k = torch.tensor(idx)
            return images[k], labels[k]

    def transform(batch):
        x, y = batch
        x = x.float().div_(255.0)
        if x.shape[-1] != 32:
            x = F.interpolate(x, size=(32, 32), mode="bilinear", antialias=True, align_corners=False)
        return (x - mean) / std, y

    loader = DataLoader(Shard(), batch_size=BATCH, shuffle=True, num_workers=0, drop_last=True,
                        collate_fn=_as_is, generator=torch.Generator().manual_seed(2 + rank))  # fmt: skip

    def batches():
        while True:  # epochs back to back; the transform runs per batch, inside next()
            for b in loader:
                yield transform(b)

    def step(i: int, batch) -> None:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return Run(step=step, batches=batches, samples_per_step=BATCH)


LABEL = Label(
    scenario="dist_slow_rank_data",
    category="parallel",
    cause="slow_rank",
    expected_cases=["C-MON-005"],
    description=(
        "A 2-rank DDP job (gloo, CPU) whose rank 1 reads a shard stored at 256x256 and resizes every batch to "
        "32x32 in its data transform (rank 0's shard is stored at 32x32): rank 1 waits longer for each "
        "batch, and rank 0 waits for rank 1 at every gradient all-reduce."
    ),
    fix="Pre-resize rank 1's shard offline like the others: equal data preparation on every rank.",
    notes=[
        "The batches are prepared in the training process (num_workers=0), so rank 1's data wait is CPU work "
        "of its own process; the monitor tells it from compute by the time blocked in next(loader).",
        "Both variants keep freed memory in the process (glibc mallopt: trim threshold 1 GiB, mmap threshold "
        "32 MiB). Recorded without it first (2026-11-25), both variants faulted ~1.4k pages per step and "
        "C-MON-012 was reported on the fixed twin; its fix timed 1.04x, 1.25x and 1.04x there (the system time "
        "it counts also holds gloo's socket I/O), so it is isolated as the other scenarios isolate theirs.",
    ],
)

if __name__ == "__main__":
    common_dist.main("dist_slow_rank_data", make_run, LABEL)
