"""Where the user's program spends each step: the phases of a training step (waiting for data,
forward, backward, the optimizer, collectives the program issues, the user's own code outside
those, and what nothing traced covers) and the user's functions that hold the time outside the
phases (analyzers/program/; docs/analysis/program.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us

PHASES = ("data", "forward", "backward", "optimizer", "communication", "user_code", "other")


class ProgramPhases(Fact):
    """A step (or, step = null, all analysed steps) of the training thread split into program
    phases; the phases are exclusive and add up to the window."""

    kind: Literal["program_phases"] = "program_phases"
    window_us: float = us("the analysed window on the training thread (the step windows)")
    steps_count: int = measure("count", "step windows it covers (1 for a step's fact)")
    data_us: float = us("waiting for the next batch (DataLoader __next__ annotations)")
    forward_us: float = us("forward: nn.Module calls (Python stacks or module annotations), else autograd-recorded operators")
    backward_us: float = us("backward: the autograd engine's work, or the training thread waiting for it")
    optimizer_us: float = us("Optimizer.step / zero_grad annotations")
    communication_us: float = us("collectives the training thread issues outside backward (e.g. a metric all-reduce)")
    user_code_us: float = us("the user's own code outside the phases above: user functions (with stacks) or operators outside any module")
    other_us: float = us("nothing traced on the training thread (the loop's own Python between calls, waits)")
    data_ratio: float = ratio("data_us / window_us")
    forward_ratio: float = ratio("forward_us / window_us")
    backward_ratio: float = ratio("backward_us / window_us")
    optimizer_ratio: float = ratio("optimizer_us / window_us")
    communication_ratio: float = ratio("communication_us / window_us")
    user_code_ratio: float = ratio("user_code_us / window_us")
    other_ratio: float = ratio("other_us / window_us")
    largest_phase: str = Field(description="the phase holding the most time")
    largest_phase_ratio: float = ratio("its share of the window")
    sources: list[str] = Field(default_factory=list, description="the evidence the split rests on (python_stacks, "
                               "module_annotations, sequence_numbers, optimizer_annotations, dataloader_annotations, "
                               "dataloader_frames, gloo_spans, step_annotations)")  # fmt: skip
    has_stacks: bool = Field(description="the capture has Python stacks (with_stack), so user functions are named")
    top_function: str | None = Field(default=None, description="the user function holding the most time outside the phases")
    top_function_ratio: float = ratio("its share of the window", default=0.0)


class UserFunction(Fact):
    """One function of the user's code (a Python frame outside torch, the standard library and
    installed packages) on the training thread, over all analysed steps."""

    kind: Literal["user_function"] = "user_function"
    function: str = Field(description="as the profiler names the frame: file(line): name")
    file: str = Field(description="its file")
    line: int = measure("count", "its line")
    window_us: float = us("the analysed window (sum of the step windows)")
    time_us: float = us("time inside the function in the analysed steps")
    outside_us: float = us("of it, time outside forward, backward, the optimizer, data and collectives")
    training_us: float = us("of it, time in backward, the optimizer and data: the training step itself (in forward "
                            "and data on a rank that never runs backward or an optimizer: inference)")
    driver: bool = Field(description="the function runs the training step (backward, the optimizer or data inside it: the "
                         "loop or the step function), so only its time outside the phases is extra work")
    extra_us: float = us("what the step spends in it besides training: all of time_us for a function that runs no "
                         "training (an evaluation, a metric, a log line), outside_us for a driver")
    share_ratio: float = ratio("extra_us / window_us")
    per_step_us: float = us("extra_us per analysed step")
    work_us: float = us("of extra_us, time in what it calls (operators, other Python functions); the rest is its "
                        "own Python between them (a loop's glue)", default=0.0)
    site: bool = Field(default=False, description="the function the report names: the largest share among the functions "
                       "that run no training, else the innermost driver holding most of the extra time")
    calls_count: int = measure("count", "calls in the analysed steps")
    steps_count: int = measure("count", "analysed steps it ran in")
    steps_ratio: float = ratio("steps_count / analysed steps: 1 for a function of every step, less for periodic work")
    ops_count: int = measure("count", "top-level operators it calls in extra_us")
    ops_us: float = us("their time")
    top_ops: list[str] = Field(default_factory=list, description="its operators by time, at most 5")
    syncs_count: int = measure("count", "device synchronisations it makes (aten::item, .cpu(), stream syncs)")
    syncs_us: float = us("time inside them: on a device, mostly waiting for work queued before (that time is the "
                         "device's, and goes with the work, not with the read-back)", default=0.0)
    io_calls_count: int = measure("count", "file and socket calls (open, read, write, flush, ...)")
    prints_count: int = measure("count", "print calls")
    loop_op: str | None = Field(default=None, description="an operator it calls many times a step on many shapes: a Python loop over tensors")
    loop_calls_per_step: float = measure("count", "calls of loop_op a step", default=0.0)
    loop_shapes_count: int = measure("count", "distinct input shapes of those calls", default=0)
    loop_us: float = us("time of the looped operators (each called LOOP_CALLS times a step on several shapes) over the "
                        "analysed steps", default=0.0)
    loop_share_ratio: float = ratio("loop_us / window_us", default=0.0)


__all__ = ["PHASES", "ProgramPhases", "UserFunction"]
