"""Facts of the fluctuation analyzer (see analyzers/)."""

from __future__ import annotations
