"""Readers: profiler output in, TraceBundle out. ``loader`` finds the files and reads them in
worker processes; ``kineto/`` reads PyTorch profiler (Kineto) JSON of every era, ``ascend/`` the
torch_npu profiler's text and sqlite exports; both fill the columnar ``bundle`` (per-rank pandas
frames, docs/trace_bundle.md), with ``names`` classifying events, ``args`` decoding recorded
operator arguments and ``validate`` checking what is read."""

from .bundle import FRAMES, LoadProblem, RankTrace, TraceBundle, TraceMeta
from .loader import discover, load

__all__ = ["FRAMES", "LoadProblem", "RankTrace", "TraceBundle", "TraceMeta", "discover", "load"]
