"""The Monitor: one cheap record per training step, written as JSON lines."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .capture import Capturer
from .detect import RollingDetector
from .env import detect_rank, environment


def _proc_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _system_cpu() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs, from /proc/stat (Linux)."""
    try:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()[1:]
    except OSError:
        return None
    vals = [float(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
    return sum(vals) - idle, sum(vals)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class Monitor:
    """Context manager around a training loop; call ``step()`` once per step."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        rank: int | None = None,
        samples_per_step: int | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        sample_every: int = 50,
        window: int = 64,
        k: float = 5.0,
        capture: bool = True,
        auto_capture: bool = False,
        captures_per_hour: int = 2,
        profiler_factory=None,
        poll_s: float = 1.0,
    ):
        self.run_dir = Path(run_dir)
        self.rank = detect_rank() if rank is None else rank
        self.samples_per_step = samples_per_step
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.sample_every = max(1, sample_every)
        self.detector = RollingDetector(window=window, k=k)
        self.step_index = 0
        self.fluctuations = 0
        self._fh = None
        self._t_last: float | None = None
        self._data_wait = 0.0
        self._gc_count = 0
        self._gc_pause = 0.0
        self._gc_start: float | None = None
        self._cpu_last: tuple[float, float, tuple[float, float] | None] | None = None
        self.auto_capture = auto_capture
        self.capturer = (
            Capturer(self.run_dir, self.rank, poll_s=poll_s, budget_per_hour=captures_per_hour,
                     profiler_factory=profiler_factory) if capture else None
        )  # fmt: skip

    # -- lifecycle
    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # block-buffered, flushed at least once a second (a crash loses at most the last second)
        self._fh = open(self.run_dir / f"rank{self.rank}.jsonl", "a", encoding="utf-8")
        self._flushed = time.perf_counter()
        self._write({"type": "environment", "rank": self.rank, "time": time.time(), **environment()})
        gc.callbacks.append(self._on_gc)
        if self.capturer is not None:
            self.capturer.start()
        self._t_last = time.perf_counter()
        self._cpu_last = (time.perf_counter(), _proc_cpu_seconds(), _system_cpu())

    def close(self) -> None:
        if self.capturer is not None:
            info = self.capturer.stop()
            if info is not None:
                self._write({"type": "capture", "rank": self.rank, **info})
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._fh is not None:
            self._write({"type": "end", "rank": self.rank, "steps": self.step_index, "fluctuations": self.fluctuations,
                         "time": time.time()})  # fmt: skip
            self._fh.close()
            self._fh = None

    # -- measurement
    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self._gc_pause += time.perf_counter() - self._gc_start
            self._gc_count += 1
            self._gc_start = None

    def wrap(self, iterable: Iterable) -> Iterator:
        """Yield from ``iterable``, adding the time blocked in ``next()`` to the step's data wait."""
        it = iter(iterable)
        while True:
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self._data_wait += time.perf_counter() - t
            yield item

    def step(self, samples: int | None = None, **extra: Any) -> dict:
        """Close the current step: one JSON line. Returns the record."""
        now = time.perf_counter()
        wall = now - (self._t_last if self._t_last is not None else now)
        self._t_last = now
        flagged, med = self.detector.update(wall)
        self.fluctuations += flagged
        n = samples if samples is not None else self.samples_per_step
        rec: dict[str, Any] = {
            "type": "step",
            "rank": self.rank,
            "step": self.step_index,
            "time": time.time(),
            "wall_s": wall,
            "data_wait_s": self._data_wait,
            "gc_count": self._gc_count,
            "gc_pause_s": self._gc_pause,
            "fluctuation": flagged,
        }
        if med is not None:
            rec["rolling_median_s"] = med
        if n and wall > 0:
            rec["samples_per_s"] = n / wall
        if self.flops_per_step and self.peak_flops and wall > 0:
            rec["mfu"] = self.flops_per_step / wall / self.peak_flops
        if self.step_index % self.sample_every == 0:
            rec.update(self._resources())
        rec.update(extra)
        self._write(rec)
        if self.capturer is not None:
            if flagged and self.auto_capture:
                self.capturer.auto_request(f"fluctuation at step {self.step_index}")
            finished = self.capturer.at_step_boundary()
            if finished is not None:
                self._write({"type": "capture", "rank": self.rank, "step": self.step_index, **finished})
        self.step_index += 1
        self._data_wait = 0.0
        self._gc_count = 0
        self._gc_pause = 0.0
        return rec

    def _resources(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        t, cpu, sys_cpu = time.perf_counter(), _proc_cpu_seconds(), _system_cpu()
        if self._cpu_last is not None:
            t0, cpu0, sys0 = self._cpu_last
            if t > t0:
                out["process_cpu_cores"] = (cpu - cpu0) / (t - t0)
            if sys_cpu and sys0 and sys_cpu[1] > sys0[1]:
                out["system_cpu_ratio"] = (sys_cpu[0] - sys0[0]) / (sys_cpu[1] - sys0[1])
        self._cpu_last = (t, cpu, sys_cpu)
        rss = _rss_bytes()
        if rss is not None:
            out["rss_bytes"] = rss
        try:
            out["affinity_count"] = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            pass
        return out

    def _write(self, rec: dict) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            now = time.perf_counter()
            if now - self._flushed >= 1.0 or rec.get("type") != "step":
                self._fh.flush()
                self._flushed = now
