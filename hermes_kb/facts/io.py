"""Facts of the io analyzer (see analyzers/)."""

from __future__ import annotations
