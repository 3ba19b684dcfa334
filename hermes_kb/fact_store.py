"""A streamed job's facts on disk, rank by rank; in memory only the engine's flat copies.

A rank's typed facts (pydantic models with their evidence, ~250 kB a DLRM rank in memory) are
written as JSON to one unlinked temporary file as soon as the rank arrives from its worker and
dropped; the flat scalars the rules engine reads (~80 kB a rank) stay. A typed fact is decoded
again only when something asks for it: a matched fact's evidence and explanation, the few kinds
the report reads for every rank (``of_kinds``), a what-if replay, or a full iteration (``hermes
analyze``, tests). The file holds JSON only and is read back through the fact classes' own
validation: nothing is unpickled.

The rank's number and clock are final only once every rank has arrived (rank_stream.gather):
``place`` then renumbers and shifts the flat copies as ``fact_shift``/``flatten`` would have done
on the typed facts, and records the move so that a fact decoded later gets it too. Identical
facts are kept once in the flat list (as ``kb.engine.prepare`` does): within a rank, and across
ranks for facts without a rank; a fact carrying a rank never equals one of another rank.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from .fact_shift import absolute_field, shift_facts
from .facts.base import Fact
from .kb.conditions import sanitize_number

CACHE = 512  # decoded facts kept for repeated reads (a finding's evidence, then its explanation)


@dataclass
class _Block:
    """One rank's spilled facts: where they start in the position arrays, how to finish them."""

    first: int  # position of the block's first fact
    count: int
    analysed_as: int | None = None  # the rank number the worker analysed under
    rank: int | None = None  # the final one
    delta: float = 0.0  # the rank's clock to the job's origin (µs)


def _raw_flat(fact: Fact) -> dict[str, Any]:
    """``kb.engine.flatten`` before the move to the job's rank number and clock: scalars as they
    are (absolute times unsanitised, so that shifting first and sanitising after is exact)."""
    out = {}
    for k, v in fact.model_dump(exclude={"evidence"}).items():
        if isinstance(v, (bool, str)):
            out[k] = v
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def _finish(raw: dict[str, Any], block: _Block) -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        if isinstance(v, (bool, str)):
            out[k] = v
            continue
        if k == "rank" and v == block.analysed_as and not isinstance(v, bool):
            v = block.rank
        elif isinstance(v, float) and block.delta != 0.0 and absolute_field(k):
            v = v + block.delta
        v = sanitize_number(v)
        if v is not None:
            out[k] = v
    return out


