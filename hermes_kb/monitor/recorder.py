"""The Monitor: one cheap record per training step, written as JSON lines."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import resource

    _getrusage, _SELF = resource.getrusage, resource.RUSAGE_SELF
except ImportError:  # Windows
    pass

from .capture import Capturer
from .detect import RollingDetector
from .device import DeviceTimer, cuda_event_factory, device_allocator
from .domains import CommTimer, torch_distributed, discover
from .env import detect_rank, environment
from .peers import PeerBoard
from .procs import ProcessSampler, main_thread_ns
from .triggers import Budget, RateDrop, SlowSteps, WarmupDetector


_ENC = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_NUMERIC = frozenset(("optimizer_s", "optimizer_sys_s", "comm_s", "comm_blocked_s"))
_COUNTS = frozenset(("optimizer_minflt", "gc_gen2"))


def _fields(opt: dict) -> str:
    """The optional fields of a step record, as ',"key":value...': the frequent numeric ones by
    hand, the rest (events, device times, resource samples, extras) through json."""
    out = []
    rest = {}
    for k, v in opt.items():
        if k in _NUMERIC and v.__class__ is float:
            out.append(',"%s":%.6g' % (k, v))
        elif k in _COUNTS and v.__class__ is int:
            out.append(',"%s":%d' % (k, v))
        else:
            rest[k] = v
    if rest:
        out.append("," + _ENC(rest)[1:-1])
    return "".join(out)


_LINE = ('{"type":"step","rank":%d,"step":%d,"time":%.6f,"wall_s":%.6g,"data_wait_s":%.6g,"gc_count":%d,'
         '"gc_pause_s":%.6g,"cpu_s":%.6g,"sys_s":%.6g,"minflt":%d,"fluctuation":%s')


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


NOTES = "rank{rank}.monitor.jsonl"  # what the monitor found and decided: warm-up, triggers, domains, FLOPs
PEER_WINDOW = 32  # observed steps behind each rank's summary for the slow-rank verdicts
QUIET_S = 10.0  # least interval between two notes of the same refused trigger
DETECTOR_REFRESH = 64  # steps between two recomputations of the rolling median and MAD (once the window is full)
KIND_WORDS = {"slow_step": "slow step", "slow_rank": "slow rank", "throughput_drop": "throughput drop"}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2.0


# The data-wait generator is compiled under a file name of its own: in a capture (with_stack) its
# frame holds the DataLoader's work, which is not the monitor's own time (hermes counts the frames
# of hermes_kb/monitor/*.py as the monitor's cost in a capture).
# It also takes the process' CPU time around next(): a loader without workers prepares the batch
# in this process, so its data wait is CPU work the step's CPU time already holds (the slow-rank
# comparison must not count it twice); with workers the wait is idle here.
_WRAP_SRC = """
def _wrapped(mon, it, perf, cpu):
    while True:
        t, c = perf(), cpu()
        try:
            item = next(it)
        except StopIteration:
            return
        mon._data_wait += perf() - t
        mon._data_wait_cpu = (mon._data_wait_cpu or 0.0) + (cpu() - c)
        yield item
