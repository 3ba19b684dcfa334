"""What the Monitor (recorder.py) measures besides the step's clock: the process' CPU time and
page faults (``process_usage``), optimizer.step() through torch's hooks, and the resource sample
taken about once a second (``ResourceSampling._resources``): run-queue wait, process and system
CPU use, the other processes, torch threads, memory, affinity and the device allocator."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    import resource
except ImportError:  # Windows
    pass

from .device import DeviceTimer, cuda_event_factory, device_allocator
from .procs import ProcessSampler, main_thread_ns


def process_usage() -> tuple[float, float, int]:
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


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class ResourceSampling:
    """The Monitor's optimizer hooks, device timer and resource sample. A mixin: the state it
    reads and updates is the Monitor's (set in its ``__init__``), and the sample also rescans the
    process groups (``AutoCaptures._scan_domains``, auto_capture.py)."""

    def _init_sampling(self, procs_every_s: float, device_events: Callable[[], Any] | bool | None) -> None:
        """The sampling state (``Monitor.__init__``'s arguments of the same names)."""
        self._cpu_last: tuple[float, float, tuple[float, float] | None] | None = None
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
            _, sys_s, flt = process_usage()
            self._opt_open = (time.perf_counter(), sys_s, flt)

    def _opt_post(self, *_: Any) -> None:
        self._opt_depth = max(self._opt_depth - 1, 0)
        if self._opt_depth == 0 and self._opt_open is not None:
            t0, s0, f0 = self._opt_open
            _, sys_s, flt = process_usage()
            self._opt[0] += time.perf_counter() - t0
            self._opt[1] += sys_s - s0
            self._opt[2] += flt - f0
            self._opt_open = None

    def _maybe_device(self) -> None:
        if self.device is not None or self._device_events is False:
            return
        factory = self._device_events if callable(self._device_events) else cuda_event_factory()
        if factory is not None:
            self.device = DeviceTimer(factory)
            self.device.start()

    def _resources(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self._maybe_device()
        self._hook_optimizers()  # torch imported after start()
        self._scan_domains()  # torch.distributed initialised after start()
        t, cpu, sys_cpu = time.perf_counter(), process_usage()[0], system_cpu_jiffies()
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
        rss = rss_bytes()
        if rss is not None:
            out["rss_bytes"] = rss
        out.update(device_allocator(torch))
        try:
            out["affinity_count"] = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            pass
        return out
