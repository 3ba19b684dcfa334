"""Scenario explicit_gc_collect: gc.collect() called after every step "to keep memory down".

Model: an MLP (1024 -> 1536 -> 1536 -> 10) trained with AdamW (fused=True in both variants) on
synthetic data, batch 128, one intra-op thread: a step of some tens of milliseconds. The process
also holds what a training process holds in Python: torch itself (its modules, functions and
classes: 150k-280k tracked objects once torch and its compiler stack are imported, as
gc.get_objects() shows) and a sample index of 20k small records built at start-up.

Injected (bad): the loop calls gc.collect() at the end of every step (a habit copied from
notebooks, often next to torch.cuda.empty_cache()). A full collection walks every tracked
container of the process, whether or not there is garbage: on this machine 70-130 ms per call.

Fix (fixed): no explicit collection; the collector runs on its own thresholds (generation-0
collections, rare full ones). Where a collection is needed (after evaluation, at an epoch
boundary) it belongs there, not in the step.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from common import Label, Run  # noqa: E402

RECORDS = 20_000


def make_run(variant: str) -> Run:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1536), nn.ReLU(), nn.Linear(1536, 1536), nn.ReLU(), nn.Linear(1536, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(128, 1024, generator=gen), torch.randint(0, 10, (128,), generator=gen)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    state: dict = {}

    def setup() -> None:
        state["index"] = [{"path": f"shard{i % 64}/{i}.bin", "label": i % 10, "len": 100 + i % 50,
                           "tags": ("train", i % 3)} for i in range(RECORDS)]  # fmt: skip

    def teardown() -> None:
        state.clear()
        gc.collect()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if variant == "bad":
            gc.collect()

    return Run(step=step, setup=setup, teardown=teardown)


LABEL = Label(
    scenario="explicit_gc_collect",
    category="cpu",
    cause="explicit_gc_collect",
    expected_cases=["C-CPU-034"],
    description=(
        "gc.collect() at the end of every step of a ~tens-of-ms MLP step, in a process holding torch's own "
        "objects and a 20k-record Python sample index: every step pays a full collection over all of them."
    ),
    fix="No gc.collect() in the step (collect at epoch boundaries or after evaluation if at all).",
    notes=[
        "With with_stack=True the call shows as a '<built-in method collect of module object>' frame on "
        "the training thread; with record_python_gc_info the collection inside it is a 'Python GC' event.",
    ],
)

if __name__ == "__main__":
    common.main("explicit_gc_collect", make_run, LABEL)
