#!/usr/bin/env python3
"""Scenario gc_full_collections: occasional full garbage collections stall single steps.

Model: an MLP (512-1536-1536-1536-1536-10) trained with SGD + momentum on synthetic features,
batch 96, one intra-op thread (~80 ms a step here, so that parsing the annotations stays a small
share of it; no weight above 16 MB, so glibc keeps the freed blocks: gc_pressure.py's 3072-wide layers
make every step fault its 36 MB gradients in again, C-MON-012, a second problem). Seeds are fixed.

Data: a segmentation-style dataset. The training process holds the dataset's manifest (5k
records as dicts and lists, long-lived) and reads the annotations shard by shard: every 6
steps (576 samples) it drops the previous shard and parses the next one, a JSON-lines file
(one ``json.loads`` per sample; each sample a polygon of 200 [x, y] points: ~116k lists and
dicts per shard), kept for the shard's 6 steps.

Injected (bad): nothing but CPython's defaults (``gc.get_threshold() == (700, 10, 10)``). The
steps between shards allocate almost no container objects and never collect; each shard parse
allocates ~116k containers that stay alive, which trips ~160 young collections and a full one
(a full collection needs ~85k allocations through the two young generations, 11 x 11 x 700,
and objects promoted since the last full collection above a quarter of the long-lived ones:
each shard brings more than that) that scans every tracked object of the process: torch's own
modules and objects, the manifest, the shard. That collection takes ~100 ms on this machine,
in one step of six: an occasional long pause, not a per-step cost (a first version with
45k-container shards every 3 steps collected fully only every second shard, irregularly; one
with shards every 4 steps put two parses in some 6-step profiles, which made the parsing itself
a visible share of the fixed twin's profiled steps; so did batch 64: C-CPU-003 on the twin
profiled without GC recording, gc_full_collections_untraced.py).

Fix (fixed): the case's first advice: ``gc.collect(); gc.freeze()`` after setup (torch, the
model, the optimizer and the manifest move to the permanent generation and are never scanned
again) and ``gc.set_threshold(50_000, 10, 100)`` (``max(t0, 50_000), t1, max(t2, 100)``, the
case's snippet): the shard's objects are collected in one or two young collections, full
collections become rare. Same data, parsing and model.

Expected diagnosis: category cpu, cause gc_pauses, case C-CPU-010 (occasional long Python
garbage-collection pauses stall individual steps): in the 6 profiled steps one step collects
(every 6 consecutive steps hold one shard boundary), with a full collection of >= 10 ms. The monitor log shows the same problem as C-MON-001
(full collections make steps spike, again and again over the run), which counts too.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "gc_full_collections"
SEED = 0
BATCH = 96
FEATURES = 512
HIDDEN = 1536
MANIFEST = 5_000  # long-lived records held by the training process
SHARD_STEPS = 6  # a new annotation shard every 6 steps
SHARD = SHARD_STEPS * BATCH
POINTS = 200  # polygon points per sample
SHARDS = 6
FIXED_THRESHOLD = (50_000, 10, 100)

torch.set_num_threads(1)


def build_manifest() -> list[dict]:
    return [{"path": f"img/{i:07d}.png", "label": i % 10, "size": [512, 512]} for i in range(MANIFEST)]


def shard_lines() -> list[list[str]]:
    """The annotation shards as stored (JSON lines, one sample a line; read from disk in a real job)."""
    out = []
    for s in range(SHARDS):
        out.append([json.dumps({"id": s * SHARD + k, "label": (s * SHARD + k) % 10,
                                "segmentation": [[float((j * 3 + k) % 32), float((j * 7 + s) % 32)]
                                                 for j in range(POINTS)]})
                    for k in range(SHARD)])  # fmt: skip
    return out


_LINES: list[list[str]] | None = None


def make_run(variant: str) -> Run:
    global _LINES
    torch.manual_seed(SEED)
    if _LINES is None:
        _LINES = shard_lines()
    lines = _LINES
    manifest = build_manifest()
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(SEED)
    features = torch.randn(SHARD, FEATURES, generator=g)
    state: dict = {"ann": None}

    def setup() -> None:
        state["threshold"] = gc.get_threshold()
        if variant == "fixed":
            gc.collect()
            gc.freeze()  # torch, model, optimizer, manifest: never rescanned
            gc.set_threshold(*FIXED_THRESHOLD)

    def step(i: int) -> None:
        s, j = divmod(i, SHARD_STEPS)
        if j == 0 or state["ann"] is None:
            state["ann"] = None  # the previous shard is dropped first
            state["ann"] = [json.loads(line) for line in lines[s % SHARDS]]  # the next annotation shard
        recs = state["ann"][j * BATCH : (j + 1) * BATCH]
        y = torch.tensor([r["label"] for r in recs])
        x = features[j * BATCH : (j + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        state["seen"] = len(manifest)

    def teardown() -> None:
        threshold = state["threshold"]
        state.clear()
        gc.unfreeze()
        gc.set_threshold(*threshold)

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="gc_pauses",
    expected_cases=["C-CPU-010", "C-MON-001"],
    description=(
        "A 5k-record manifest is held by the process and every 6 steps the loop parses the next "
        "JSON-lines annotation shard (~116k lists and dicts, kept for the shard's 6 steps); with CPython's "
        "default thresholds each shard trips a full collection over all tracked objects "
        "(torch's, the manifest, the shard): one long pause in one step of six."
    ),
    fix="gc.collect(); gc.freeze() after setup and gc.set_threshold(50_000, 10, 100)",
    notes=[
        "The steps between shards allocate almost no container objects and never collect, so "
        "the collections land in 1 of 6 steps (steps_with_gc_ratio 0.17): the occasional-pause "
        "case C-CPU-010, not the every-step C-CPU-011 of gc_pressure.",
        "C-MON-001 is the same diagnosis from the monitor log (full collections make steps spike "
        "every 6 steps, each with a generation-2 collection); with both the log and the capture "
        "hermes ranks it next to C-CPU-010, so either counts.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
