"""Advisor: from matches of the knowledge base to the Report (docs/advice.md).

``run`` analyses an input of any kind and assembles the one Report; ``diagnose`` turns matches
into ranked ``findings`` with ``gains`` from the what-if replay (``combined`` for the first fixes
together), folds findings that claim the same time (``ranking``) and lists the bottlenecks no
case explains (``unexplained``); ``report`` is the Report's model (docs/report.schema.json).
"""

from __future__ import annotations

from .diagnose import diagnose
from .findings import findings_from, severity_of
from .knowledge import knowledge_base
from .report import SEVERITY_ORDER, Report
from .run import Advised, advise, advise_bundle, advise_bundle_full, advise_run_dir, advise_run_dir_full

__all__ = ["SEVERITY_ORDER", "Advised", "Report", "advise", "advise_bundle", "advise_bundle_full", "advise_run_dir",
           "advise_run_dir_full", "diagnose", "findings_from", "knowledge_base", "severity_of"]  # fmt: skip
