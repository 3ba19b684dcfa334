"""Facts of the compute analyzer (see analyzers/)."""

from __future__ import annotations
