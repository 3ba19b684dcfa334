"""hermes: an expert system that explains why deep-learning training is slow.

The stable Python API (see docs/api.md):

    import hermes_kb
    bundle = hermes_kb.load("trace.json.gz")        # -> TraceBundle
"""

from .errors import BadTraceError, HermesError, InputNotFoundError, NoTracesError
from .trace import RankTrace, TraceBundle, load

__version__ = "0.1.0"

__all__ = [
    "BadTraceError",
    "HermesError",
    "InputNotFoundError",
    "NoTracesError",
    "RankTrace",
    "TraceBundle",
    "load",
    "__version__",
]
