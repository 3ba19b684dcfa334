"""Two import-time mappings, installed by the package's ``__init__``:

- ``hermes_kb.analyzers`` from the repository's ``analyzers/`` folder when the package is used
  from a source checkout (a wheel ships the folder inside the package, where the normal import
  finds it first), found the way ``kb_dirs`` finds rules/ and cases/;
- the modules that moved when the package was laid out by pipeline stage (issue 31), under their
  old documented names (``hermes_kb.report``, ``hermes_kb.devices``, ...): the same module
  object, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from pathlib import Path

ANALYZERS = "hermes_kb.analyzers"
# old documented module -> where it lives now (docs/api.md)
MOVED = {
    "hermes_kb.report": "hermes_kb.advisor.report",
    "hermes_kb.errors": "hermes_kb.core.errors",
    "hermes_kb.devices": "hermes_kb.core.devices",
    "hermes_kb.annotate": "hermes_kb.tools.annotate",
    "hermes_kb.diff": "hermes_kb.tools.diff",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)  # the module itself, not a copy

    def exec_module(self, module) -> None:
        return None


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == ANALYZERS:
            return _analyzers_spec()
        new = MOVED.get(fullname)
        if new is not None:
            warnings.warn(f"{fullname} moved to {new}", DeprecationWarning, stacklevel=2)
            return importlib.util.spec_from_loader(fullname, _Alias(new))
        return None


def _analyzers_spec():
    from .core.paths import PACKAGE, shipped_dir

    if (PACKAGE / "analyzers" / "__init__.py").is_file():
        return None  # installed: the normal import finds it inside the package
    where = shipped_dir("analyzers")
    if where is None or not (where / "__init__.py").is_file():
        return None
    return importlib.util.spec_from_file_location(ANALYZERS, Path(where) / "__init__.py",
                                                  submodule_search_locations=[str(where)])  # fmt: skip


def install() -> None:
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())


__all__ = ["MOVED", "Finder", "install"]
