"""Work on several inputs in forked worker processes, one process per input, so that a worker
that dies (killed by the OOM killer, a signal, a crash in C code) costs its own input only.

Standard library only (the monitor's reader uses it). Each child is forked by this process and
sends its one result back through a pipe; nothing else is ever unpickled from it. When forking
is not safe or not possible (no ``fork``, a second thread running in this process, or this
process being a daemonic worker itself) everything runs here, one input after the other: a fork
taken while another thread holds a lock can deadlock the child.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any


@dataclass
class Died:
    """The worker of one input ended without a result."""

    exitcode: int | None

    def describe(self) -> str:
        code = self.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = " (out of memory?)" if -code == signal.SIGKILL else ""
            return f"its worker process was killed by {name}{hint}"
        return f"its worker process exited with status {code} without a result"


def can_fork() -> bool:
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return False
    if threading.active_count() > 1:
        return False
    return not mp.current_process().daemon


def _child(fn: Callable, args: tuple, conn) -> None:
    try:
        result: tuple[str, Any] = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed back to the parent as a value
        result = ("raised", exc)
    try:
        conn.send(result)
    except Exception as exc:  # the value did not pickle: say so instead of dying silently
        conn.send(("raised", RuntimeError(f"result could not be sent back: {type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def _start_frozen(p) -> None:
    """Fork with this process's objects frozen out of the garbage collector: the child's
    collections would otherwise walk every object of the parent (results gathered so far
    included), touching their pages and so copying the parent's whole heap into every child."""
    gc.freeze()
    try:
        p.start()
    finally:
        gc.unfreeze()


def run_each(fn: Callable, items: Sequence[tuple], workers: int,
             done: Callable[[int, Any], None] | None = None) -> list[Any]:  # fmt: skip
    """``fn(*item)`` for every item, at most ``workers`` at a time in forked children (here, in
    order, when ``workers`` <= 1 or forking is unsafe). A result is the function's return value,
    the exception it raised (as a value), or ``Died`` when its process ended without one.
    ``done(i, result)`` is called as each finishes."""
    results: list[Any] = [None] * len(items)
    if workers <= 1 or len(items) <= 1 or not can_fork():
        for i, item in enumerate(items):
            try:
                results[i] = fn(*item)
            except Exception as exc:  # noqa: BLE001 - same contract as the forked path
                results[i] = exc
            if done:
                done(i, results[i])
        return results
    ctx = mp.get_context("fork")
    pending = list(range(len(items)))
    running: dict[Any, tuple[int, Any]] = {}  # reader end -> (index, process)
    try:
        while pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(fn, items[i], w), daemon=True)
                _start_frozen(p)
                w.close()
                running[r] = (i, p)
            for r in wait(list(running)):
                i, p = running.pop(r)
                try:
                    status, value = r.recv()
                    results[i] = value
                except (EOFError, OSError):
                    status = "died"
                r.close()
                p.join()
                if status == "died":
                    results[i] = Died(p.exitcode)
                if done:
                    done(i, results[i])
    finally:
        for r, (_, p) in running.items():
            p.kill()
            p.join()
            r.close()
    return results
