"""Dynamic profiling (coarse to fine): capture a few steps with torch.profiler on request,
without restarting the job.

A user runs ``hermes monitor profile RUN_DIR --steps 3``, which writes ``RUN_DIR/profile.request``.
A background thread in every rank's Monitor polls that file (once a second, a stat call); the
training thread only reads a flag at each step boundary. The next step boundary starts the
profiler, and N steps later the trace is written next to the rank's log as
``rank<R>.capture<ID>.json.gz``. The monitor also requests captures itself (``triggers.py``,
``peers.py``): a request may name the step it starts after, so that a capture planned for the next
occurrence of a recurring slow step waits for it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .safe_read import inside, read_small_json

REQUEST = "profile.request"
# the longest capture the monitor runs (steps): a capture holds the profiler's events in the
# training process until it ends; HERMES_MAX_CAPTURE_STEPS or Monitor(max_capture_steps=...) raises it
MAX_CAPTURE_STEPS = 100
SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a request id becomes part of a file name


def max_capture_steps(given: int | None = None) -> int:
    """The cap on a capture's length: ``given``, else HERMES_MAX_CAPTURE_STEPS, else MAX_CAPTURE_STEPS."""
    if given is not None:
        return max(1, int(given))
    env = os.environ.get("HERMES_MAX_CAPTURE_STEPS", "")
    return int(env) if env.isdigit() and 0 < int(env) <= 1_000_000 else MAX_CAPTURE_STEPS


def valid_request(req: Any, max_steps: int) -> tuple[dict | None, str | None]:
    """A capture request as the monitor runs it, or (None, why not): a mapping with an ``id``
    (letters, digits, ``_``, ``-``, at most 64) and a whole number of ``steps`` from 1 to
    ``max_steps``; ``start_after`` a whole number when given; ``reason`` text."""
    if not isinstance(req, dict):
        return None, "not a JSON object"
    rid = req.get("id")
    if not isinstance(rid, str) or not SAFE_ID.match(rid):
        return None, "its id is missing or not letters, digits, '_' and '-' (at most 64)"
    steps = req.get("steps", 3)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= max_steps:
        return None, f"steps must be a whole number from 1 to {max_steps} (HERMES_MAX_CAPTURE_STEPS raises the cap)"
    after = req.get("start_after")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
        return None, "start_after must be a whole number"
    out = {"id": rid, "steps": steps, "reason": str(req.get("reason", ""))[:200]}
    for k in ("start_after", "time", "auto", "kind", "trigger"):
        if k in req and (k != "time" or isinstance(req[k], (int, float))):
            out[k] = req[k] if k != "trigger" else str(req[k])[:200]
    return out, None


def write_request(run_dir: str | os.PathLike, steps: int, reason: str = "user") -> dict:
    """What `hermes monitor profile` does: a new request every rank will pick up."""
    req = {"id": f"{int(time.time() * 1000)}", "steps": int(steps), "reason": reason, "time": time.time()}
    path = Path(run_dir) / REQUEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(req))
    os.replace(tmp, path)  # atomic: a rank never reads half a request
    return req


