"""Facts of the parallel analyzer (see analyzers/)."""

from __future__ import annotations