class SpilledFacts(Sequence):
    """Typed facts by position (the job's fact list), flat facts by ``_id`` (the engine's)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="hermes-facts-")  # unlinked: gone with the process
        self._end = 0
        self._off = array("q")  # per position: where its JSON starts in the file (-1: held in memory)
        self._len = array("q")
        self._block = array("l")  # per position: its block (-1: none)
        self._kind = array("l")  # per position: index in _kinds
        self._kinds: dict[str, int] = {}
        self._kind_names: list[str] = []
        self._blocks: list[_Block] = []
        self._raw: dict[int, list[dict[str, Any]]] = {}  # block -> raw flat facts until placed
        self._held: dict[int, Fact] = {}  # position -> a fact kept in memory (cross-rank ones, replays)
        self._strings: dict[str, str] = {}
        self.flat: list[dict[str, Any]] = []  # the engine's facts, numbered by _id
        self._pos_of = array("q")  # _id -> position of the first fact with that flat copy
        self._order = array("q")  # the job's fact list: positions in placement (rank) order
        self._seen_rankless: set[tuple] = set()
        self._cache: OrderedDict[int, Fact] = OrderedDict()
        self._open = True

    # -- writing --------------------------------------------------------------------------
    def spill(self, facts: list[Fact]) -> int:
        """Write one rank's facts; returns its block number (for ``place``)."""
        first = len(self._off)
        raws = []
        chunks = []
        for f in facts:
            data = f.model_dump_json().encode()
            chunks.append(data)
            self._off.append(self._end)
            self._len.append(len(data))
            self._block.append(len(self._blocks))
            self._kind.append(self._kind_index(f.kind))
            self._end += len(data)
            raws.append({k: (self._strings.setdefault(v, v) if isinstance(v, str) else v)
                         for k, v in _raw_flat(f).items()})  # fmt: skip
        self._file.seek(0, os.SEEK_END)
        self._file.write(b"".join(chunks))
        self._file.flush()  # read back with os.pread, past the buffer
        self._blocks.append(_Block(first=first, count=len(facts)))
        self._raw[len(self._blocks) - 1] = raws
        return len(self._blocks) - 1

    def place(self, block: int, analysed_as: int | None, rank: int | None, delta: float) -> None:
        """A block's final rank number and clock; its flat facts join the engine's list."""
        b = self._blocks[block]
        b.analysed_as, b.rank, b.delta = analysed_as, rank, delta
        seen: set[tuple] = set()
        self._order.extend(range(b.first, b.first + b.count))
        for i, raw in enumerate(self._raw.pop(block)):
            self._number(_finish(raw, b), b.first + i, seen)

    def add(self, facts: Iterable[Fact]) -> None:
        """Facts kept in memory (the cross-rank ones, made from the digests after every rank)."""
        from .kb.engine import flatten

        seen: set[tuple] = set()
        for f in facts:
            pos = len(self._off)
            self._off.append(-1)
            self._len.append(0)
            self._block.append(-1)
            self._kind.append(self._kind_index(f.kind))
            self._held[pos] = f
            self._order.append(pos)
            self._number(flatten(f), pos, seen)

    def _number(self, flat: dict[str, Any], pos: int, seen: set[tuple]) -> None:
        key = tuple(sorted(flat.items()))
        where = seen if "rank" in flat else self._seen_rankless
        if key in where:
            return
        where.add(key)
        flat["_id"] = len(self.flat)
        self._pos_of.append(pos)
        self.flat.append(flat)

    # -- reading --------------------------------------------------------------------------
    def _decode(self, pos: int, data: bytes | None = None) -> Fact:
        held = self._held.get(pos)
        if held is not None:
            return held
        got = self._cache.get(pos)
        if got is not None:
            self._cache.move_to_end(pos)
            return got
        from .facts import FACT_TYPES

        if data is None:
            data = os.pread(self._file.fileno(), self._len[pos], self._off[pos])
        fact = FACT_TYPES[self._kind_names[self._kind[pos]]].model_validate_json(data)
        b = self._blocks[self._block[pos]]
        if b.analysed_as is not None and fact.rank == b.analysed_as:
            fact.rank = b.rank
        shift_facts([fact], b.delta)
        self._cache[pos] = fact
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return fact

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._decode(self._order[j]) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._decode(self._order[i])

    def __iter__(self) -> Iterator[Fact]:
        """Every fact in order, a rank's block read at once."""
        i, n = 0, len(self._order)
        fd = self._file.fileno()
        while i < n:
            pos = self._order[i]
            if self._off[pos] < 0:
                yield self._decode(pos)
                i += 1
                continue
            b = self._blocks[self._block[pos]]  # placed whole: its positions follow in order
            end = b.first + b.count
            start = self._off[pos]
            buf = os.pread(fd, self._off[end - 1] + self._len[end - 1] - start, start)
            for q in range(pos, end):
                o = self._off[q] - start
                yield self._decode(q, buf[o:o + self._len[q]])
            i += end - pos

    def _kind_index(self, kind: str) -> int:
        i = self._kinds.get(kind)
        if i is None:
            i = self._kinds[kind] = len(self._kind_names)
            self._kind_names.append(kind)
        return i

    def of_kinds(self, kinds: Iterable[str]) -> list[Fact]:
        """The typed facts of these kinds, in order, decoding only those."""
        want = {self._kinds[k] for k in kinds if k in self._kinds}
        return [self._decode(pos) for pos in self._order if self._kind[pos] in want]

    def by_id(self) -> MutableMapping[int, Fact]:
        """``_id`` -> typed fact, decoded when asked (what ``kb.engine.Inference.originals`` holds)."""
        return _ById(self)

    def replace(self, pos: int, fact: Fact) -> None:
        self._held[pos] = fact
        self._cache.pop(pos, None)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._file.close()


class _ById(MutableMapping):
    """Measured facts read from the store; facts set later (derived bottlenecks) kept here."""

    def __init__(self, store: SpilledFacts) -> None:
        self._store = store
        self._extra: dict[int, Fact] = {}

    def __getitem__(self, i: int) -> Fact:
        got = self._extra.get(i)
        if got is not None:
            return got
        if not isinstance(i, int) or not 0 <= i < len(self._store._pos_of):
            raise KeyError(i)
        return self._store._decode(self._store._pos_of[i])

    def __setitem__(self, i: int, fact: Fact) -> None:
        if isinstance(i, int) and 0 <= i < len(self._store._pos_of):
            self._store.replace(self._store._pos_of[i], fact)
        else:
            self._extra[i] = fact

    def __delitem__(self, i: int) -> None:
        raise TypeError("facts are not removed")

    def __iter__(self) -> Iterator[int]:
        yield from range(len(self._store._pos_of))
        yield from self._extra

    def __len__(self) -> int:
        return len(self._store._pos_of) + len(self._extra)


def of_kinds(facts: Sequence[Fact], kinds: Iterable[str]) -> list[Fact]:
    """The facts of these kinds from a list or a store (which decodes only those)."""
    if isinstance(facts, SpilledFacts):
        return facts.of_kinds(kinds)
    want = set(kinds)
    return [f for f in facts if f.kind in want]


__all__ = ["SpilledFacts", "of_kinds"]
