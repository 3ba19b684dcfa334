"""Where the knowledge base's files are, and their names as the cache keys them: light (no YAML,
no pydantic), so that a command served from the cache imports nothing else."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import HermesError
from ..core.paths import PACKAGE, shipped_dir


def kb_dirs() -> tuple[Path, Path]:
    """rules/ and cases/ as shipped: inside the package in a wheel install, at the repository
    root in a source checkout or editable install (core/paths.py, as for analyzers/)."""
    rules, cases = shipped_dir("rules"), shipped_dir("cases")
    if rules is None or cases is None:
        raise HermesError(f"the knowledge base (rules/, cases/) is not installed next to {PACKAGE}")
    return rules, cases


def kb_files(rules_dir: Path, cases_dir: Path) -> list[tuple[str, str, Path]]:
    """Every rule and case file in load order: (kind, name relative to its folder, path)."""
    out = [("rule", f.name, f) for f in sorted(Path(rules_dir).glob("*.yaml"))]
    out += [("case", f"{f.parent.name}/{f.name}", f) for f in sorted(Path(cases_dir).glob("*/*.yaml"))]
    return out


__all__ = ["kb_dirs", "kb_files"]
