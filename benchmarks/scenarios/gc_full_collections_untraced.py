#!/usr/bin/env python3
"""Scenario gc_full_collections_untraced: gc_full_collections.py profiled the way most profiles
are taken, without recording the garbage collector.

Same training, injected problem and fix as gc_full_collections.py (every 6 steps a JSON-lines
annotation shard of ~116k lists and dicts is parsed, one ``json.loads`` per sample, and with
CPython's default thresholds each shard trips a full collection over every tracked object;
fixed: ``gc.collect(); gc.freeze()`` after setup and ``gc.set_threshold(50_000, 10, 100)``).

The difference is the profile: torch.profiler's default configuration, without
``experimental_config=_ExperimentalConfig(record_python_gc_info=True)`` (the __main__ block
drops it from the harness's profiler call; Python stacks stay on). The trace then has no
'Python GC' events: the full collection shows only as one ``json.loads`` call (of the 576 per
shard) that takes ~100 ms against a median of tens of microseconds, host time no operator
covers under ordinary Python code that is neither I/O nor a wait. The monitor still times
every collection through gc.callbacks (its log is unchanged).

Expected diagnosis: category cpu, cause gc_pauses, case C-CPU-028 (ordinary Python code stops
for milliseconds at irregular points: garbage collection, most likely); C-MON-001, the same
diagnosis from the monitor log, counts too.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402
from gc_full_collections import LABEL as TRACED_LABEL  # noqa: E402
from gc_full_collections import make_run  # noqa: E402

NAME = "gc_full_collections_untraced"

LABEL = replace(
    TRACED_LABEL,
    scenario=NAME,
    expected_cases=["C-CPU-028", "C-MON-001"],
    notes=[
        "gc_full_collections.py's run, profiled without record_python_gc_info (torch.profiler's "
        "default): the collections are not in the trace; each full collection shows as one "
        "json.loads call far above the median of its calls.",
        "C-MON-001 is the same diagnosis from the monitor log, which times every collection with "
        "gc.callbacks whatever the profiler records; either counts.",
    ],
)


def _profile_without_gc_info() -> None:
    import torch.profiler

    profile_cls = torch.profiler.profile

    def profile(*args, **kwargs):
        kwargs.pop("experimental_config", None)  # torch.profiler's default: collections not recorded
        return profile_cls(*args, **kwargs)

    torch.profiler.profile = profile


if __name__ == "__main__":
    _profile_without_gc_info()
    common.main(NAME, make_run, LABEL)
