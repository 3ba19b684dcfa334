"""Readers: profiler output in, TraceBundle out."""

from .bundle import FRAMES, LoadProblem, RankTrace, TraceBundle, TraceMeta
from .loader import discover, load

__all__ = ["FRAMES", "LoadProblem", "RankTrace", "TraceBundle", "TraceMeta", "discover", "load"]
