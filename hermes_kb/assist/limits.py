"""Every tool runs with a deadline and answers within a size limit.

The work (CPU-bound pandas and a Python replay) runs in a child process from a fork server
(started once, single-threaded, the tools' module preloaded), in its own process group: at the
deadline the group is killed, the answer abandoned and a one-line error returned. A thread could
not be stopped. The child's stdout goes to stderr, so nothing it prints can reach the protocol
on the server's stdout. Answers come back as JSON text; one over the size limit is paged: the
list it holds is cut into pages that fit, and the caller asks for the next with ``offset``.
The last few full answers are kept (keyed by the tool, its arguments and the inputs' size and
time) so that paging does not analyse the trace again."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
from collections import OrderedDict
from typing import Any

from ..core.errors import HermesError

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_BYTES = 200_000
CACHED_ANSWERS = 8


class ToolTimeout(HermesError):
    """A tool's work ran past the server's time limit."""


class ToolFailed(HermesError):
    """A tool's work raised; the message is the library's one line."""


def _child(conn, name: str, kwargs: dict) -> None:
    os.setpgrp()  # its own group: the deadline kills whatever it forked too
    os.dup2(2, 1)  # nothing printed may reach the protocol on stdout
    try:
        from . import work

        text = json.dumps(getattr(work, name)(**kwargs), allow_nan=False, default=str)
        conn.send(("ok", text))
    except HermesError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001  (the library's bug: named, not a traceback on the protocol)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


_CTX_LOCK = threading.Lock()
_CTX: Any = None


def _context():
    global _CTX
    with _CTX_LOCK:
        if _CTX is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["hermes_kb.assist.work"])
            _CTX = ctx
        return _CTX


def _kill(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.join(5)


def run_limited(name: str, kwargs: dict, timeout_s: float) -> Any:
    """``work.<name>(**kwargs)`` in a child process; its JSON answer, or ToolTimeout / ToolFailed."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, name, kwargs), daemon=False)
    p.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            _kill(p)
            raise ToolTimeout(f"{name}: still running after the server's time limit of {timeout_s:g} s; abandoned "
                              "(start the server with a larger --timeout, or give a smaller input)")  # fmt: skip
        try:
            status, payload = parent.recv()
        except EOFError:
            p.join(5)
            raise ToolFailed(f"{name}: the worker process ended without an answer (exit code {p.exitcode})") from None
    finally:
        parent.close()
    p.join(30)
    if p.is_alive():
        _kill(p)
    if status != "ok":
        raise ToolFailed(payload)
    return json.loads(payload)


class Answers:
    """The last few full answers, so that the pages of one answer come from one analysis."""

    def __init__(self, size: int = CACHED_ANSWERS):
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(name: str, kwargs: dict, paths: list[str]) -> str:
        def sig(p: str) -> list:
            try:
                st = os.stat(p)
                return [p, st.st_size, st.st_mtime_ns]
            except OSError:
                return [p]

        return json.dumps([name, kwargs, [sig(p) for p in paths]], sort_keys=True, default=str)

    def get(self, key: str) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def size_of(value: Any) -> int:
    """Bytes of ``value`` as the SDK sends a tool's answer: JSON text indented by 2."""
    return len(json.dumps(value, allow_nan=False, default=str, indent=2, ensure_ascii=False).encode())


def paged(answer: dict, key: str, offset: int, max_bytes: int) -> dict:
    """``answer`` with its list ``key`` cut to the items from ``offset`` that fit in ``max_bytes``
    (at least one, so every call advances), and a ``page`` saying where the next begins."""
    items = answer.get(key) or []
    total = len(items)
    if offset < 0 or (offset > total and total):
        raise ToolFailed(f"offset {offset} is outside the {total} item(s) of this answer")
    head = {k: v for k, v in answer.items() if k != key}
    budget = max_bytes - size_of(head) - 200  # the page block and the brackets
    taken: list = []
    used = 0
    for item in items[offset:]:
        n = size_of(item) + 2
        if taken and used + n > budget:
            break
        taken.append(item)
        used += n
    while True:  # nested items indent deeper than measured alone: the whole page is checked
        nxt = offset + len(taken)
        page = {"offset": offset, "count": len(taken), "total": total, "next_offset": nxt if nxt < total else None,
                "max_bytes": max_bytes}  # fmt: skip
        if nxt < total:
            page["note"] = f"answer over {max_bytes} bytes: call again with offset={nxt} for the rest"
        out = {**head, key: taken, "page": page}
        if len(taken) <= 1 or size_of(out) <= max_bytes:
            return out
        taken = taken[:-1]


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "Answers",
    "ToolFailed",
    "ToolTimeout",
    "paged",
    "run_limited",
    "size_of",
]  # fmt: skip
