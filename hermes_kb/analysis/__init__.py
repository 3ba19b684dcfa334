"""Analysis: the only code that runs analyzers (hermes_kb/analyzers/).

``registry`` lists them in their order with what each reads from and gives to the shared
context; ``rank`` runs one rank through them and the job through the cross-rank ones; ``run``
does a whole TraceBundle (forked workers per rank); ``run_dir`` a monitor RUN_DIR (its logs and
captures); ``replay`` and ``replay_store`` hold a rank's what-if replay state for the advisor.
Facts come out; nothing here knows a rule or a case.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..facts.base import Fact
from ..trace import TraceBundle, load
from .run import analyze_bundle, analyze_with_replay
from .run_dir import analyze_run_dir, as_run_dir


def analyze(path_or_bundle: TraceBundle | str | os.PathLike | Sequence, *, max_workers: int | None = None) -> list[Fact]:
    """Facts about a trace: ``hermes_kb.analyze("trace.json.gz")`` or ``analyze(bundle)``."""
    if not isinstance(path_or_bundle, TraceBundle):
        if (run_dir := as_run_dir(path_or_bundle)) is not None:  # a monitor RUN_DIR (rank<R>.jsonl)
            return analyze_run_dir(run_dir, max_workers=max_workers).facts
    bundle = path_or_bundle if isinstance(path_or_bundle, TraceBundle) else load(path_or_bundle, max_workers=max_workers)
    return analyze_bundle(bundle, max_workers=max_workers)


__all__ = ["analyze", "analyze_bundle", "analyze_run_dir", "analyze_with_replay", "as_run_dir"]
