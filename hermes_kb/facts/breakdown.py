"""The step breakdown: each analysed step of a rank split into the components that hold it, an
exclusive multi-component overlap (analyzers/timeline/breakdown.py; docs/analysis/breakdown.md). This is
the first level of the paper's hierarchy: which component decides the step, before any cause."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us

COMPONENTS = ("compute", "communication", "host_launch", "host_dispatch", "host_python", "data", "idle")
HOST_PARTS = ("host_launch", "host_dispatch", "host_python")  # the host's three parts, as one "host" component
# the five the step is judged by: the three host parts count as one
TOP_COMPONENTS = ("compute", "communication", "host", "data", "idle")
TopComponent = Literal["compute", "communication", "host", "data", "idle"]


class StepBreakdown(Fact):
    """One step (or, with step = null, all analysed steps: every ``_us`` field is then the mean
    per step, and the ratios are shares of the summed windows). The seven components add up to
    ``duration_us``."""

    kind: Literal["step_breakdown"] = "step_breakdown"
    device: Literal["gpu", "npu", "cpu"] = Field(description="what computes: a GPU, an NPU, or the CPU itself")
    duration_us: float = us("step window (mean per step for the aggregate)")
    compute_us: float = us("the device computes (kernels, copies); on a CPU-only rank, the CPU operators themselves")  # fmt: skip
    communication_us: float = us("collectives while the device computes nothing (exposed; incl. waiting for peers)")  # fmt: skip
    host_launch_us: float = us("device idle while a host thread is in a launch, another runtime call or a sync after its device work ended")
    host_dispatch_us: float = us("device idle while a host thread runs a CPU operator (framework dispatch)")
    host_python_us: float = us("device idle while the driving thread is between operators (Python, GC, I/O)")
    data_us: float = us("device idle while the DataLoader's next() runs (waiting for or preparing a batch)")
    idle_us: float = us("neither the device nor the host does anything traced")  # fmt: skip
    compute_ratio: float = ratio("compute_us / duration_us")
    communication_ratio: float = ratio("communication_us / duration_us")
    host_launch_ratio: float = ratio("host_launch_us / duration_us")
    host_dispatch_ratio: float = ratio("host_dispatch_us / duration_us")
    host_python_ratio: float = ratio("host_python_us / duration_us")
    data_ratio: float = ratio("data_us / duration_us")
    idle_ratio: float = ratio("idle_us / duration_us")
    host_ratio: float = ratio("(host_launch + host_dispatch + host_python) / duration: the host decides")
    gc_us: float | None = us("of host_python, Python garbage collection (when the trace records GC)", default=None)
    critical_component: TopComponent = Field(description="the component with the largest share (host = its three parts)")
    critical_ratio: float = ratio("its share of the step")
    steps_count: int = measure("count", "steps in the aggregate", default=1)
