"""How many cores this process may use (the affinity mask, not the machine's count)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
