"""YAML read safely and within limits: the knowledge base's files and a user's ``--config``.

The safe loader only (libyaml when PyYAML has it), a size limit in bytes before parsing and a
node limit after alias expansion before anything is constructed, so that a hostile file cannot
make hermes build a huge object (a "billion laughs" of anchors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..core.errors import HermesError

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~14x faster
MAX_YAML_BYTES = 1 << 20  # a rule, a case or a config file (the largest shipped is ~12 kB)
MAX_YAML_NODES = 100_000  # nodes after alias expansion (the largest shipped file has ~1,500)


class YamlLimitError(Exception):
    """A YAML file beyond the size limits (``problem`` is the one-line reason)."""

    def __init__(self, problem: str, line: int = 1, column: int = 1):
        super().__init__(problem)
        self.problem, self.line, self.column = problem, line, column


def _expanded_nodes(root) -> int:
    """How many nodes the document has once every alias is expanded, counted without expanding
    (each distinct node once, memoised): a billion-laughs file is refused before anything is
    built from it. A recursive alias (a node inside itself) counts as unbounded."""
    memo: dict[int, int] = {}
    open_: set[int] = set()
    stack = [(root, False)]
    while stack:  # post-order walk over distinct nodes (aliases point at an earlier node)
        node, done = stack.pop()
        key = id(node)
        kids = [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else \
            list(node.value) if isinstance(node, yaml.SequenceNode) else []  # fmt: skip
        if done:
            open_.discard(key)
            memo[key] = min(1 + sum(memo[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if key in memo:
            continue
        if key in open_:
            return MAX_YAML_NODES + 1  # recursive: infinite once expanded
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in memo)
    return memo.get(id(root), 1)


def _tree_nodes(root) -> int:
    """How many nodes a document without anchors has (nothing shared: a plain walk), stopping
    just above MAX_YAML_NODES."""
    n, stack = 0, [root]
    while stack:
        node = stack.pop()
        n += 1
        if n > MAX_YAML_NODES:
            break
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append(k)
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return n


def _text(path: Path, what: str) -> str:
    """The file as text: a regular file, at most MAX_YAML_BYTES, UTF-8."""
    from ..core.limits import read_limited

    try:
        data = read_limited(path, MAX_YAML_BYTES, what)
    except HermesError as exc:
        raise YamlLimitError(exc.message) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlLimitError(f"not UTF-8 text (byte {data[exc.start:exc.start + 1]!r} at offset {exc.start})", line) from None


def compose(text: str):
    """The single document's node tree, refused above MAX_YAML_NODES nodes once aliases are
    expanded. Nothing is constructed yet."""
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    # an alias needs an anchor ("&"): without one no node is shared and a plain count is exact
    count = _expanded_nodes if "&" in text else _tree_nodes
    if node is not None and count(node) > MAX_YAML_NODES:
        mark = node.start_mark
        raise YamlLimitError(f"more than {MAX_YAML_NODES:,} YAML nodes once aliases are expanded: refused "
                             "(a billion-laughs file?)", mark.line + 1, mark.column + 1)  # fmt: skip
    return node


def _construct(text: str, node) -> Any:
    loader = _SAFE_LOADER(text)
    try:
        return loader.construct_document(node) if node is not None else None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise _unreadable_value(exc, node) from None
    finally:
        loader.dispose()


def _unreadable_value(exc: ValueError, node) -> YamlLimitError:
    """Where the value the constructor refused is: the first scalar of more than 4,000 characters."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.ScalarNode) and len(n.value) > 4000:
            m = n.start_mark
            return YamlLimitError(f"a value of {len(n.value):,} characters hermes does not read as a number",
                                  m.line + 1, m.column + 1)  # fmt: skip
        if isinstance(n, yaml.MappingNode):
            stack.extend(x for kv in reversed(n.value) for x in reversed(kv))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(reversed(n.value))
    return YamlLimitError(f"a value hermes cannot read ({str(exc)[:80]})")


class LazyNodes:
    """A file's node tree, composed only when a problem needs a line and column."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._node: Any = None
        self._done = False

    def get(self):
        if not self._done:
            self._node, self._done = compose(self.text), True
        return self._node


def read_document(path: Path) -> tuple[Any, Any]:
    """The document and its node tree (for error positions), parsed with a safe loader, within
    the size limits (bytes, then nodes after alias expansion) before anything is constructed.
    A file without anchors and of at most MAX_YAML_NODES characters cannot hold more nodes
    than that (every node takes at least one character, and without an anchor nothing is
    shared): it is loaded in one pass and its node tree composed only if a problem needs it."""
    text = _text(path, "a YAML file")
    if "&" not in text and len(text) <= MAX_YAML_NODES:
        loader = _SAFE_LOADER(text)
        try:
            return loader.get_single_data(), LazyNodes(text)
        except ValueError as exc:
            raise _unreadable_value(exc, compose(text)) from None
        finally:
            loader.dispose()
    node = compose(text)
    return _construct(text, node), node


def safe_yaml(path: Path) -> Any:
    """A user's YAML file (e.g. ``--config``) under the same limits as the knowledge base's."""
    text = _text(path, "a YAML file")
    return _construct(text, compose(text))


__all__ = ["MAX_YAML_BYTES", "MAX_YAML_NODES", "LazyNodes", "YamlLimitError", "compose", "read_document", "safe_yaml"]
