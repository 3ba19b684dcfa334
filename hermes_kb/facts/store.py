"""A streamed job's facts on disk, rank by rank: what stays in memory is a few array entries per
fact.

A rank's typed facts (pydantic models with their evidence, ~250 kB a DLRM rank in memory) and
their flat copies for the rules engine (the scalars, ~80 kB) are written as JSON to one unlinked
temporary file as soon as the rank arrives from its worker, and dropped. The rules engine reads
the flat copies back a group of ranks at a time (kb/spilled_inference.py); a typed fact is decoded
again only when something asks for it: a matched fact's evidence and explanation, the few kinds
the report reads for every rank (``of_kinds``), or a full iteration (``hermes analyze``, tests).
The file holds JSON only, read back through msgspec and the fact classes' own validation:
nothing is unpickled.

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

import msgspec

from .shift import absolute_field, shift_facts
from .base import Fact
from .flat import flatten, sanitize_number, scalars

CACHE = 512  # decoded facts kept for repeated reads (a finding's evidence, then its explanation)
FLAT_CACHE = 64  # ranks' flat copies kept for repeated reads (the what-if facts of a finding's ranks)


@dataclass
class _Block:
    """One rank's spilled facts: where they start in the position arrays, how to finish them,
    where its flat copies are in the file."""

    first: int  # position of the block's first fact
    count: int
    raw: tuple[int, int] = (0, 0)  # (offset, length) of its raw flat copies, until placed
    flat: tuple[int, int] = (0, 0)  # (offset, length) of its finished flat copies of its own rank
    analysed_as: int | None = None  # the rank number the worker analysed under
    rank: int | None = None  # the final one
    delta: float = 0.0  # the rank's clock to the job's origin (µs)


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


def _rank_order(r: Any) -> tuple:
    return (str(type(r)), r)


class SpilledFacts(Sequence):
    """Typed facts by position (the job's fact list); flat facts by ``_id`` (the engine's), read
    a group of ranks at a time (``flat_groups``), by rank (``rank_flats``) or by kind
    (``flats_of``). In memory: per fact a few array entries; the flat copies of facts that are
    not their block's rank's (the cross-rank ones, a fact about another rank) whole."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="hermes-facts-")  # unlinked: gone with the process
        self._end = 0
        self._off = array("q")  # per position: where its JSON starts in the file (-1: held in memory)
        self._len = array("q")
        self._block = array("l")  # per position: its block (-1: none)
        self._kind = array("l")  # per position: index in _kind_names
        self._kinds: dict[str, int] = {}
        self._kind_names: list[str] = []
        self._blocks: list[_Block] = []
        self._block_of_rank: dict[Any, int] = {}
        self._held: dict[int, Fact] = {}  # position -> a fact kept in memory (cross-rank ones, replays)
        self.memory_flat: list[dict[str, Any]] = []  # flat copies not of their block's rank, by _id
        self._pos_of = array("q")  # _id -> position of the first fact with that flat copy
        self._order = array("q")  # the job's fact list: positions in placement (rank) order
        self._seen_rankless: set[tuple] = set()
        self._cache: OrderedDict[int, Fact] = OrderedDict()
        self._flat_cache: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()
        self._shared: dict[bytes, Any] = {}
        self._open = True

    def _write(self, data: bytes) -> tuple[int, int]:
        self._file.seek(0, os.SEEK_END)
        self._file.write(data)
        self._file.flush()  # read back with os.pread, past the buffer
        at = self._end
        self._end += len(data)
        return at, len(data)

    def _read(self, where: tuple[int, int]) -> bytes:
        return os.pread(self._file.fileno(), where[1], where[0])

    # -- writing --------------------------------------------------------------------------
    def spill(self, facts: list[Fact]) -> int:
        """Write one rank's facts and their raw flat copies; returns its block number (for ``place``)."""
        first = len(self._off)
        chunks = []
        at = self._end
        for f in facts:
            data = f.model_dump_json().encode()
            chunks.append(data)
            self._off.append(at)
            self._len.append(len(data))
            self._block.append(len(self._blocks))
            self._kind.append(self._kind_index(f.kind))
            at += len(data)
        self._write(b"".join(chunks))
        # unsanitised: the move to the job's clock is added first, as flatten saw it before
        raw = self._write(msgspec.json.encode([scalars(f) for f in facts]))
        self._blocks.append(_Block(first=first, count=len(facts), raw=raw))
        return len(self._blocks) - 1

    def place(self, block: int, analysed_as: int | None, rank: int | None, delta: float) -> None:
        """A block's final rank number and clock; its flat copies numbered (the engine's _id) and
        written back, those of another rank than the block's kept in memory."""
        b = self._blocks[block]
        b.analysed_as, b.rank, b.delta = analysed_as, rank, delta
        seen: set[tuple] = set()
        self._order.extend(range(b.first, b.first + b.count))
        own = []
        for i, raw in enumerate(msgspec.json.decode(self._read(b.raw))):
            flat = _finish(raw, b)
            if self._number(flat, b.first + i, seen):
                (own if "rank" in flat and flat["rank"] == rank else self.memory_flat).append(flat)
        b.flat = self._write(msgspec.json.encode(own))
        b.raw = (0, 0)
        self._block_of_rank[rank] = block

    def add(self, facts: Iterable[Fact]) -> None:
        """Facts kept in memory (the cross-rank ones, made from the digests after every rank)."""
        seen: set[tuple] = set()
        for f in facts:
            pos = len(self._off)
            self._off.append(-1)
            self._len.append(0)
            self._block.append(-1)
            self._kind.append(self._kind_index(f.kind))
            self._held[pos] = f
            self._order.append(pos)
            flat = flatten(f)
            if self._number(flat, pos, seen):
                self.memory_flat.append(flat)

    def _number(self, flat: dict[str, Any], pos: int, seen: set[tuple]) -> bool:
        key = tuple(sorted(flat.items()))
        where = seen if "rank" in flat else self._seen_rankless
        if key in where:
            return False
        where.add(key)
        flat["_id"] = len(self._pos_of)
        self._pos_of.append(pos)
        return True

    def shared(self, value: Any) -> Any:
        """One copy of a JSON-like value that many ranks hold equal (their device properties)."""
        key = msgspec.json.encode(value, order="sorted")
        return self._shared.setdefault(key, value)

    # -- flat copies ------------------------------------------------------------------------
    @property
    def n_ids(self) -> int:
        """How many flat copies (the engine's facts) there are: _id 0 .. n_ids - 1."""
        return len(self._pos_of)

    def _own_flats(self, block: int) -> list[dict[str, Any]]:
        got = self._flat_cache.get(block)
        if got is None:
            got = self._flat_cache[block] = msgspec.json.decode(self._read(self._blocks[block].flat))
            if len(self._flat_cache) > FLAT_CACHE:
                self._flat_cache.popitem(last=False)
        else:
            self._flat_cache.move_to_end(block)
        return got

    def _memory_by_rank(self) -> dict[Any, list[dict[str, Any]]]:
        out: dict[Any, list[dict[str, Any]]] = {}
        for f in self.memory_flat:
            out.setdefault(f.get("rank"), []).append(f)
        return out

    def rank_flats(self, rank: Any) -> list[dict[str, Any]]:
        """The flat copies carrying this rank number (None: those without one), by _id."""
        mine = [f for f in self.memory_flat if f.get("rank") == rank]
        block = self._block_of_rank.get(rank) if rank is not None else None
        if block is None:
            return mine
        return sorted(self._own_flats(block) + mine, key=lambda f: f["_id"])

    def flat_groups(self, size: int) -> Iterator[tuple[frozenset, list[dict[str, Any]]]]:
        """(rank numbers, their flat copies) for ``size`` ranks at a time in rank order, then the
        facts without a rank: the groups ``kb.durable_engine`` makes of a large job's facts."""
        memory = self._memory_by_rank()
        ranks = sorted({*self._block_of_rank, *(r for r in memory if r is not None)}, key=_rank_order)
        for i in range(0, len(ranks), size):
            chunk = ranks[i:i + size]
            out: list[dict[str, Any]] = []
            for r in chunk:
                block = self._block_of_rank.get(r)
                own = msgspec.json.decode(self._read(self._blocks[block].flat)) if block is not None else []
                extra = memory.get(r, [])
                out.extend(sorted(own + extra, key=lambda f: f["_id"]) if extra else own)
            yield frozenset(chunk), out
        if None in memory:
            yield frozenset([None]), memory[None]

    def flats_of(self, kinds: Iterable[str]) -> list[dict[str, Any]]:
        """Every flat copy of these kinds, by _id (one read of every rank's block)."""
        want = set(kinds)
        out = [f for f in self.memory_flat if f.get("kind") in want]
        for b in self._blocks:
            if b.flat[1]:
                out.extend(f for f in msgspec.json.decode(self._read(b.flat)) if f.get("kind") in want)
        return sorted(out, key=lambda f: f["_id"])

    # -- reading --------------------------------------------------------------------------
    def _decode(self, pos: int, data: bytes | None = None) -> Fact:
        held = self._held.get(pos)
        if held is not None:
            return held
        got = self._cache.get(pos)
        if got is not None:
            self._cache.move_to_end(pos)
            return got
        from . import FACT_TYPES

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

    def count(self, kind: str) -> int:
        """How many facts of this kind the job has (duplicates included), decoding none."""
        i = self._kinds.get(kind)
        return 0 if i is None else sum(1 for pos in self._order if self._kind[pos] == i)

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
    """Measured facts read from the store; facts set later (the derived bottlenecks, a few per
    rank) kept here as their JSON (~0.3 kB against ~2 kB a model) and validated when asked."""

    def __init__(self, store: SpilledFacts) -> None:
        self._store = store
        self._extra: dict[int, tuple[type[Fact], bytes]] = {}

    def __getitem__(self, i: int) -> Fact:
        got = self._extra.get(i)
        if got is not None:
            return got[0].model_validate_json(got[1])
        if not isinstance(i, int) or not 0 <= i < len(self._store._pos_of):
            raise KeyError(i)
        return self._store._decode(self._store._pos_of[i])

    def __setitem__(self, i: int, fact: Fact) -> None:
        if isinstance(i, int) and 0 <= i < len(self._store._pos_of):
            self._store.replace(self._store._pos_of[i], fact)
        else:
            self._extra[i] = (type(fact), fact.model_dump_json().encode())

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
