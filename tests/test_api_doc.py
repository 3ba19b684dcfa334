"""docs/api.md is the stable API: every import it shows works and every ``hermes_kb.x.y`` name it
(or any other doc) cites resolves; the old module names still import, to the same objects."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import hermes_kb

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_import_in_the_api_page_works():
    text = (ROOT / "docs/api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    lines = [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().startswith(("from hermes_kb", "import hermes_kb"))]
    assert len(lines) >= 4
    for ln in lines:
        exec(ln, {})  # noqa: S102 - the page's own import lines


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_in_the_docs_resolves(doc):
    names = set(re.findall(r"\bhermes_kb(?:\.[A-Za-z_][A-Za-z0-9_]*)+", doc.read_text(encoding="utf-8")))
    names -= {"hermes_kb.rules", "hermes_kb.cases"}  # the YAML folders' names inside a wheel, not modules
    bad = []
    for name in sorted(names):
        try:
            _resolve(name.rstrip("."))
        except (ImportError, AttributeError) as exc:
            bad.append(f"{name}: {exc}")
    assert not bad, bad


def test_the_facade_names_and_the_old_module_names():
    assert hermes_kb.Report is importlib.import_module("hermes_kb.advisor.report").Report
    for old, new in (("hermes_kb.report", "hermes_kb.advisor.report"), ("hermes_kb.devices", "hermes_kb.core.devices"),
                     ("hermes_kb.errors", "hermes_kb.core.errors"), ("hermes_kb.annotate", "hermes_kb.tools.annotate")):  # fmt: skip
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert importlib.import_module(old) is importlib.import_module(new)
    for name in hermes_kb.__all__:
        assert getattr(hermes_kb, name) is not None


def test_the_analyzers_import_from_a_source_checkout_without_install(tmp_path):
    """From a fresh copy of the package folders (no install, no editable finder), run from the
    repository root: ``import hermes_kb.advisor, hermes_kb.analyzers`` works, and the analyzers
    are one package (``import analyzers`` is refused rather than giving a second copy)."""
    import os
    import shutil
    import subprocess
    import sys

    for d in ("hermes_kb", "analyzers", "rules", "cases"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            "sys.path.insert(0, '.'); "
            "import hermes_kb.advisor, hermes_kb.analyzers as a; "
            "import hermes_kb.analyzers.timeline.steps as s; print(a.__file__); print(s.__name__)\n"
            "try:\n    import analyzers\nexcept ImportError as e:\n    print('refused')")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    first, second, third = out.stdout.split()
    assert first == str(tmp_path / "analyzers/__init__.py")
    assert second == "hermes_kb.analyzers.timeline.steps" and third == "refused"
