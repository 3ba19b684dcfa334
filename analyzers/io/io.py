"""io analyzer: data-loader wait and its make-up, untraced host time, host-to-device copies.

Facts (hermes_kb/facts/io.py; formulas in docs/analysis/io.md):

* ``dataloader_wait`` (io/dataloader.py): per step that has DataLoader ``__next__`` annotations
  (at most ``MAX_STEP_FACTS`` steps, the ones with the longest wait) and one aggregate: wait time,
  share of the step and of the critical path, what runs inside the iterator (cpu ops, Python,
  untraced), and the Hermes paper's queue-based split adapted to traces (processing, reading,
  fetching, waiting for workers, unattributed) with the largest part as classification.
* ``untraced_host_time`` (io/untraced.py): per step (same cap) and aggregate: host time on the
  host threads outside every cpu op and user annotation, split into Python work and untraced
  time, with the longest gaps and the events around them.
* ``h2d_copies`` (io/h2d.py): per source memory kind (pageable / pinned / other), over all
  analysed steps.

Reads ``ctx.shared["critical_path"][step]`` when the critical_path analyzer left it (a DataFrame
with ``start_us, end_us, category, name``); works without it. Leaves nothing in ``ctx.shared``.
"""

from __future__ import annotations

from hermes_kb.facts.base import Fact

from ..context import RankContext
from ..selection import host_tids, python_stacks
from .dataloader import dataloader_wait
from .h2d import h2d_copies
from .untraced import untraced_host_time


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    tids = host_tids(ctx.trace)
    stacks = python_stacks(ctx.trace)
    facts: list[Fact] = []
    facts.extend(dataloader_wait(ctx, tids, stacks))
    facts.extend(untraced_host_time(ctx, tids, stacks))
    facts.extend(h2d_copies(ctx))
    return facts
