#!/usr/bin/env python3
"""Scenario gc_pressure: Python's cyclic garbage collector runs many times in every step.

Injected problem (variant "bad"): the training process holds a Python manifest of the dataset
(50k annotation records as dicts and lists, long-lived, next to torch's own ~165k tracked
objects), every step parses the batch's annotations into a tree of Python containers with
parent back-references (reference cycles: ~29k containers per step that only the cyclic
collector can free), and the collector runs with low thresholds (``gc.set_threshold(100, 5,
5)``, as some code bases set to "keep memory low"). The collector then runs hundreds of times
per step; the step's trees, still alive during those young collections, are promoted to the
oldest generation, so every few steps a full collection rescans all long-lived objects.

Fix (variant "fixed"): the same data, model and per-step parsing, with
``gc.collect(); gc.freeze()`` after setup (the manifest, model and optimizer move to the
permanent generation and are never scanned again) and ``gc.set_threshold(50_000, 20, 20)``, so
the step's cycles are collected in a few cheap young collections.

Model: an MLP (256-3072-3072-10) trained with SGD+momentum on synthetic features, batch 64; the
labels come from the parsed annotation trees. Seeds are fixed. The model is large enough that
the parsing itself stays a small share of the fixed step (6-8% measured): a first version
(MLP 256-512-512-10, 300 nodes per sample) spent 46-66% of its fixed step parsing in Python,
which hermes rightly reported on the twin as Python work in the step, a second problem.

The harness records with ``record_python_gc_info=True``, so every collection is a
"Python GC" event in the trace. The per-step parsing is written without Python-level calls in
its inner loops (literals and in-place list concatenation) so that with_stack=True does not
record one event per object.

Expected diagnosis: category cpu, cause garbage_collection (hermes: gc_pauses), case C-CPU-011
(Python garbage collection runs in most steps).

    cd /work/main && /tmp/torchvenv/bin/python benchmarks/scenarios/gc_pressure.py
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import Label, Run  # noqa: E402

NAME = "gc_pressure"
SEED = 0
BATCH = 64
FEATURES = 256
MANIFEST = 50_000  # long-lived annotation records held by the training process
NODES = 150  # annotation nodes parsed per sample and step (3 containers each)
HIDDEN = 3072
KIDS = tuple(range(NODES))
BAD_THRESHOLD = (100, 5, 5)
FIXED_THRESHOLD = (50_000, 20, 20)
# verify_secondary.py --check parse_off_step sets this False: the labels come parsed (as from
# DataLoader workers), so the step no longer parses (the recordings keep it True)
PARSE_IN_STEP = True

torch.set_num_threads(1)


def build_manifest() -> list[dict]:
    """The dataset's annotation index: long-lived Python containers (dicts and lists)."""
    return [
        {"path": f"img/{i:07d}.jpg", "label": i % 10, "boxes": [[float(i % 7), 2.0]]} for i in range(MANIFEST)
    ]


def parse_batch(manifest: list[dict], idx: list[int], back_refs: bool = True) -> list[int]:
    """Parse each sample's annotation into a tree whose children point back to their parent
    (cycles); ``back_refs=False`` makes them name the parent's record index instead (no cycles:
    reference counting frees the trees; verify_secondary.py's acyclic_parse check).

    No Python-level calls inside the loops (literals, subscripts, in-place concatenation), so a
    with_stack profile records a few events per batch, not one per object. Each child carries a
    24-element tag list: references the collector has to traverse.
    """
    roots: list = []
    labels: list = []
    for i in idx:
        rec = manifest[i]
        lb = rec["label"]
        root = {"rec": rec, "kids": [], "label": lb}
        parent = root if back_refs else i
        kids = root["kids"]
        for k in KIDS:
            kids += [{"parent": parent, "attrs": {"k": k, "w": 1.0}, "tags": [k, lb] * 12}]
        roots += [root]
        labels += [lb]
    return labels  # the trees become garbage (cycles) when the step ends


def make_run(variant: str) -> Run:
    torch.manual_seed(SEED)
    manifest = build_manifest()
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(SEED)
    features = torch.randn(4096, FEATURES, generator=g)
    order = torch.randperm(MANIFEST, generator=g)[: 64 * BATCH].tolist()
    state: dict = {}
    parsed = None if PARSE_IN_STEP else [parse_batch(manifest, order[j * BATCH : (j + 1) * BATCH]) for j in range(64)]

    def setup() -> None:
        state["threshold"] = gc.get_threshold()
        if variant == "bad":
            gc.set_threshold(*BAD_THRESHOLD)
        else:
            gc.collect()
            gc.freeze()  # manifest, model, optimizer: never rescanned
            gc.set_threshold(*FIXED_THRESHOLD)

    def step(i: int) -> None:
        j = i % 64
        idx = order[j * BATCH : (j + 1) * BATCH]
        y = torch.tensor(parse_batch(manifest, idx) if parsed is None else parsed[j])
        x = features[torch.tensor(idx) % 4096]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def teardown() -> None:
        gc.unfreeze()
        gc.set_threshold(*state["threshold"])

    return Run(step=step, setup=setup, teardown=teardown, samples_per_step=BATCH)


LABEL = Label(
    scenario=NAME,
    category="cpu",
    cause="garbage_collection",
    expected_cases=["C-CPU-011"],
    description=(
        "A 50k-record Python manifest is held by the training process; every step builds ~29k "
        "Python containers in reference cycles (annotation trees with parent back-references) "
        "and the collector runs with gc.set_threshold(100, 5, 5): hundreds of young collections "
        "per step, which promote the live trees, and a full collection rescanning all long-lived "
        "objects every few steps."
    ),
    fix="gc.collect(); gc.freeze() after setup and gc.set_threshold(50_000, 20, 20)",
    notes=[
        "hermes names this cause gc_pauses (C-CPU-010 / C-CPU-011); C-CPU-011 (collections in "
        "most steps) is the one whose diagnosis matches.",
    ],
)

if __name__ == "__main__":
    common.main(NAME, make_run, LABEL)
