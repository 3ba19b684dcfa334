"""Communication domains and communication time, from torch.distributed, without a sync in the
training loop. The monitor never imports torch: all of this starts only once the job has
initialised torch.distributed (checked at start and at each resource sample).

- Domains: every process group this rank belongs to, read from torch.distributed's registry
  (``distributed_c10d._world``: ``pg_map`` (backend), ``pg_names`` (the group's name, the same
  on every member), ``pg_group_ranks`` (its global ranks)) : the default group (``world``) and
  those the job creates (``new_group``, ``DeviceMesh``, ``split_group``). Groups of one rank are
  left out: there is nobody to lag behind.
- Communication time: groups whose backend supports it (NCCL) report every finished work
  through ``ProcessGroup._register_on_completion_hook``, fired on NCCL's watchdog thread with
  the collective's duration measured by CUDA events; DDP's gradient all-reduce is seen there. For
  the other backends (gloo, CPU) the collective functions of ``torch.distributed``
  (``all_reduce``, ``all_gather``, ``reduce_scatter_tensor``, ``broadcast``, ``barrier``, ...)
  are wrapped: a call that blocks is timed by two clock reads around it; an ``async_op=True``
  call by a done-callback on its work's future (the time from the call to completion). The
  wrappers are removed at close. Not seen: collectives issued from C++ on those backends (DDP's
  gradient all-reduce on gloo), and functions imported by name before the monitor started.

A collective's time counts in the step in which it finished (``comm_s``); ``comm_blocked_s`` is
the part the calling thread spent blocked in calls that were not asynchronous (on CPU: exposed
communication).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import time
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
               "reduce", "barrier", "gather", "scatter", "send", "recv", "monitored_barrier")  # fmt: skip
HOOKED_BACKENDS = ("nccl",)
_SAFE = re.compile(r"[^A-Za-z0-9_.:-]+")


def torch_distributed() -> Any | None:
    d = sys.modules.get("torch.distributed")
    try:
        if d is not None and d.is_available() and d.is_initialized():
            return d
    except Exception:
        return None
    return None


def safe_name(name: str) -> str:
    return _SAFE.sub("_", name)[:80] or "pg"


def discover(dist: Any | None = None) -> list[dict[str, Any]]:
    """[{name, label, ranks, backend}] of the process groups this rank is in (2 ranks or more),
    the default group first; [] when torch.distributed is not initialised."""
    dist = dist or torch_distributed()
    if dist is None:
        return []
    try:
        c10d = dist.distributed_c10d
        world = c10d._world
        pg_map, names, group_ranks = world.pg_map, world.pg_names, world.pg_group_ranks
        default = c10d.GroupMember.WORLD
    except Exception:
        return []
    out = []
    for pg, entry in list(pg_map.items()):
        try:
            ranks = sorted(int(r) for r in group_ranks.get(pg, {}))
            if len(ranks) < 2:
                continue
            backend = str(entry[0]) if isinstance(entry, tuple) else str(entry)
            gname = str(names.get(pg, ""))
            desc = str(getattr(pg, "group_desc", "") or "")
        except Exception:
            continue
        if pg is default:
            name = "world"
        else:
            name = safe_name(f"{desc}:{gname}" if desc and desc not in ("undefined", "default_pg") else f"pg:{gname}")
        out.append({"name": name, "label": desc or gname, "ranks": ranks, "backend": backend, "_pg": pg})
    out.sort(key=lambda d: (d["name"] != "world", d["name"]))
    return out


class CommTimer:
    """Adds up the time of the collectives that finish; ``take()`` at each step boundary returns
    what finished since the previous one (no sync: only counters are read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = 0.0  # finished collectives, seconds (written by any thread, under the lock)
        self._blocked = 0.0  # blocking calls (written by the calling thread, under the lock)
        self._count = 0
        self._depth = threading.local()
        self._patched: list[tuple[Any, str, Any]] = []
        self._hooked: set[int] = set()
        self.active = False
        self.how: list[str] = []

    # -- what finished
    def add(self, seconds: float, blocked: bool = False) -> None:
        with self._lock:
            self._done += seconds
            self._count += 1
            if blocked:
                self._blocked += seconds

    def take(self) -> tuple[float, float, int]:
        """(seconds finished, seconds blocked, collectives) since the last call."""
        with self._lock:
            out = (self._done, self._blocked, self._count)
            self._done = self._blocked = 0.0
            self._count = 0
        return out

    # -- NCCL: completion hooks
    def _on_work(self, info: Any) -> None:
        try:
            d = info.active_duration
            sec = d.total_seconds() if hasattr(d, "total_seconds") else float(d)
            if not sec > 0.0:
                a, b = info.time_started, info.time_finished
                delta = b - a
                sec = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
            if sec > 0.0:
                self.add(sec)
        except Exception:
            pass

    def attach(self, domains: list[dict[str, Any]], dist: Any) -> None:
        """Time the collectives of these groups: hooks where the backend supports them, the
        Python functions for the others (installed once)."""
        unhooked = False
        for d in domains:
            pg = d.get("_pg")
            if pg is None or id(pg) in self._hooked:
                continue
            if d["backend"] in HOOKED_BACKENDS and hasattr(pg, "_register_on_completion_hook"):
                try:
                    pg._register_on_completion_hook(self._on_work)
                    self._hooked.add(id(pg))
                    self.how.append(f"NCCL completion hooks on {d['name']} (CUDA-event durations)")
                    continue
                except Exception:
                    pass
            unhooked = True
        if unhooked and not self._patched:
            self._wrap(dist)
        self.active = bool(self._hooked or self._patched)

    def _wrap(self, dist: Any) -> None:
        modules = [dist]
        c10d = getattr(dist, "distributed_c10d", None)
        if c10d is not None and c10d is not dist:
            modules.append(c10d)
        wrapped: dict[int, Any] = {}
        for mod in modules:
            for name in COLLECTIVES:
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "__hermes_timed__", False):
                    continue
                w = wrapped.get(id(fn))
                if w is None:
                    w = wrapped[id(fn)] = self._timed(fn, dist)
                setattr(mod, name, w)
                self._patched.append((mod, name, fn))
        if self._patched:
            self.how.append("wrappers of the torch.distributed collective calls (blocking calls: the time blocked; "
                            "async_op=True: call to completion)")  # fmt: skip

    def _timed(self, fn: Any, dist: Any) -> Any:
        compiling = _compiling_check()
        try:  # where the group argument sits: a call on a hooked (NCCL) group is counted by its hook
            at = list(inspect.signature(fn).parameters).index("group")
        except (ValueError, TypeError):
            at = None
        c10d = getattr(dist, "distributed_c10d", None)
        timed = _make_timed(fn, self, compiling, at, getattr(getattr(c10d, "GroupMember", None), "WORLD", None),
                            time.perf_counter)  # fmt: skip
        functools.update_wrapper(timed, fn)
        timed.__hermes_timed__ = True  # type: ignore[attr-defined]
        return timed

    def detach(self) -> None:
        for mod, name, fn in reversed(self._patched):
            try:
                setattr(mod, name, fn)
            except Exception:
                pass
        self._patched = []
        self.active = bool(self._hooked)  # NCCL hooks cannot be removed; they only add to counters


