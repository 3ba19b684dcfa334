"""Facts of the cpu analyzer (see analyzers/)."""

from __future__ import annotations
