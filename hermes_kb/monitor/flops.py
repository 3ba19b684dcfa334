"""MFU without hand-written FLOPs: the model's FLOPs per step counted once, and the device's peak
from hermes' tables. The monitor never imports torch: this runs only when the job has.

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` is entered at one step boundary and left
  at the next, so it counts what one whole training step dispatches (forward, backward, optimizer)
  with PyTorch's own formulas (matmuls, convolutions, attention), per output dtype. That step runs
  slower (every operator goes through the Python dispatch mode) and is left out of the triggers.
  Not counted when the step cannot be seen operator by operator (a ``torch.compile`` graph, a
  CUDA graph replay, another dispatch mode active at the boundary): then the first capture's
  trace gives them (torch.profiler ``with_flops``: the same formulas over the captured steps).
- Peak: a GPU by its name in ``hermes_kb.core.devices`` (the dense matmul peak of the dtype that did
  most FLOPs; FP32 counts against TF32 when torch allows TF32 matmuls); a CPU from
  ``hermes_kb.core.cpus`` (FP32 FMA peak of one core at the recorded clock, two FMA units, times the
  cores the job computes on: min(torch threads, usable CPUs)).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from ..core.dtypes import FLOAT_RANK, short_name


def peak_key(dtype: str) -> str:
    """The device peak table's key for a torch dtype name (hermes_kb/core/dtypes.py): a
    floating-point type's short name, or int8; any other type counts as fp32."""
    short = short_name(dtype)
    return short if short is not None and (short in FLOAT_RANK or short == "int8") else "fp32"


def _dtype_of(out: Any) -> str:
    t = out
    while isinstance(t, (list, tuple)) and t:
        t = t[0]
    name = str(getattr(t, "dtype", "float32")).replace("torch.", "")
    return peak_key(name)


def counter_class(torch: Any) -> Any:
    from torch.utils.flop_counter import FlopCounterMode

    class _Counter(FlopCounterMode):
        """FlopCounterMode that also adds the FLOPs up by output dtype."""

        def __init__(self) -> None:
            super().__init__(display=False)
            self.by_dtype: dict[str, int] = defaultdict(int)

        def _count_flops(self, func_packet, out, args, kwargs):  # torch >= 2.4
            reg = getattr(self, "flop_registry", {})
            if func_packet in reg:
                n = reg[func_packet](*args, **kwargs, out_val=out)
                self.by_dtype[_dtype_of(out)] += int(n)
            return super()._count_flops(func_packet, out, args, kwargs)

    return _Counter


def why_not_countable(torch: Any) -> str | None:
    """Why a step cannot be counted operator by operator now, or None."""
    dyn = sys.modules.get("torch._dynamo")
    try:
        if dyn is not None and int(dyn.utils.counters["stats"]["unique_graphs"]) > 0:
            return "the job runs torch.compile graphs (their operators are not dispatched one by one)"
    except Exception:
        pass
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is not None:
            return "another dispatch mode is active at the step boundary"
    except Exception:
        pass
    try:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "a CUDA graph is being captured"
    except Exception:
        pass
    return None


class StepFlops:
    """Counts one step: ``begin()`` at a boundary, ``end()`` at the next."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.mode: Any = None

    def begin(self) -> str | None:
        """Enter the counter; returns why not, or None."""
        why = why_not_countable(self.torch)
        if why is not None:
            return why
        try:
            self.mode = counter_class(self.torch)()
            self.mode.__enter__()
        except Exception as exc:  # an old torch without FlopCounterMode, or a mode stack we cannot join
            self.mode = None
            return f"FlopCounterMode unavailable ({type(exc).__name__}: {exc})"
        return None

    def end(self) -> tuple[float, dict[str, float]] | None:
        """Leave the counter: (FLOPs of the step, FLOPs per dtype)."""
        mode, self.mode = self.mode, None
        if mode is None:
            return None
        try:
            mode.__exit__(None, None, None)
        except Exception:
            return None
        total = float(mode.get_total_flops())
        by = {k: float(v) for k, v in mode.by_dtype.items() if v > 0}
        if not by and total > 0:
            by = {"fp32": total}
        return total, by


def dominant(by_dtype: dict[str, float]) -> str:
    return max(by_dtype, key=by_dtype.get) if by_dtype else "fp32"


def device_peak(torch: Any, dtype: str) -> tuple[float, str] | tuple[None, str]:
    """(peak FLOP/s, how it was obtained) of the device this rank computes on."""
    from ..core.cpus import fp32_fma_peak_per_core, host_cpu, usable_cpus
    from ..core.devices import lookup

    try:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:
        cuda = False
    if cuda:
        try:
            i = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(i)
            name = str(props.name)
            spec = lookup({"name": name, "totalGlobalMem": getattr(props, "total_memory", None)})
        except Exception as exc:
            return None, f"device not read ({type(exc).__name__})"
        if spec is None:
            return None, f"{name} is not in hermes' device table (hermes_kb/core/devices.py)"
        tf32 = False
        try:
            tf32 = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
        except Exception:
            pass
        got = spec.matmul_peak(dtype, fp32_uses_tf32=tf32)
        if got is None:
            return None, f"no {dtype} peak for {spec.name} in hermes' device table"
        key, peak = got
        return peak, f"{spec.name} dense {key} peak {peak / 1e12:,.1f} TFLOP/s (hermes device table, matched by {name!r})"
    if "torch_npu" in sys.modules:
        return None, "NPU peaks are not read by the monitor"
    cpu = host_cpu()
    per_core = fp32_fma_peak_per_core(cpu)
    if per_core is None:
        return None, "CPU clock or vector width unknown (/proc/cpuinfo)"
    try:
        threads = int(torch.get_num_threads())
    except Exception:
        threads = 1
    cores = max(1, min(threads, usable_cpus()))
    peak = per_core[1] * cores
    return peak, (f"CPU {cpu.get('model') or '?'}: FP32 FMA peak {per_core[1] / 1e9:,.1f} GFLOP/s per core "
                  f"(two FMA units at {cpu.get('mhz')} MHz) x {cores} core(s) (min of torch threads and usable "
                  f"CPUs; hermes_kb/core/cpus.py)")  # fmt: skip


def trace_flops(prof: Any) -> float | None:
    """FLOPs a finished torch.profiler capture recorded (``with_flops=True``), all steps together."""
    try:
        total = sum(float(getattr(e, "flops", 0) or 0) for e in prof.key_averages())
    except Exception:
        return None
    return total if total > 0 else None


__all__ = ["StepFlops", "device_peak", "dominant", "trace_flops"]
