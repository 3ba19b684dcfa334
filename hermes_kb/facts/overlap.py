"""Facts of the overlap analyzer (see analyzers/)."""

from __future__ import annotations
