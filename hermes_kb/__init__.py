"""hermes: an expert system that explains why deep-learning training is slow.

The stable Python API (see docs/api.md):

    import hermes_kb
    bundle = hermes_kb.load("trace.json.gz")        # -> TraceBundle
    facts = hermes_kb.analyze(bundle)               # -> list[Fact]
    report = hermes_kb.advise(bundle)               # -> Report (findings, expected speedups)
"""

__version__ = "0.1.0"

from .advisor import advise
from .analysis import analyze
from .errors import BadTraceError, HermesError, InputNotFoundError, NoTracesError
from .facts import FACT_TYPES, Fact
from .trace import RankTrace, TraceBundle, load


__all__ = [
    "FACT_TYPES",
    "Fact",
    "advise",
    "analyze",
    "BadTraceError",
    "HermesError",
    "InputNotFoundError",
    "NoTracesError",
    "RankTrace",
    "TraceBundle",
    "load",
    "__version__",
]