def _torch_profiler() -> Any:
    """A torch.profiler.profile for CPU (+CUDA when available), with GC and sync events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    # with_flops: the FLOPs of matmuls and convolutions, the monitor's MFU when it could not count them
    kw: dict[str, Any] = {"activities": acts, "record_shapes": True, "with_stack": True, "with_flops": True}
    try:
        kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            record_python_gc_info=True, enable_cuda_sync_events=True
        )
    except (AttributeError, TypeError):
        pass
    return profile(**kw)


class Capturer:
    """Owned by a Monitor: watches for requests, runs the profiler over whole steps."""

    def __init__(self, run_dir: Path, rank: int, *, poll_s: float = 1.0, budget_per_hour: int = 2,
                 profiler_factory: Callable[[], Any] | None = None, watch: bool = True,
                 on_finish: Callable[[Any, dict], None] | None = None,
                 on_refused: Callable[[str], None] | None = None, max_steps: int | None = None):  # fmt: skip
        self.run_dir = run_dir
        self.rank = rank
        self.poll_s = poll_s
        self.budget_per_hour = budget_per_hour
        self.factory = profiler_factory or _torch_profiler
        self.custom_factory = profiler_factory is not None
        self.pending: dict | None = None  # set by the watcher thread, read at step boundaries
        self.active: tuple[Any, dict, int] | None = None  # (profiler, request, steps left)
        self.first_step: int | None = None  # the first step of the active capture
        self._step_fn: Any = None  # the open ProfilerStep#N record_function
        self._rf: Any = None  # its class
        self.watch = watch  # False: the owner calls _check() from its own thread
        self.on_finish = on_finish
        self.on_refused = on_refused  # told why a request was not run (a note in the rank's log)
        self.max_steps = max_capture_steps(max_steps)
        self.done: list[dict] = []
        self._seen: set[str] = set()
        self._auto_times: deque[float] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mtime = 0.0

    def start(self) -> None:
        self._check()  # an old request present at start-up is remembered, not run
        if self.pending is not None:
            self._seen.add(self.pending["id"])
            self.pending = None
        if self.watch:
            self._thread = threading.Thread(target=self._watch, name="hermes-capture-watch", daemon=True)
            self._thread.start()

    def stop(self) -> dict | None:
        """Stop watching; a capture still running is finished (and returned)."""
        self._stop.set()
        return self._finish() if self.active is not None else None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._check()

    def _check(self) -> None:
        """Pick up a new request. Whatever is in the file (a FIFO, a device, a huge or malformed
        request), this never blocks and never raises: a request it cannot run is refused with a
        note, and training goes on."""
        path = self.run_dir / REQUEST
        try:
            st = path.lstat()
        except OSError:
            return
        if st.st_mtime == self._mtime:
            return
        self._mtime = st.st_mtime
        raw, problem = read_small_json(path)
        req, invalid = valid_request(raw, self.max_steps) if problem is None else (None, problem)
        if req is None:
            self._refuse(f"{REQUEST} ignored: {invalid}")
            return
        if req["id"] not in self._seen and (self.pending is None or self.pending.get("auto")):
            self.pending = req  # a person's request goes before a planned automatic one

    def _refuse(self, why: str) -> None:
        if self.on_refused is not None:
            try:
                self.on_refused(why)
            except Exception:  # never the training's problem
                pass

    def auto_request(self, reason: str) -> bool:
        """Ask for a capture from inside the job (a fluctuation), within the hourly budget."""
        now = time.time()
        while self._auto_times and now - self._auto_times[0] > 3600:
            self._auto_times.popleft()
        if len(self._auto_times) >= self.budget_per_hour or self.pending or self.active:
            return False
        self._auto_times.append(now)
        self.pending = {"id": f"auto{int(now * 1000)}", "steps": 2, "reason": reason, "time": now, "auto": True}
        return True

    def advance(self, step: int) -> None:
        """A captured step ended and the capture goes on (more than one step left): the next
        ProfilerStep annotation. One frame: what the monitor adds to a captured step stays small."""
        prof, req, left = self.active
        self.active = (prof, req, left - 1)
        try:
            fn, self._step_fn = self._step_fn, None
            if fn is not None:
                fn.__exit__(None, None, None)
            if self.custom_factory:
                if hasattr(prof, "step"):
                    prof.step()
            elif self._rf is not None:
                self._step_fn = self._rf(f"ProfilerStep#{step + 1}")
                self._step_fn.__enter__()
        except Exception:  # never the training's problem
            self._step_fn = None

    def at_step_boundary(self, step: int | None = None) -> dict | None:
        """Called by Monitor.step() at the end of ``step``: start, advance or finish a capture.
        Returns a finished capture. A request with ``start_after`` waits for that step."""
        if self.active is not None:
            prof, req, left = self.active
            self._mark_step(None)
            if self.custom_factory and hasattr(prof, "step"):  # torch.profiler without a schedule: step() only counts
                prof.step()
            left -= 1
            if left <= 0:
                return self._finish()
            self.active = (prof, req, left)
            self._mark_step(step + 1 if step is not None else None)
            return None
        req = self.pending
        if req is None:
            return None
        after = req.get("start_after")
        if step is not None and isinstance(after, int) and step < after:
            return None
        self.pending = None
        if req["id"] in self._seen:
            return None
        self._seen.add(req["id"])
        try:
            prof = self.factory()
            prof.__enter__()
        except Exception as exc:  # no torch, or a profiler already running: say so in the log
            info = {"id": req["id"], "error": f"{type(exc).__name__}: {exc}", "reason": req.get("reason")}
            self.done.append(info)
            return info
        self.active = (prof, req, max(1, min(int(req.get("steps", 3)), self.max_steps)))
        self.first_step = step + 1 if step is not None else None
        self._mark_step(self.first_step)
        return None

    def _mark_step(self, step: int | None) -> None:
        """Close the open ``ProfilerStep#N`` annotation and, with ``step``, open the next: what
        torch.profiler records only under a schedule, named by the monitor's own step number so
        that the trace's steps are the log's."""
        fn, self._step_fn = self._step_fn, None
        if fn is not None:
            try:
                fn.__exit__(None, None, None)
            except Exception:
                pass
        if step is None or self.custom_factory:
            return
        try:
            if self._rf is None:
                import torch

                # the C++ context manager (torch >= 2.2): no Python frames in the trace it annotates
                self._rf = getattr(torch._C._profiler, "_RecordFunctionFast", None)
                if self._rf is None:
                    from torch.autograd.profiler import record_function

                    self._rf = record_function
            self._step_fn = self._rf(f"ProfilerStep#{step}")
            self._step_fn.__enter__()
        except Exception:
            self._step_fn = None

    def _finish(self) -> dict:
        prof, req, _ = self.active
        self.active = None
        out = inside(self.run_dir, f"rank{self.rank}.capture{req['id']}.json.gz")  # ids are checked: a name here
        info: dict[str, Any] = {"id": req["id"], "reason": req.get("reason"), "steps": req.get("steps")}
        if self.first_step is not None:
            info["first_step"] = self.first_step
        for k in ("kind", "trigger"):
            if k in req:
                info[k] = req[k]
        self.first_step = None
        self._mark_step(None)
        try:
            prof.__exit__(None, None, None)
            if out is None:
                raise ValueError(f"capture id {req['id']!r} is not a file name")
            if self.on_finish is not None:
                try:
                    self.on_finish(prof, info)
                except Exception:
                    pass
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(raw))
                with open(raw, "rb") as src, gzip.open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            info["trace"] = str(out)
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
        self.done.append(info)
        return info