# The wrapper is compiled under a file name of its own: in a capture (with_stack) its frame holds
# the collective and the wait for the other ranks, which are not the monitor's own time (hermes
# counts the frames of hermes_kb/monitor/*.py as the monitor's cost in a capture).
_TIMED_SRC = """
def _make_timed(fn, timer, compiling, at, world, perf):
    def timed(*args, **kwargs):
        if compiling():
            return fn(*args, **kwargs)
        if timer._hooked and at is not None:
            g = kwargs.get("group", args[at] if len(args) > at else None)
            if id(world if g is None else g) in timer._hooked:  # its hook counts it
                return fn(*args, **kwargs)
        depth = timer._depth
        if getattr(depth, "n", 0):  # a collective calling another (all_gather_object): time the outer
            return fn(*args, **kwargs)
        depth.n = 1
        t0 = perf()
        try:
            work = fn(*args, **kwargs)
        finally:
            depth.n = 0
        if work is None or not hasattr(work, "get_future"):
            timer.add(perf() - t0, True)
        else:
            try:
                work.get_future().add_done_callback(lambda _f: timer.add(perf() - t0))
            except Exception:  # no future on this backend: count the call only
                timer.add(perf() - t0, True)
        return work
    return timed
"""
_ns: dict[str, Any] = {}
exec(compile(_TIMED_SRC, "<hermes collective timer>", "exec"), _ns)
_make_timed = _ns["_make_timed"]


def _compiling_check():
    torch = sys.modules.get("torch")
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return fn if callable(fn) else (lambda: False)


__all__ = ["COLLECTIVES", "CommTimer", "discover", "safe_name"]
