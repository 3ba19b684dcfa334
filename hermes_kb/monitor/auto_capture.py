"""The Monitor's automatic captures (docs/monitor.md): after the warm-up it detects, a slow
step (recurring ones at their next occurrence), a sustained drop in throughput or MFU, and this
rank being the slowest of a communication domain (the slow-rank board, peers.py, fed by
``_peer_stats`` from the background thread) each ask for a capture of a few steps, within the
hourly budget; every trigger is noted with its reason, and each capture with the steps it held."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from .domains import CommTimer, discover, torch_distributed
from .peers import PeerBoard
from .triggers import Budget, RateDrop, SlowSteps, WarmupDetector

PEER_WINDOW = 32  # observed steps behind each rank's summary for the slow-rank verdicts
QUIET_S = 10.0  # least interval between two notes of the same refused trigger
KIND_WORDS = {"slow_step": "slow step", "slow_rank": "slow rank", "throughput_drop": "throughput drop"}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2.0


class AutoCaptures:
    """The triggers and the captures they ask for, the slow-rank board's statistics and the
    process groups found in torch.distributed. A mixin of the Monitor (recorder.py): the
    capturer, the detector, the ticker, the notes (rank_log.py) and the FLOP counting (mfu.py)
    are the Monitor's."""

    def _init_auto_capture(self, *, triggers: bool, capture_steps: int, warmup: int | str, max_warmup_steps: int,
                           drop: float | None, captures_per_hour: int, peers_every_s: float,
                           slow_rank_lag: float | None, comm: bool) -> None:  # fmt: skip
        """The triggers' state (``Monitor.__init__``'s arguments of the same names)."""
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
        self._captured_walls: list[tuple[int, float]] = []
        self._quiet: dict[tuple, tuple[float, int]] = {}  # refused triggers: (kind, reason) -> (last note, left out)
        self._left_out = 0
        self.trigger_errors = 0  # exceptions inside the triggers, caught (the monitor never raises into training)
        # communication domains and time
        self._comm = CommTimer() if comm else None
        self.found_domains: list[dict[str, Any]] = []
        self._domain_sig: list | None = None

    def _capture_boundary(self, i: int, wall: float, capturing: bool) -> None:
        cap = self.capturer
        if capturing:
            self._captured_walls.append((i, wall))
        try:
            finished = cap.at_step_boundary(i)
        except Exception as exc:  # the monitor never raises into training: the capture is dropped
            self.trigger_errors += 1
            cap.active, cap.pending = None, None
            self._note({"type": "capture_failed", "step": i, "reason": f"{type(exc).__name__}: {exc}"[:300]})
            return
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
