"""The Monitor's FLOPs for MFU: counted over one step after warm-up (``flops.StepFlops``), or
taken from the first capture's trace (torch.profiler ``with_flops``); the device's peak from
hermes' tables (``flops.device_peak``) unless given. Every outcome is noted with how it was
obtained. The monitor never imports torch: this runs only when the job has."""

from __future__ import annotations

import sys
from typing import Any


class MfuCounting:
    """The FLOP counting of the Monitor (recorder.py). A mixin: the capturer, the notes
    (rank_log.py) and the steps left out of the triggers (auto_capture.py) are the Monitor's."""

    def _init_flops(self, flops: bool | str, flops_per_step: float | None) -> None:
        self._flops_mode = flops
        self._flop_counter: Any = None
        self._flop_step: int | None = None
        self.flops_source = "given" if flops_per_step else None

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
