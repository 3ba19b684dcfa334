"""The knowledge base the advisor uses: loaded once per --config, shared by threads."""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path

from ..kb.loader import KnowledgeBase, load_kb, load_overrides


_KB_LOCK = threading.Lock()


@lru_cache(maxsize=8)
def _kb_cached(config: str | None) -> KnowledgeBase:
    overrides = load_overrides(Path(config)) if config else None
    return load_kb(overrides=overrides)


def knowledge_base(config: str | os.PathLike | None = None) -> KnowledgeBase:
    with _KB_LOCK:
        return _kb_cached(str(config) if config else None)


__all__ = ["knowledge_base"]
