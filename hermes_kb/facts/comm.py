"""Facts of the comm analyzer (see analyzers/)."""

from __future__ import annotations