"""
_ns: dict[str, Any] = {}
exec(compile(_WRAP_SRC, "<hermes data wait>", "exec"), _ns)
_wrapped = _ns["_wrapped"]


class _Ticker:
    """The monitor's one background thread: runs each task at its own interval, never raising.
    While ``paused`` (a capture is running: the profiler would record this thread's work) only
    the tasks that are not ``pausable`` run."""

    def __init__(self, tasks: list[tuple[float, Callable[[], None], bool]]):
        self.tasks = [[max(float(every), 0.01), fn, pausable, float("-inf")] for every, fn, pausable in tasks]
        self.period = min(t[0] for t in self.tasks)
        self.paused = False
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.monotonic()
            for task in self.tasks:
                if now - task[3] < task[0] - 1e-3 or (self.paused and task[2]):
                    continue
                task[3] = now
                try:
                    task[1]()
                except Exception:
                    self.errors += 1


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
        sample_every: int | None = None,
        sample_s: float = 1.0,
        window: int = 64,
        k: float = 5.0,
        capture: bool = True,
        auto_capture: bool = True,
        captures_per_hour: int = 3,
        profiler_factory=None,
        poll_s: float = 1.0,
        domains: Sequence[str] | None = None,
        procs_every_s: float = 10.0,
        device_events: Callable[[], Any] | bool | None = None,
        warmup: int | str = "auto",
        max_warmup_steps: int = 500,
        capture_steps: int = 3,
        slow_rank_lag: float | None = 0.10,
        drop: float | None = 0.15,
        peers_every_s: float = 5.0,
        comm: bool = True,
        flops: bool | str = "auto",
        triggers: bool = True,
    ):
        """``domains``: names of the communication domains (process groups) this rank synchronises
        in, e.g. ``["dp0", "tp3"]``; once torch.distributed is initialised its process groups are
        found by themselves. ``procs_every_s``: least interval between scans of the other
        processes (0 disables). ``device_events``: an event factory for device step times; None
        uses CUDA events once torch has initialised CUDA, False never. ``sample_every``: take the
        resource sample every N steps; by default (None) about every ``sample_s`` seconds.

        Automatic captures (docs/monitor.md): ``triggers`` watches the steps after ``warmup``
        ("auto": detected from the step times, or a number of steps; at most
        ``max_warmup_steps``) for a slow step (``window``, ``k``), a drop of ``drop`` in throughput
        or MFU, and this rank being the slowest of a domain by ``slow_rank_lag`` of the step
        (compared every ``peers_every_s`` through ``RUN_DIR/peers``); with ``auto_capture`` each
        asks for a ``capture_steps``-step capture, at most ``captures_per_hour`` an hour, and
        every trigger is written with its reason to ``RUN_DIR/rank<R>.monitor.jsonl``. ``comm``
        times the collectives of torch.distributed; ``flops="auto"`` counts the FLOPs of one
        step after warm-up for MFU when ``flops_per_step`` is not given."""
        self.run_dir = Path(run_dir)
        self.rank = detect_rank() if rank is None else rank
        self.samples_per_step = samples_per_step
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.sample_every = max(1, sample_every) if sample_every else None
        self.sample_s = sample_s
        self.detector = RollingDetector(window=window, k=k, refresh=DETECTOR_REFRESH)
        self.step_index = 0
        self.fluctuations = 0
        self._fh = None
        self._notes_fh = None
        self._t_last: float | None = None
        self._data_wait = 0.0
        self._data_wait_cpu: float | None = None  # None: no wait measured through wrap() in the step
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
        self._sample_at = float("-inf")
        self._rq_last: tuple[float, int, int] | None = None  # (time, on-CPU ns, run-queue wait ns)
        self._device_events = device_events
        self.device: DeviceTimer | None = None
        self.capturer = (
            Capturer(self.run_dir, self.rank, poll_s=poll_s, budget_per_hour=captures_per_hour,
                     profiler_factory=profiler_factory, watch=False, on_finish=self._capture_finished)
            if capture else None
        )  # fmt: skip
        self.poll_s = poll_s
        # automatic captures
        self.triggers = triggers
        self.capture_steps = max(1, capture_steps)
        self.warmup = WarmupDetector(max_steps=max_warmup_steps, fixed=warmup if isinstance(warmup, int) else None)
        self.slow = SlowSteps(span=self.capture_steps)
        self.rate_drop = RateDrop(drop=drop) if drop else None
        self.budget = Budget(captures_per_hour)
        self._skip_until = -1  # steps up to this one were perturbed by the monitor (capture, FLOP count)
        # the last observed steps after warm-up, for the slow-rank board: wall, communication, CPU, data wait
        self._pw, self._pm, self._pc, self._pd = (deque(maxlen=PEER_WINDOW) for _ in range(4))
        self._last_step_seen = -1
        self.board = (PeerBoard(self.run_dir, self.rank, every_s=peers_every_s, lag=slow_rank_lag,
                                stats=self._peer_stats, domains=self._board_domains)
                      if triggers and slow_rank_lag else None)  # fmt: skip
        self._ticker: _Ticker | None = None
        self._captured_walls: list[tuple[int, float]] = []
        self._quiet: dict[tuple, tuple[float, int]] = {}  # refused triggers: (kind, reason) -> (last note, left out)
        self._left_out = 0
        self.trigger_errors = 0  # exceptions inside the triggers, caught (the monitor never raises into training)
        self._med_obj: float | None = None
        self._med_txt = ""
        self._epoch = time.time() - time.perf_counter()
        self._bg_flush = False  # the background thread flushes the log
        # communication domains and time
        self._comm = CommTimer() if comm else None
        self.found_domains: list[dict[str, Any]] = []
        self._domain_sig: list | None = None
        # FLOPs
        self._flops_mode = flops
        self._flop_counter: Any = None
        self._flop_step: int | None = None
        self.flops_source = "given" if flops_per_step else None

    # -- lifecycle
    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # block-buffered, flushed at least once a second (a crash loses at most the last second)
        # binary, a large buffer, flushed at least once a second (a crash loses at most the last
        # second) by the background thread when there is one: the write system call stays off the
        # training thread (BufferedWriter has its own lock)
        self._fh = open(self.run_dir / f"rank{self.rank}.jsonl", "ab", buffering=1 << 20)
        self._flushed = time.perf_counter()
        env = environment()
        if self.domains:
            env["domains"] = self.domains
        self._write({"type": "environment", "rank": self.rank, "time": time.time(), **env})
        if self.triggers:
            self._notes_fh = open(self.run_dir / NOTES.format(rank=self.rank), "a", encoding="utf-8")
            self._note({"type": "start", "pid": os.getpid(), "warmup": "auto" if self.warmup.fixed is None
                        else self.warmup.fixed, "captures_per_hour": self.budget.per_hour,
                        "auto_capture": bool(self.auto_capture and self.capturer is not None)})  # fmt: skip
        gc.callbacks.append(self._on_gc)
        tasks: list[tuple[float, Callable[[], None], bool]] = []
        if self.capturer is not None:
            self.capturer.start()
            tasks.append((self.poll_s, self.capturer._check, False))
        if tasks:
            tasks.append((1.0, self._flush, False))
            self._bg_flush = True
        if self.board is not None:
            tasks.append((self.board.every_s, self.board.tick, True))
        if tasks:
            self._ticker = _Ticker(tasks)
            self._ticker.start()
        self._maybe_device()
        self._scan_domains()
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
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None
        if self._flop_counter is not None:
            self._flop_counter.end()  # the loop ended inside the counted step
            self._flop_counter = None
        for h in self._opt_hooks:
            h.remove()
        self._opt_hooks = []
        if self._comm is not None:
            self._comm.detach()
        if self.capturer is not None:
            pending = self.capturer.pending
            info = self.capturer.stop()
            if info is not None:
                self._write({"type": "capture", "rank": self.rank, "step": self.step_index - 1, **info})
                self._note_capture(info)
            elif pending is not None and pending.get("auto"):
                self._note({"type": "trigger_end", "id": pending["id"], "kind": pending.get("kind"),
                            "captured": False, "why_not": "the run ended before the planned capture"})  # fmt: skip
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._fh is not None:
            self._write({"type": "end", "rank": self.rank, "steps": self.step_index, "fluctuations": self.fluctuations,
                         "time": time.time()})  # fmt: skip
            self._fh.close()
            self._fh = None
        if self._notes_fh is not None:
            self._note({"type": "end", "steps": self.step_index})
            self._notes_fh.close()
            self._notes_fh = None

    # -- measurement
    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            # a collection that began before this step did (on another thread, e.g. the monitor's
            # own) counts only from the step's start: a step's pause never exceeds its wall time
            # (or while start() was still setting up, before the first step began: not counted)
            last = self._t_last
            if last is not None:
                self._gc_pause += max(time.perf_counter() - max(self._gc_start, last), 0.0)
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
        return _wrapped(self, iter(iterable), time.perf_counter, time.process_time)

    def step(self, samples: int | None = None, **extra: Any) -> dict:
        """Close the current step: one JSON line. Returns the record."""
        now = time.perf_counter()
        last = self._t_last
        wall = now - last if last is not None else 0.0
        self._t_last = now
        try:
            r = _getrusage(_SELF)
            u = (r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt)
        except NameError:  # no resource module (Windows)
            u = _usage()
        u0 = self._usage_last
        cpu, sys_s, flt = u[0] - u0[0], u[1] - u0[1], u[2] - u0[2]
        self._usage_last = u
        i = self.step_index
        if self._flop_step == i:
            try:
                self._flops_counted(i)
            except Exception:
                self.trigger_errors += 1
        observed = i > self._skip_until
        if observed:
            flagged, med = self.detector.update(wall)
            if flagged:
                self.fluctuations += 1
        else:  # a step the monitor slowed itself (profiled, FLOP-counted): not judged, not in the window
            flagged, med = False, self.detector._med
        n = samples if samples is not None else self.samples_per_step
        wall_time = self._epoch + now  # the wall clock, without a second clock read (resynchronised at each sample)
        dw, dwc, gcn, gcp = self._data_wait, self._data_wait_cpu, self._gc_count, self._gc_pause
        opt: dict[str, Any] = {}
        if dwc is not None:
            opt["data_wait_cpu_s"] = max(dwc, 0.0)
        if self._gc_gen2:
            opt["gc_gen2"] = self._gc_gen2
            self._gc_gen2 = 0
        if self._events:
            opt["events"] = self._events
            self._events = {}
        if self._opt[0] > 0.0:
            opt["optimizer_s"], opt["optimizer_sys_s"], opt["optimizer_minflt"] = self._opt
            self._opt = [0.0, 0.0, 0]
        if self._opt_depth:
            self._opt_depth, self._opt_open = 0, None  # a step() that raised never ran its post hook
        comm = None
        if self._comm is not None and self._comm.active:
            comm, blocked, _ = self._comm.take()
            opt["comm_s"] = comm
            if blocked > 0.0:
                opt["comm_blocked_s"] = blocked
        if self.device is not None:
            done = self.device.boundary(i)
            if done:
                opt["device_s"] = done
        cap = self.capturer
        capturing = cap is not None and cap.active is not None
        if observed and not capturing and (now - self._sample_at >= self.sample_s if self.sample_every is None
                                           else i % self.sample_every == 0):  # fmt: skip
            self._sample_at = now
            opt.update(self._resources())
            self._epoch = time.time() - time.perf_counter()
        if extra:
            opt.update(extra)
        # the fields every step has, formatted by hand to 6 significant digits (a third of the cost
        # of json.dumps, half that of repr)
        line = _LINE % (self.rank, i, wall_time, wall, dw, gcn, gcp, cpu, sys_s, flt, "true" if flagged else "false")
        rec = {"type": "step", "rank": self.rank, "step": i, "time": wall_time, "wall_s": wall, "data_wait_s": dw,
               "gc_count": gcn, "gc_pause_s": gcp, "cpu_s": cpu, "sys_s": sys_s, "minflt": flt,
               "fluctuation": flagged}  # the line holds these to 6 significant digits (time: to the µs)
        if med is not None:
            if med is not self._med_obj:  # the median changes every few steps: format it then
                self._med_obj, self._med_txt = med, ',"rolling_median_s":%.6g' % med
            line += self._med_txt
        sps = n / wall if n and wall > 0 else None
        if sps is not None:
            line += ',"samples_per_s":%.6g' % sps
        mfu = (self.flops_per_step / wall / self.peak_flops
               if self.flops_per_step and self.peak_flops and wall > 0 and observed else None)  # fmt: skip
        if mfu is not None:
            line += ',"mfu":%.6g' % mfu
        if self._fh is not None:
            self._fh.write((f"{line}{_fields(opt)}}}\n" if opt else line + "}\n").encode())
            if not self._bg_flush and now - self._flushed >= 1.0:
                self._fh.flush()
                self._flushed = now
        if self.triggers and observed:
            try:
                # the slow-rank board compares the CPU time of the step's own work: a loader
                # without workers burns its data wait in this process, counted once as data wait
                self._watch(i, wall, flagged, med, cpu - min(dwc or 0.0, cpu), dw, comm, sps, mfu)
            except Exception:  # the monitor never breaks the training: count it, go on
                self.trigger_errors += 1
        if capturing and cap.active[2] > 1:  # inside a capture: annotate the next step, nothing else
            self._captured_walls.append((i, wall))
            cap.advance(i)
        elif cap is not None and (capturing or cap.pending is not None):
            self._capture_boundary(i, wall, capturing)
        self.step_index = i + 1
        self._data_wait = 0.0
        self._data_wait_cpu = None
        if gcn:
            self._gc_count = 0
            self._gc_pause = 0.0
        if med is not None:
            rec["rolling_median_s"] = med
        if sps is not None:
            rec["samples_per_s"] = sps
        if mfu is not None:
            rec["mfu"] = mfu
        if opt:
            rec.update(opt)
        return rec

    def _capture_boundary(self, i: int, wall: float, capturing: bool) -> None:
        cap = self.capturer
        if capturing:
            self._captured_walls.append((i, wall))
        finished = cap.at_step_boundary(i)
        if cap.active is not None and not capturing:  # started at this boundary
            self._skip_until = max(self._skip_until, i + cap.active[2] + 1)
            self._captured_walls = []
            if self._ticker is not None:
                self._ticker.paused = True
        if finished is not None:
            if self._ticker is not None:
                self._ticker.paused = False
            self._skip_until = max(self._skip_until, i + 1)  # the next step pays for writing the trace
            self._write({"type": "capture", "rank": self.rank, "step": i, **finished})
            self._note_capture(finished)

    # -- automatic captures
    def _watch(self, i: int, wall: float, flagged: bool, med: float | None, cpu: float, dw: float,
               comm: float | None, sps: float | None, mfu: float | None) -> None:  # fmt: skip
        """The triggers, on an observed step (after warm-up for all but the warm-up detector)."""
        if not self.warmup.done:
            rec = self.warmup.update(i, wall)
            if rec is not None:
                self._note(rec)
                self.detector.reset(self.warmup.settled_values())
                self._start_flop_count(i)
            return
        self._pw.append(wall)
        self._pc.append(cpu)
        self._pd.append(dw)
        if comm is not None:
            self._pm.append(comm)
        self._last_step_seen = i
        if flagged:
            self._slow_step(i, wall, med, comm)
        self._watch_rest(i, wall, sps, mfu)

    def _slow_step(self, i: int, wall: float, med: float | None, comm: float | None) -> None:
        limit = self.detector.limit
        if comm and med is not None and comm >= 0.5 * (wall - med):
            # the excess is a wait for another rank: that rank's own monitor sees the slow step
            if self._may_note(("slow_step", "peer")):
                self._note({"type": "trigger", "kind": "slow_step", "step": i, "wall_s": wall, "median_s": med,
                            "limit_s": limit, "comm_s": comm, "reason": f"{self._why_slow(i, wall, med, limit)}, "
                            f"{comm * 1e3:,.2f} ms of it in collectives", "captured": False,
                            "why_not": "the step waited for another rank in collectives: that rank's monitor "
                            "captures its own slow steps"})  # fmt: skip
            return
        detail = {"step": i, "wall_s": wall, "median_s": med, "limit_s": limit}
        busy = self._why_no_capture("slow_step")
        if busy is not None:  # no capture possible now: remember the step for the next plans, and say so now and then
            self.slow.remember(i, wall)
            if self._may_note(("slow_step", busy[:24])):
                self._note({"type": "trigger", "kind": "slow_step", "reason": self._why_slow(i, wall, med, limit),
                            **detail, "captured": False, "why_not": busy})  # fmt: skip
            return
        marginal = med is not None and limit is not None and wall - med < 2.0 * (limit - med)
        plan = self.slow.plan(i, wall, marginal)
        if plan is None:
            why_not = self.slow.skipped or "fewer than 3 slow steps of this length yet: waiting to learn when they come back"
            if self._may_note(("slow_step", why_not[:24])):
                self._note({"type": "trigger", "kind": "slow_step", "reason": self._why_slow(i, wall, med, limit),
                            **detail, "captured": False, "why_not": why_not})  # fmt: skip
            return
        first, span, how = plan
        self._request("slow_step", f"{self._why_slow(i, wall, med, limit)}; {how}", i, first, span,
                      {**detail, "plan": how})

    def _why_no_capture(self, kind: str, now: float | None = None) -> str | None:
        """Why a trigger of ``kind`` cannot get a capture now, or None."""
        cap = self.capturer
        if cap is None:
            return "captures are off (Monitor(capture=False))"
        if not self.auto_capture:
            return "automatic captures are off (Monitor(auto_capture=False))"
        if cap.active is not None or cap.pending is not None:
            return "another capture is running or planned"
        if not cap.custom_factory and "torch" not in sys.modules:
            return "torch is not imported in this process: no profiler to capture with"
        return self.budget.why_not(kind, time.time() if now is None else now)

    @staticmethod
    def _why_slow(i: int, wall: float, med: float | None, limit: float | None) -> str:
        if med is None or limit is None:
            return f"slow step {i}"
        return (f"slow step {i}: {wall * 1e3:,.2f} ms against a rolling median of {med * 1e3:,.2f} ms (limit "
                f"{limit * 1e3:,.2f} ms)")  # fmt: skip

    def _may_note(self, key: tuple) -> bool:
        """Whether a trigger that got no capture may be written now: at most once every
        ``QUIET_S`` per kind and reason (the next note says how many were left out)."""
        t = time.monotonic()
        last, n = self._quiet.get(key, (float("-inf"), 0))
        if t - last < QUIET_S:
            self._quiet[key] = (last, n + 1)
            return False
        self._quiet[key] = (t, 0)
        self._left_out = n
        return True

    def _watch_rest(self, i: int, wall: float, sps: float | None, mfu: float | None) -> None:
        """The throughput-drop and slow-rank triggers."""
        rd = self.rate_drop
        if rd is not None:
            rate = mfu if mfu is not None else sps if sps is not None else 1.0 / wall if wall > 0 else 0.0
            buf = rd.buf
            if rate > 0.0:
                if not buf:
                    rd.first_step = i
                buf.append(rate)
            d = rd.block_end(i) if len(buf) >= rd.block else None
            if d is not None:
                what = "MFU" if mfu is not None else "throughput (samples/s)" if sps is not None else "step rate (steps/s)"
                ref, cur, a, b = d
                fmt = (lambda v: f"{v:.1%}") if what == "MFU" else (lambda v: f"{v:,.3g}")
                why = (f"sustained drop in {what}: {fmt(cur)} over steps {a}-{b} against {fmt(ref)} before "
                       f"(best median of {self.rate_drop.block} steps since warm-up): -{1 - cur / ref:.0%}")  # fmt: skip
                self._request("throughput_drop", why, i, i + 1, self.capture_steps,
                              {"measure": what, "reference": ref, "current": cur, "from_step": a, "to_step": b})
        b = self.board
        if b is not None and b.pending is not None:
            pend, b.pending = b.pending, None
            self._request("slow_rank", pend["reason"], i, i + 1, self.capture_steps,
                          {"domain": pend["domain"], "verdict": pend["verdict"]})

    def _request(self, kind: str, reason: str, step: int, first: int, span: int, detail: dict) -> None:
        """A trigger fired at ``step``: ask for a capture of steps first..first+span-1 if allowed;
        either way, write the trigger and its reason."""
        now = time.time()
        why_not = self._why_no_capture(kind, now)
        if why_not is not None and not self._may_note((kind, why_not[:24])):
            return
        note: dict[str, Any] = {"type": "trigger", "kind": kind, "step": step, "reason": reason, **detail}
        cap = self.capturer
        if why_not is None:
            self.budget.spend(kind, now)
            rid = f"auto-{kind.replace('_', '')}-{int(now * 1000)}"
            cap.pending = {"id": rid, "steps": span, "reason": reason, "time": now, "auto": True, "kind": kind,
                           "start_after": first - 1, "trigger": {"step": step, **{k: v for k, v in detail.items()
                                                                                  if k != "verdict"}}}  # fmt: skip
            note.update(captured=True, id=rid, first_step=first, steps=span)
        else:
            note.update(captured=False, why_not=why_not)
        self._note(note)

    def _note_capture(self, info: dict) -> None:
        """After a capture: which of its steps was slowest, and for a slow-step capture whether it
        held a slow step (the slowest step above the trigger's limit relative to the others, which
        the profiler slowed alike); a capture that missed gives back its kind's share of the budget."""
        walls = [(s, w) for s, w in self._captured_walls if info.get("first_step") is None or s >= info["first_step"]]
        self._captured_walls = []
        rec: dict[str, Any] = {"type": "captured", "id": info.get("id"), "kind": info.get("kind"),
                               "trace": info.get("trace"), "error": info.get("error")}  # fmt: skip
        if walls:
            s, w = max(walls, key=lambda x: x[1])
            others = [x for st, x in walls if st != s]
            ref = _median(others) if others else None
            rec.update(first_step=walls[0][0], last_step=walls[-1][0], slowest_step=s, slowest_s=w, others_median_s=ref)
            trig = info.get("trigger") or {}
            if info.get("kind") == "slow_step" and ref and trig.get("limit_s") and trig.get("median_s"):
                caught = w / ref >= trig["limit_s"] / trig["median_s"]
                rec["caught"] = caught
                if caught:  # its length as unprofiled, for the intervals of the next plans
                    self.slow.caught(s, w * trig["median_s"] / ref)
                else:
                    self.budget.refund_kind("slow_step")
        self._note({k: v for k, v in rec.items() if v is not None})

    def _capture_finished(self, prof: Any, info: dict) -> None:
        """The capturer's hook after the profiler stopped: FLOPs from the trace when not counted."""
        if self.flops_per_step or not hasattr(prof, "key_averages"):
            return
        from .flops import dominant, trace_flops

        total = trace_flops(prof)
        steps = int(info.get("steps") or 0)
        if total and steps > 0:
            self._set_flops(total / steps, {"fp32": total / steps}, f"torch.profiler FLOPs (with_flops) of capture "
                            f"{info.get('id')}, {steps} step(s)", dominant({}))  # fmt: skip

    # -- FLOPs and MFU
    def _start_flop_count(self, i: int) -> None:
        if self.flops_per_step or self._flops_mode is False:
            return
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "utils"):
            return
        cap = self.capturer
        if cap is not None and (cap.active is not None or (cap.pending is not None and
                                                           cap.pending.get("start_after", 10**18) <= i)):  # fmt: skip
            return
        from .flops import StepFlops

        counter = StepFlops(torch)
        why = counter.begin()
        if why is not None:
            self._note({"type": "mfu", "step": i + 1, "counted": False,
                        "reason": f"FLOPs not counted: {why}; the first capture's trace will give them"})  # fmt: skip
            return
        self._flop_counter, self._flop_step = counter, i + 1
        self._skip_until = max(self._skip_until, i + 1)

    def _flops_counted(self, i: int) -> None:
        counter, self._flop_counter, self._flop_step = self._flop_counter, None, None
        got = counter.end() if counter is not None else None
        if not got or got[0] <= 0:
            self._note({"type": "mfu", "step": i, "counted": False,
                        "reason": "FlopCounterMode saw no matmul or convolution in the step"})  # fmt: skip
            return
        from .flops import dominant

        total, by = got
        self._set_flops(total, by, f"torch.utils.flop_counter.FlopCounterMode over step {i}", dominant(by), i)

    def _set_flops(self, total: float, by: dict[str, float], how: str, dtype: str, counted_step: int | None = None) -> None:
        rec: dict[str, Any] = {"type": "mfu", "step": self.step_index, "counted": True, "flops_per_step": total,
                               "flops_by_dtype": by, "dtype": dtype, "source": how}  # fmt: skip
        if counted_step is not None:
            rec["counted_step"] = counted_step  # slowed by the counting: left out of the analysis
        if self.peak_flops:
            rec.update(peak_flops=self.peak_flops, peak_source="given (Monitor(peak_flops=...))")
        else:
            from .flops import device_peak

            peak, why = device_peak(sys.modules["torch"], dtype)
            rec["peak_source"] = why
            if peak:
                rec["peak_flops"] = peak
                self.peak_flops = peak
        self.flops_per_step = total
        self.flops_source = how
        self._note(rec)

    # -- the slow-rank board (background thread)
    def _peer_stats(self) -> dict | None:
        walls = list(self._pw)  # copies made holding the GIL: the training thread may append meanwhile
        if not self.warmup.done or len(walls) < 8:
            return None
        comm = list(self._pm)
        return {"step": self._last_step_seen, "warm": True, "n": len(walls), "wall_s": _median(walls),
                "comm_s": _median(comm) if len(comm) >= len(walls) // 2 else None, "cpu_s": _median(list(self._pc)),
                "data_wait_s": _median(list(self._pd))}  # fmt: skip

    def _board_domains(self) -> list[dict]:
        if self.found_domains:
            return [{"name": d["name"], "ranks": d["ranks"]} for d in self.found_domains]
        if self.domains:
            return [{"name": str(d), "ranks": None} for d in self.domains]
        return []

    def _scan_domains(self) -> None:
        """The process groups of torch.distributed (once initialised), and their collectives timed."""
        dist = torch_distributed()
        if dist is None:
            return
        found = discover(dist)
        sig = [(d["name"], d["ranks"], d["backend"]) for d in found]
        if sig == self._domain_sig:
            return
        self._domain_sig = sig
        self.found_domains = found
        if self._comm is not None:
            self._comm.attach(found, dist)
        self._note({"type": "domains", "step": self.step_index,
                    "domains": [{k: v for k, v in d.items() if not k.startswith("_")} for d in found],
                    "comm": list(self._comm.how) if self._comm is not None else []})  # fmt: skip

    def _resources(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self._maybe_device()
        self._hook_optimizers()  # torch imported after start()
        self._scan_domains()  # torch.distributed initialised after start()
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
        out.update(device_allocator(torch))
        try:
            out["affinity_count"] = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            pass
        return out

    def _write(self, rec: dict) -> None:
        if self._fh is not None:
            self._fh.write((_ENC(rec) + "\n").encode())
            now = time.perf_counter()
            if now - self._flushed >= 1.0 or rec.get("type") != "step":
                self._fh.flush()
                self._flushed = now

    def _flush(self) -> None:
        fh = self._fh
        if fh is not None:
            fh.flush()

    def _note(self, rec: dict) -> None:
        """A line of RUN_DIR/rank<R>.monitor.jsonl (rare: flushed at once)."""
        if rec.get("type") == "trigger" and rec.get("captured") is False and self._left_out:
            rec = {**rec, "left_out_before": self._left_out}
            self._left_out = 0
        if self._notes_fh is not None:
            try:
                self._notes_fh.write(json.dumps({**rec, "rank": self.rank, "time": time.time()}, default=str,
                                                separators=(",", ":")) + "\n")  # fmt: skip
                self._notes_fh.flush()
            except (OSError, ValueError):  # a full disk: the notes are lost, not the training
                pass
