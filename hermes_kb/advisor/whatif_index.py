"""The what-if facts by (rank, set), as the gains and the nesting of findings look them up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kb.matches import Inference
from ..kb.loader import KnowledgeBase


class _Overlaps(Mapping):
    """A what-if fact's ``critical_overlaps_us``, read from the typed fact when first asked (a
    streamed job's typed facts are on disk, and only the findings' ranks are ever asked)."""

    def __init__(self, originals: Mapping, fact_id: Any) -> None:
        self._originals, self._id, self._got = originals, fact_id, None

    def _get(self) -> dict[str, float]:
        if self._got is None:
            orig = self._originals.get(self._id)
            self._got = dict(getattr(orig, "critical_overlaps_us", None) or {})
        return self._got

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def whatif_index(inf: Inference, kb: KnowledgeBase | None = None) -> Mapping[tuple, dict[str, Any]]:
    """(rank, target) -> whatif fact; (rank, "*linked") -> one of the rank's facts when its graph
    is replayable (launch links, or no device). The engine's facts are flat (scalars only), so the
    shared critical-path time per other set comes from the original fact."""
    if inf.spilled is not None:
        return _SpilledWhatif(inf, kb)
    return _index_whatif(inf.facts, inf.originals)


def _index_whatif(facts: list[dict[str, Any]], originals: Mapping) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for f in facts:
        if f.get("kind") == "whatif":
            f = {**f, "critical_overlaps_us": _Overlaps(originals, f.get("_id"))}
            out[(f.get("rank"), f.get("target"))] = f
            if f.get("linked", True):
                out[(f.get("rank"), "*linked")] = f
    return out


class _SpilledWhatif(Mapping):
    """``whatif_index`` of a streamed job, a rank's entries read from the store when first
    asked (the matches' ranks), keeping only the sets a case's gain names (and the rank's
    "*linked" entry): a job can have thousands of ranks of ~30 what-if facts each."""

    def __init__(self, inf: Inference, kb: KnowledgeBase | None) -> None:
        self._inf = inf
        self._targets = None if kb is None else {e.item.gain.whatif.target for e in kb.cases if e.item.gain.whatif}
        self._ranks: dict[Any, dict[tuple, dict[str, Any]]] = {}

    def _of(self, rank: Any) -> dict[tuple, dict[str, Any]]:
        got = self._ranks.get(rank)
        if got is None:
            flats = [f for f in self._inf.spilled.rank_flats(rank) if f.get("kind") == "whatif"]
            full = _index_whatif(flats, self._inf.originals)
            keep = self._targets
            got = self._ranks[rank] = full if keep is None else {k: v for k, v in full.items()
                                                                if k[1] in keep or k[1] == "*linked"}  # fmt: skip
        return got

    def __getitem__(self, key: tuple) -> dict[str, Any]:
        return self._of(key[0])[key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and key in self._of(key[0])

    def __iter__(self):
        raise TypeError("a streamed job's what-if index is looked up by (rank, set), not listed")

    def __len__(self) -> int:  # only its truth is asked for (merge_findings)
        return self._inf.spilled.count("whatif")


__all__ = ["whatif_index"]
