"""The checked knowledge base kept on disk as plain JSON, so that a command does not parse ~200
YAML files and re-check them on every start.

Only data is cached (the documents as the YAML loader returned them), never objects: loading it
runs no code, so whoever can write the cache directory can at most change rules, as whoever can
write rules/ and cases/ can. A cache file is named by a fingerprint of everything its check
depended on (the bytes of every rule and case file, their names, the hermes version and the
source of the checking and fact modules): any edit makes another name, and a file whose
fingerprint or format does not match is ignored. Only a knowledge base that passed every check
is written. ``HERMES_KB_CACHE=off`` disables it; ``HERMES_CACHE_DIR`` moves it (default
``$XDG_CACHE_HOME/hermes`` or ``~/.cache/hermes``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 2
KEEP = 8  # cache files kept in the directory (one per knowledge-base version seen)
_CHECKERS = ("kb", "facts")  # the packages whose source decides what a check accepts


def cache_dir() -> Path | None:
    if os.environ.get("HERMES_KB_CACHE", "").lower() in ("off", "0", "no", "false"):
        return None
    if d := os.environ.get("HERMES_CACHE_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hermes"


def _source_digest() -> bytes:
    from ..core.paths import PACKAGE
    from ..core.version import __version__

    h = hashlib.sha256(f"{FORMAT}:{__version__}".encode())
    for pkg in _CHECKERS:
        for f in sorted((PACKAGE / pkg).rglob("*.py")):
            h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


def fingerprint(files: list[tuple[str, Path]], max_bytes: int) -> str | None:
    """The hex digest of the knowledge base's files (name relative to its folder, and bytes) and
    of the checking code; None when a file cannot be read plainly (the full load reports it)."""
    from ..core.errors import HermesError
    from ..core.limits import read_limited

    h = hashlib.sha256(_source_digest())
    try:
        for name, path in files:
            h.update(name.encode("utf-8", "surrogateescape") + b"\0")
            h.update(read_limited(path, max_bytes, "a YAML file") + b"\0")
    except (OSError, HermesError):
        return None
    return h.hexdigest()


_MAP = "\u0000map"  # a mapping whose keys are not all strings (YAML allows {0: ..}), as [key, value] pairs


def _encode(v: Any) -> Any:
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {k: _encode(x) for k, x in v.items()}
        return {_MAP: [[k, _encode(x)] for k, x in v.items()]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    return v


def _decode(d: dict) -> Any:
    if _MAP in d and len(d) == 1:
        return {k if not isinstance(k, list) else tuple(k): x for k, x in d[_MAP]}
    return d


def documents(files: list[tuple[str, str, Path]], max_bytes: int) -> tuple[str | None, list[dict[str, Any]] | None]:
    """The fingerprint of these files (kind, name, path: kb/files.py) and the documents cached
    under it, if any; each names a file of this list."""
    digest = fingerprint([(name, path) for _, name, path in files], max_bytes)
    docs = read(digest) if digest is not None else None
    names = {(kind, name) for kind, name, _ in files}
    if docs is not None and any((d["kind"], d["name"]) not in names for d in docs):
        docs = None
    return digest, docs


def _file(directory: Path, digest: str) -> Path:
    return directory / f"kb-{digest[:40]}.json"


def read(digest: str) -> list[dict[str, Any]] | None:
    """The documents cached under this fingerprint, in load order, or None."""
    d = cache_dir()
    if d is None:
        return None
    try:
        with open(_file(d, digest), encoding="utf-8") as f:
            doc = json.load(f, object_hook=_decode)
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("fingerprint") != digest:
        return None
    items = doc.get("items")
    ok = isinstance(items, list) and all(
        isinstance(i, dict) and i.get("kind") in ("rule", "case") and isinstance(i.get("name"), str)
        and isinstance(i.get("data"), dict) and isinstance(i.get("row"), dict) for i in items)  # fmt: skip
    return items if ok else None


def write(digest: str, items: list[dict[str, Any]]) -> None:
    """Keep a checked knowledge base; silently nothing when the directory is not writable or a
    document does not come back from JSON unchanged (a YAML date, a NaN, a list as a key)."""
    d = cache_dir()
    if d is None:
        return
    try:
        text = json.dumps({"format": FORMAT, "fingerprint": digest, "items": _encode(items)}, ensure_ascii=False,
                          separators=(",", ":"), allow_nan=False)  # fmt: skip
    except (TypeError, ValueError):  # a value JSON cannot hold (a YAML date, a NaN)
        return
    if json.loads(text, object_hook=_decode)["items"] != items:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kb-", suffix=".tmp", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, _file(d, digest))
        old = sorted(d.glob("kb-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]
        for p in old:
            p.unlink(missing_ok=True)
    except OSError:
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass


__all__ = ["cache_dir", "documents", "fingerprint", "read", "write"]
