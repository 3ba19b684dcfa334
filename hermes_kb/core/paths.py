"""Where the folders that live at the repository root (the design's layout) are found: inside
the package in a wheel install (pyproject's package-dir mapping ships them there), at the
repository root in a source checkout or an editable install."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def shipped_dir(name: str) -> Path | None:
    """``hermes_kb/<name>`` when the wheel put it there, else ``<repo root>/<name>``; None if
    neither exists."""
    for base in (PACKAGE, PACKAGE.parent):
        if (base / name).is_dir():
            return base / name
    return None


__all__ = ["PACKAGE", "shipped_dir"]
