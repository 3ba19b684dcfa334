"""The Monitor: one cheap record per training step, written as JSON lines."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # Windows
    pass

from .capture import Capturer
from .detect import RollingDetector
from .device import DeviceTimer, cuda_event_factory
from .env import detect_rank, environment
from .procs import ProcessSampler, main_thread_ns


_ENC = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _usage() -> tuple[float, float, int]:
    """(user+system CPU seconds, system CPU seconds, minor page faults) of the whole process: one
    getrusage call, microsecond resolution. Minor faults are pages the kernel had to map (and
    zero) on first touch: memory the allocator got fresh from the OS."""
    try:
        r = resource.getrusage(resource.RUSAGE_SELF)
    except (NameError, OSError):  # no resource module (Windows)
        t = os.times()
        return t.user + t.system, t.system, 0
    return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt


def system_cpu_jiffies() -> tuple[float, float] | None:
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
        domains: Sequence[str] | None = None,
        procs_every_s: float = 10.0,
        device_events: Callable[[], Any] | bool | None = None,
    ):
        """``domains``: names of the communication domains (process groups) this rank synchronises
        in, e.g. ``["dp0", "tp3"]``; offline slow-rank detection compares ranks within each (all
        ranks of the run when absent). ``procs_every_s``: least interval between scans of the other
        processes (0 disables). ``device_events``: an event factory for device step times; None
        uses CUDA events once torch has initialised CUDA, False never."""
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
        self.domains = list(domains) if domains else None
        self.auto_capture = auto_capture
        self._events: dict[str, float] = {}
        self._gc_gen2 = 0
        self._usage_last = (0.0, 0.0, 0)
        # optimizer.step() time, system time and faults in the current step (global torch hooks)
        self._opt = [0.0, 0.0, 0]
        self._opt_open: tuple[float, float, int] | None = None
        self._opt_depth = 0
        self._opt_hooks: list[Any] = []
        self._procs = ProcessSampler() if procs_every_s > 0 else None
        self._procs_every = procs_every_s
        self._procs_at = float("-inf")
        self._rq_last: tuple[float, int, int] | None = None  # (time, on-CPU ns, run-queue wait ns)
        self._device_events = device_events
        self.device: DeviceTimer | None = None
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
        env = environment()
        if self.domains:
            env["domains"] = self.domains
        self._write({"type": "environment", "rank": self.rank, "time": time.time(), **env})
        gc.callbacks.append(self._on_gc)
        if self.capturer is not None:
            self.capturer.start()
        self._maybe_device()
        if self._procs is not None:
            self._procs.sample()  # the baseline the first scan diffs against
            self._procs_at = time.perf_counter()
        rq = main_thread_ns()
        self._rq_last = (time.perf_counter(), *rq) if rq is not None else None
        self._t_last = time.perf_counter()
        self._usage_last = _usage()
        self._hook_optimizers()
        self._cpu_last = (time.perf_counter(), self._usage_last[0], system_cpu_jiffies())

    def _hook_optimizers(self) -> None:
        """Time every optimizer.step() through torch's global step hooks, when torch is already
        imported (the monitor never imports it): an unprofiled measure of the update's share of
        the step, and of the page faults inside and outside it."""
        optim = getattr(sys.modules.get("torch.optim.optimizer"), "register_optimizer_step_pre_hook", None)
        if optim is None or self._opt_hooks:
            return
        post = sys.modules["torch.optim.optimizer"].register_optimizer_step_post_hook
        self._opt_hooks = [optim(self._opt_pre), post(self._opt_post)]

    def _opt_pre(self, *_: Any) -> None:
        self._opt_depth += 1
        if self._opt_depth == 1:  # an optimizer wrapping another: only the outer call counts
            _, sys_s, flt = _usage()
            self._opt_open = (time.perf_counter(), sys_s, flt)

    def _opt_post(self, *_: Any) -> None:
        self._opt_depth = max(self._opt_depth - 1, 0)
        if self._opt_depth == 0 and self._opt_open is not None:
            t0, s0, f0 = self._opt_open
            _, sys_s, flt = _usage()
            self._opt[0] += time.perf_counter() - t0
            self._opt[1] += sys_s - s0
            self._opt[2] += flt - f0
            self._opt_open = None

    def close(self) -> None:
        for h in self._opt_hooks:
            h.remove()
        self._opt_hooks = []
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
            if info.get("generation") == 2:
                self._gc_gen2 += 1

    @contextmanager
    def event(self, name: str) -> Iterator[None]:
        """Time a named piece of work (``with mon.event("checkpoint"): save(...)``); its duration
        is stored in the record of the step whose wall time includes it."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.mark(name, time.perf_counter() - t)

    def mark(self, name: str, seconds: float = 0.0) -> None:
        """Record that ``name`` happened in the current step (and took ``seconds``)."""
        self._events[name] = self._events.get(name, 0.0) + seconds

    def add_data_wait(self, seconds: float) -> None:
        """Add time blocked waiting for input, for loops that cannot use ``wrap()`` (callbacks)."""
        self._data_wait += seconds

    def _maybe_device(self) -> None:
        if self.device is not None or self._device_events is False:
            return
        factory = self._device_events if callable(self._device_events) else cuda_event_factory()
        if factory is not None:
            self.device = DeviceTimer(factory)
            self.device.start()

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
        usage = _usage()
        cpu, sys_s, flt = (usage[0] - self._usage_last[0], usage[1] - self._usage_last[1],
                           usage[2] - self._usage_last[2])  # fmt: skip
        self._usage_last = usage
        flagged, med = self.detector.update(wall)
        self.fluctuations += flagged
        n = samples if samples is not None else self.samples_per_step
        i, wall_time = self.step_index, time.time()
        dw, gcn, gcp = self._data_wait, self._gc_count, self._gc_pause
        opt: dict[str, Any] = {}
        if self._gc_gen2:
            opt["gc_gen2"] = self._gc_gen2
            self._gc_gen2 = 0
        if self._events:
            opt["events"] = self._events
            self._events = {}
        if self._opt[0] > 0.0:
            opt["optimizer_s"], opt["optimizer_sys_s"], opt["optimizer_minflt"] = self._opt
            self._opt = [0.0, 0.0, 0]
        self._opt_depth, self._opt_open = 0, None  # a step() that raised never ran its post hook
        if self.device is not None:
            done = self.device.boundary(i)
            if done:
                opt["device_s"] = done
        if i % self.sample_every == 0:
            opt.update(self._resources())
        opt.update(extra)
        # the fields most steps have are formatted by hand: a third of the cost of json.dumps
        line = (f'{{"type":"step","rank":{self.rank},"step":{i},"time":{wall_time!r},"wall_s":{wall!r},'
                f'"data_wait_s":{dw!r},"gc_count":{gcn},"gc_pause_s":{gcp!r},"cpu_s":{cpu!r},"sys_s":{sys_s!r},'
                f'"minflt":{flt},"fluctuation":{"true" if flagged else "false"}')  # fmt: skip
        if med is not None:
            line += f',"rolling_median_s":{med!r}'
        sps = n / wall if n and wall > 0 else None
        if sps is not None:
            line += f',"samples_per_s":{sps!r}'
        mfu = self.flops_per_step / wall / self.peak_flops if self.flops_per_step and self.peak_flops and wall > 0 else None
        if mfu is not None:
            line += f',"mfu":{mfu!r}'
        if self._fh is not None:
            self._fh.write(f"{line},{_ENC(opt)[1:]}\n" if opt else line + "}\n")
            if now - self._flushed >= 1.0:
                self._fh.flush()
                self._flushed = now
        if self.capturer is not None:
            if flagged and self.auto_capture:
                self.capturer.auto_request(f"fluctuation at step {i}")
            finished = self.capturer.at_step_boundary()
            if finished is not None:
                self._write({"type": "capture", "rank": self.rank, "step": i, **finished})
        self.step_index += 1
        self._data_wait = 0.0
        self._gc_count = 0
        self._gc_pause = 0.0
        rec = {"type": "step", "rank": self.rank, "step": i, "time": wall_time, "wall_s": wall, "data_wait_s": dw,
               "gc_count": gcn, "gc_pause_s": gcp, "cpu_s": cpu, "sys_s": sys_s, "minflt": flt,
               "fluctuation": flagged}  # fmt: skip
        for key, v in (("rolling_median_s", med), ("samples_per_s", sps), ("mfu", mfu)):
            if v is not None:
                rec[key] = v
        rec.update(opt)
        return rec

    def _resources(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self._maybe_device()
        self._hook_optimizers()  # torch imported after start()
        t, cpu, sys_cpu = time.perf_counter(), _usage()[0], system_cpu_jiffies()
        rq = main_thread_ns()
        if rq is not None and self._rq_last is not None and t > self._rq_last[0]:
            dt = t - self._rq_last[0]
            out["runqueue_wait_ratio"] = max(rq[1] - self._rq_last[2], 0) / 1e9 / dt
            out["main_run_ratio"] = max(rq[0] - self._rq_last[1], 0) / 1e9 / dt
        self._rq_last = (t, *rq) if rq is not None else None
        if self._procs is not None and t - self._procs_at >= self._procs_every:
            self._procs_at = t
            procs = self._procs.sample(t)
            if procs is not None:
                out.update(procs)
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "get_num_threads"):
            out["torch_threads"] = torch.get_num_threads()
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
            self._fh.write(_ENC(rec) + "\n")
            now = time.perf_counter()
            if now - self._flushed >= 1.0 or rec.get("type") != "step":
                self._fh.flush()
                self._flushed = now
