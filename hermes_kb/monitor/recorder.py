"""The Monitor: one cheap record per training step, written as JSON lines.

Its parts, each a mixin of ``Monitor`` in a module of its own: the rank log and the notes
(``rank_log.py``), the resource sample and the optimizer hooks (``sampling.py``), the automatic
captures and their triggers (``auto_capture.py``), the FLOPs for MFU (``mfu.py``); the background
thread is ``ticker.py``'s. What runs on every step (``step()``) is here."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import resource

    _getrusage, _SELF = resource.getrusage, resource.RUSAGE_SELF
except ImportError:  # Windows
    pass

from .auto_capture import AutoCaptures
from .capture import Capturer
from .detect import RollingDetector
from .env import detect_rank, environment
from .mfu import MfuCounting
from .procs import main_thread_ns
from .rank_log import NOTES, STEP_LINE, RankLogWriter, optional_fields
from .sampling import ResourceSampling, process_usage, system_cpu_jiffies
from .ticker import Ticker

DETECTOR_REFRESH = 64  # steps between two recomputations of the rolling median and MAD (once the window is full)


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


class Monitor(AutoCaptures, MfuCounting, ResourceSampling, RankLogWriter):
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
        max_capture_steps: int | None = None,
    ):
        """``domains``: names of the communication domains (process groups) this rank synchronises
        in, e.g. ``["dp0", "tp3"]``; once torch.distributed is initialised its process groups are
        found by themselves. ``procs_every_s``: least interval between scans of the other
        processes (0 disables). ``device_events``: an event factory for device step times; None
        uses CUDA events once torch has initialised CUDA, False never. ``sample_every``: take the
        resource sample every N steps; by default (None) about every ``sample_s`` seconds.
        ``max_capture_steps``: the longest capture a request may ask for (default 100, or
        HERMES_MAX_CAPTURE_STEPS); longer, malformed or unreadable requests are refused with a
        note in ``rank<R>.monitor.jsonl`` and training goes on.

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
        self.domains = list(domains) if domains else None
        self.auto_capture = auto_capture
        self._events: dict[str, float] = {}
        self._gc_gen2 = 0
        self._usage_last = (0.0, 0.0, 0)
        self._sample_at = float("-inf")
        self._init_sampling(procs_every_s, device_events)
        self.capturer = (
            Capturer(self.run_dir, self.rank, poll_s=poll_s, budget_per_hour=captures_per_hour,
                     profiler_factory=profiler_factory, watch=False, on_finish=self._capture_finished,
                     on_refused=self._request_refused, max_steps=max_capture_steps)
            if capture else None
        )  # fmt: skip
        self.poll_s = poll_s
        self._init_auto_capture(triggers=triggers, capture_steps=capture_steps, warmup=warmup,
                                max_warmup_steps=max_warmup_steps, drop=drop, captures_per_hour=captures_per_hour,
                                peers_every_s=peers_every_s, slow_rank_lag=slow_rank_lag, comm=comm)  # fmt: skip
        self._ticker: Ticker | None = None
        self._med_obj: float | None = None
        self._med_txt = ""
        self._epoch = time.time() - time.perf_counter()
        self._bg_flush = False  # the background thread flushes the log
        self._init_flops(flops, flops_per_step)

    # -- lifecycle
    def _request_refused(self, why: str) -> None:
        """A capture request the monitor would not run (malformed, too long, not a regular file):
        a note in the rank's log, never an exception in the training loop."""
        self._note({"type": "request_refused", "reason": why})

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
            self._ticker = Ticker(tasks)
            self._ticker.start()
        self._maybe_device()
        self._scan_domains()
        if self._procs is not None:
            self._procs.sample()  # the baseline the first scan diffs against
            self._procs_at = time.perf_counter()
        rq = main_thread_ns()
        self._rq_last = (time.perf_counter(), *rq) if rq is not None else None
        self._t_last = time.perf_counter()
        self._usage_last = process_usage()
        self._hook_optimizers()
        self._cpu_last = (time.perf_counter(), self._usage_last[0], system_cpu_jiffies())

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
            u = process_usage()
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
        opt, comm = self._step_fields(i, dwc)
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
        line = STEP_LINE % (self.rank, i, wall_time, wall, dw, gcn, gcp, cpu, sys_s, flt, "true" if flagged else "false")
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
            self._fh.write((f"{line}{optional_fields(opt)}}}\n" if opt else line + "}\n").encode())
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

    def _step_fields(self, i: int, dwc: float | None) -> tuple[dict[str, Any], float | None]:
        """Step ``i``'s optional fields (the CPU time of its data wait, full collections, marked
        events, optimizer.step(), collectives, device times), their accumulators reset; and its
        time in collectives (None: not timed)."""
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
        return opt, comm
