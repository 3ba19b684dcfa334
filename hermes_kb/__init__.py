"""hermes: an expert system that explains why deep-learning training is slow.

The stable Python API (see docs/api.md):

    import hermes_kb
    bundle = hermes_kb.load("trace.json.gz")        # -> TraceBundle
    facts = hermes_kb.analyze(bundle)               # -> list[Fact]
    report = hermes_kb.advise(bundle)               # -> Report (findings, expected speedups)

Names are imported on first use, so that light parts (``hermes_kb.monitor``, the errors)
import without pandas or the rules engine. The pipeline, one folder a stage, bottom to top
(docs/architecture.md): core -> trace, facts, monitor -> analyzers -> analysis -> kb, scale
-> advisor -> tools -> render -> cli.
"""

from importlib import import_module

from ._finder import install as _install_finder
from .core.errors import BadTraceError, HermesError, InputNotFoundError, NoTracesError
from .core.version import __version__

_install_finder()

_LAZY = {
    "advise": ("advisor", "advise"),
    "analyze": ("analysis", "analyze"),
    "load": ("trace", "load"),
    "TraceBundle": ("trace", "TraceBundle"),
    "RankTrace": ("trace", "RankTrace"),
    "FACT_TYPES": ("facts", "FACT_TYPES"),
    "Fact": ("facts", "Fact"),
    "Report": ("advisor.report", "Report"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FACT_TYPES",
    "BadTraceError",
    "Fact",
    "HermesError",
    "InputNotFoundError",
    "NoTracesError",
    "RankTrace",
    "Report",
    "TraceBundle",
    "__version__",
    "advise",
    "analyze",
    "load",
]
