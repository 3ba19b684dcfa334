"""The order rule and case ids are listed in: rules first, then by category and number."""

from __future__ import annotations


def item_ids(kb) -> list[str]:
    return sorted((e.item.id for e in (*kb.rules, *kb.cases)), key=id_key)


def id_key(item_id: str) -> tuple:
    """Rules before cases, then by category and number: C-COMM-002 before C-COMM-010."""
    parts = item_id.split("-")
    return (0 if parts[0] == "R" else 1, *[(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts[1:]])


__all__ = ["id_key", "item_ids"]
