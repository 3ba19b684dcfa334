"""The layer contract (docs/architecture.md), checked on the source: every import of hermes_kb
and hermes_kb.analyzers, at module level or inside a function, read with ``ast``.

- no import cycle between modules;
- no import upward: each package sits on a layer and imports only from lower layers, its own
  package, or (for the façade) anything; packages that share a layer do not import each other;
- only ``hermes_kb.analysis`` imports the analyzers (besides the analyzers themselves);
- no module over 600 lines, no function over 120;
- no underscore-private name imported from another module;
- every package states its job in its ``__init__`` docstring, and pyproject lists every package.

No exceptions are listed: a new edge that breaks the contract fails here.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120

# lowest first; the packages of one layer are independent of each other
LAYERS: list[set[str]] = [
    {"core"},
    {"trace", "facts", "monitor"},
    {"analyzers"},
    {"analysis"},
    {"kb", "scale"},
    {"advisor"},
    {"tools"},
    {"render"},
    {"assist"},
    {"cli"},
]
TOP = {"", "_finder", "__main__"}  # the package's façade (hermes_kb/__init__.py) and its entry points


def _source_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base, prefix in ((ROOT / "hermes_kb", "hermes_kb"), (ROOT / "analyzers", "hermes_kb.analyzers")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


@cache
def modules() -> dict[str, Path]:
    return _source_files()


def _absolute(module: str, path: Path, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    if path.name != "__init__.py":
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _resolve(target: str) -> str | None:
    """The hermes module an import names (a module, or a module's attribute), or None."""
    mods = modules()
    while target:
        if target in mods:
            return target
        target = target.rpartition(".")[0]
    return None


@cache
def graph() -> dict[str, set[str]]:
    """module -> the hermes modules it imports (anywhere in the file)."""
    mods = modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node.level, node.module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if not t.startswith("hermes_kb"):
                    continue
                dst = _resolve(t)
                if dst is not None and dst != module:
                    out[module].add(dst)
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(package: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if package in layer), None)


def test_every_package_has_a_layer():
    pkgs = {package_of(m) for m in modules()} - TOP
    assert not [p for p in pkgs if layer_of(p) is None], "a package without a layer: add it to LAYERS and docs/architecture.md"


def test_no_import_cycles():
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_upward_or_sideways_imports():
    bad = []
    for src, dsts in graph().items():
        sp = package_of(src)
        if sp in TOP:
            continue
        for dst in dsts:
            dp = package_of(dst)
            if dp == sp:
                continue
            if dp in TOP:
                bad.append(f"{src} -> {dst} (the façade is above every layer)")
                continue
            ls, ld = layer_of(sp), layer_of(dp)
            if ld >= ls:
                bad.append(f"{src} -> {dst} ({'same layer' if ld == ls else 'upward'}: {sp} on {ls}, {dp} on {ld})")
    assert not bad, "\n".join(sorted(bad))


def test_only_the_analysis_layer_imports_the_analyzers():
    bad = [f"{src} -> {dst}" for src, dsts in graph().items() for dst in dsts
           if package_of(dst) == "analyzers" and package_of(src) not in ("analyzers", "analysis")]  # fmt: skip
    assert not bad, "\n".join(sorted(bad))


def test_modules_and_functions_are_small():
    long_modules, long_functions = [], []
    for module, path in modules().items():
        text = path.read_text(encoding="utf-8")
        n = text.count("\n")
        if n > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules and not long_functions, "\n".join(long_modules + long_functions)


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node.level, node.module)
                if not base.startswith("hermes_kb"):
                    continue
                bad += [f"{module}: {a.name} from {base}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_every_package_states_its_job():
    missing = []
    for module, path in modules().items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            if not doc or len(doc.split()) < 8:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"packages whose __init__ does not say what they hold: {missing}"


def test_pyproject_ships_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {m for m, p in modules().items() if p.name == "__init__.py"} | {"hermes_kb.rules", "hermes_kb.cases"}
    assert listed == tree, f"missing: {sorted(tree - listed)}; not in the tree: {sorted(listed - tree)}"


def test_the_contract_holds_on_a_real_edge():
    """The checks above see function-level imports: the advisor reaches the replay through the
    analysis layer, in a function body as at module level."""
    g = graph()
    assert "hermes_kb.analysis.replay" in g["hermes_kb.advisor.gains"]
    assert "hermes_kb.analyzers.whatif.replay" in g["hermes_kb.analysis.replay"]
    assert re.match(r"hermes_kb\.analysis\.", "hermes_kb.analysis.rank")


DOC = ROOT / "docs/architecture.md"
TABLE_START, TABLE_END = "<!-- registry-table -->", "<!-- /registry-table -->"


def registry_table() -> str:
    """The analyzers' order and shared-context keys as docs/architecture.md shows them."""
    from hermes_kb.analysis import registry

    def path(a) -> str:
        return f"`analyzers/{a.module.replace('.', '/')}.py`"

    def keys(ks) -> str:
        return ", ".join(f"`{k}`" for k in sorted(ks)) or "-"

    rows = ["| # | analyzer | module | reads | gives |", "|---|---|---|---|---|"]
    rows += [f"| {i} | `{a.name}` | {path(a)} | {keys(a.reads)} | {keys(a.gives)} |"
             for i, a in enumerate(registry.PER_RANK, 1)]  # fmt: skip
    rows += ["", "Then, once every rank is done, the cross-rank analyzers: "
             + ", ".join(f"`{a.name}` ({path(a)})" for a in registry.CROSS_RANK) + "."]  # fmt: skip
    return "\n".join(rows)


def _doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index(TABLE_START) + len(TABLE_START): text.index(TABLE_END)].strip("\n")


def test_the_architecture_doc_shows_the_registry():
    assert _doc_table() == registry_table(), "docs/architecture.md is stale: run python tests/test_layout.py --write"


if __name__ == "__main__":  # python tests/test_layout.py --write: the table into docs/architecture.md
    import sys

    if "--write" in sys.argv:
        text = DOC.read_text(encoding="utf-8")
        head, rest = text.split(TABLE_START, 1)
        _, tail = rest.split(TABLE_END, 1)
        DOC.write_text(f"{head}{TABLE_START}\n{registry_table()}\n{TABLE_END}{tail}", encoding="utf-8")
