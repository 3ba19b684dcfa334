"""Analyzers: pure functions of one rank's frames (or of every rank's digest) that return typed
facts (hermes_kb.analyzers).

One folder per dimension of the analysis, one module per mechanism (docs/architecture.md):
``timeline/`` (steps, overlap, critical path, breakdown, fluctuation), ``io/``, ``host/``
(launch, dispatch, Python), ``compute/``, ``comm/`` (collectives, buckets, parallelism),
``npu/``, ``monitor/`` (the monitor's logs), ``whatif/`` (the sets a fix shortens, the replay);
beside them what they share: ``context`` (a rank's frames and step windows), ``intervals``
(interval arithmetic) and ``selection`` (events by name, thread and step window).
Which of them run, in which order, and what each hands to the next through ``ctx.shared`` is
written in hermes_kb/analysis/registry.py, the only module that imports them to run them.

This folder lives at the repository root (the design's layout) and is always imported as
``hermes_kb.analyzers``: a wheel ships it inside the package, a source checkout maps it there
(hermes_kb/_finder.py).
"""

if __name__ != "hermes_kb.analyzers":  # imported from the repository root as ``analyzers``
    raise ImportError(f"import hermes_kb.analyzers, not {__name__}: the analyzers are one package, "
                      "and a second name would give a second copy of every module")
