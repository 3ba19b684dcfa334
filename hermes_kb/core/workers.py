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
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from .cpus import usable_cpus


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


def _others_running() -> int | None:
    """Runnable tasks on the machine besides this one, the least of three looks 0.5 ms apart
    (the fourth field of /proc/loadavg counts this process itself); None where it cannot be read."""
    import time

    seen = []
    for i in range(3):
        try:
            with open("/proc/loadavg", "rb") as fh:
                running = int(fh.read().split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return None
        seen.append(running - 1)
        if i < 2:
            time.sleep(0.0005)
    return max(0, min(seen))


def core_free() -> bool:
    """A second process would get a core of its own: several usable cores and, right now, fewer
    other runnable tasks than cores less one (measured on the load split: 1.0 s split on an idle
    2-core machine, 1.49 s split against 1.34 s alone with both cores busy). The 1-minute load
    average, used before, counted hermes's own recent work: after a few seconds of its two
    processes it said no core was free. Where /proc cannot be read, that average decides.
    ``HERMES_NO_SPLIT`` says no."""
    if os.environ.get("HERMES_NO_SPLIT"):
        return False
    cpus = usable_cpus()
    if cpus < 2:
        return False
    others = _others_running()
    if others is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return load <= cpus - 1
    return others <= cpus - 2


def two_processes() -> bool:
    """``in_two`` would split its items now: forking is safe and a core is free."""
    return can_fork() and core_free()


def in_two(fn: Callable[[Any], float], items: Sequence) -> list[float]:
    """``fn(item)`` for every item, the odd-numbered ones in one forked child while this process
    does the others, when forking is safe and a core is free; here, in order, otherwise. The child
    sends back plain doubles (nothing is unpickled); if it dies, this process does its items. The
    results are the same numbers either way."""
    if len(items) < 2 or not two_processes():
        return [float(fn(x)) for x in items]
    theirs = list(range(1, len(items), 2))
    rfd, wfd = os.pipe()
    pid = -1
    gc.freeze()  # the child's collections would otherwise touch, and copy, every parent page
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            gc.unfreeze()
    if pid == 0:
        os.close(rfd)
        code = 1
        try:
            out = array("d", (float(fn(items[i])) for i in theirs))
            with os.fdopen(wfd, "wb") as fh:
                fh.write(out.tobytes())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    results: list[float] = [0.0] * len(items)
    try:
        for i in range(0, len(items), 2):
            results[i] = float(fn(items[i]))
    finally:
        with os.fdopen(rfd, "rb") as fh:
            data = fh.read()
        _, status = os.waitpid(pid, 0)
    back = array("d")
    if status == 0 and len(data) == 8 * len(theirs):
        back.frombytes(data)
    else:  # the child died: its share is done here
        back = array("d", (float(fn(items[i])) for i in theirs))
    for i, v in zip(theirs, back):
        results[i] = v
    return results


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
