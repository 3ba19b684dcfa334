"""Dynamic profiling (coarse to fine): capture a few steps with torch.profiler on request,
without restarting the job.

A user runs ``hermes monitor profile RUN_DIR --steps 3``, which writes ``RUN_DIR/profile.request``.
A background thread in every rank's Monitor polls that file (once a second, a stat call); the
training thread only reads a flag at each step boundary. The next step boundary starts the
profiler, and N steps later the trace is written next to the rank's log as
``rank<R>.capture<ID>.json.gz``. The monitor can also request a capture itself when it flags
a fluctuation, within a budget (at most K per hour).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQUEST = "profile.request"


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
    kw: dict[str, Any] = {"activities": acts, "record_shapes": True, "with_stack": True}
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
                 profiler_factory: Callable[[], Any] | None = None):  # fmt: skip
        self.run_dir = run_dir
        self.rank = rank
        self.poll_s = poll_s
        self.budget_per_hour = budget_per_hour
        self.factory = profiler_factory or _torch_profiler
        self.pending: dict | None = None  # set by the watcher thread, read at step boundaries
        self.active: tuple[Any, dict, int] | None = None  # (profiler, request, steps left)
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
        path = self.run_dir / REQUEST
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            req = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if req.get("id") not in self._seen:
            self.pending = req

    def auto_request(self, reason: str) -> bool:
        """Ask for a capture from inside the job (a fluctuation), within the hourly budget."""
        now = time.time()
        while self._auto_times and now - self._auto_times[0] > 3600:
            self._auto_times.popleft()
        if len(self._auto_times) >= self.budget_per_hour or self.pending or self.active:
            return False
        self._auto_times.append(now)
        self.pending = {"id": f"auto{int(now * 1000)}", "steps": 2, "reason": reason, "time": now}
        return True

    def at_step_boundary(self) -> dict | None:
        """Called by Monitor.step(): start, advance or finish a capture. Returns a finished capture."""
        if self.active is not None:
            prof, req, left = self.active
            prof.step() if hasattr(prof, "step") else None
            left -= 1
            if left <= 0:
                return self._finish()
            self.active = (prof, req, left)
            return None
        req, self.pending = self.pending, None
        if req is None or req["id"] in self._seen:
            return None
        self._seen.add(req["id"])
        try:
            prof = self.factory()
            prof.__enter__()
        except Exception as exc:  # no torch, or a profiler already running: say so in the log
            info = {"id": req["id"], "error": f"{type(exc).__name__}: {exc}", "reason": req.get("reason")}
            self.done.append(info)
            return info
        self.active = (prof, req, max(1, int(req.get("steps", 3))))
        return None

    def _finish(self) -> dict:
        prof, req, _ = self.active
        self.active = None
        out = self.run_dir / f"rank{self.rank}.capture{req['id']}.json.gz"
        info: dict[str, Any] = {"id": req["id"], "reason": req.get("reason"), "steps": req.get("steps")}
        try:
            prof.__exit__(None, None, None)
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
