"""Facts of the training step's phases around the model's layers: the optimizer's device work,
forward layers recomputed in backward, and training-mode layers in a forward-only run
(analyzers/compute/training_step.py; docs/analysis/compute.md "Per kernel")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us


class OptimizerDevice(Fact):
    """The device work launched inside optimizer.step() calls, and how the update is implemented there."""

    kind: Literal["optimizer_device"] = "optimizer_device"
    optimizer: str = Field(description="class from the Optimizer.step#<Class>.step annotation")
    implementation: Literal["fused", "foreach", "per_tensor"] = Field(
        description="fused: one fused kernel per tensor group (fused=True, apex FusedAdam); foreach: several "
        "multi-tensor kernels, one per arithmetic step; per_tensor: element-wise kernels parameter by parameter"
    )
    calls_count: int = measure("count", "optimizer.step() calls in the analysed steps")
    kernels_count: int = measure("count", "kernels and copies they launched")
    kernels_per_call: float = measure("count", "kernels_count / calls_count")
    device_us: float = us("summed duration of that device work")
    share_of_device_time_ratio: float = ratio("device_us / non-communication device time")
    mean_kernel_us: float = us("device_us / kernels_count")


class ActivationRecompute(Fact):
    """Forward layers computed again during the backward pass (activation checkpointing): module-level
    forward operators (conv, linear, norms, attention, ...) run under an autograd backward node."""

    kind: Literal["activation_recompute"] = "activation_recompute"
    recompute_calls_count: int = measure("count", "forward operator calls inside backward nodes")
    recompute_device_us: float = us("device time of the kernels they launched")
    forward_device_us: float = us("device time of the same operators' kernels outside the backward pass")
    recompute_to_forward_ratio: float = measure("ratio", "recompute_device_us / forward_device_us (1: every layer "
                                                "recomputed once)", le=None)  # fmt: skip
    device_compute_us: float = us("non-communication device time")
    share_of_device_time_ratio: float = ratio("recompute_device_us / device_compute_us")
    checkpoint_frames_count: int = measure("count", "Python frames in torch/utils/checkpoint.py (0 without with_stack)")
    peak_allocated_ratio: float | None = ratio("peak allocated device memory / device memory (null: profile_memory "
                                               "off or device memory unknown)", default=None)  # fmt: skip


class TrainModeInference(Fact):
    """A forward-only trace (no autograd backward node runs) whose forward still computes the
    training behaviour of its layers: dropout masks and batch-norm batch statistics, i.e. the model
    was not put in eval() mode for inference."""

    kind: Literal["train_mode_inference"] = "train_mode_inference"
    backward_nodes_count: int = measure("count", "backward operators in the analysed windows: autograd engine and "
                                        "function nodes (...Backward), ATen *_backward ops (0: forward-only)")
    dropout_calls_count: int = measure("count", "aten::native_dropout / aten::bernoulli_ calls that launched kernels")
    batchnorm_train_calls_count: int = measure("count", "batch-norm calls that launched batch-statistics kernels")
    train_mode_kernels_count: int = measure("count", "kernels of dropout masks and batch statistics")
    train_mode_time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("train_mode_time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the train-mode kernel (short name) with the most time")
    measured_on: Literal["kernels", "operators"] = Field(
        default="kernels", description="kernels: a device trace; operators: a CPU-only trace, where the operators "
        "stand for kernels (the counts and times are of the outermost dropout / batch-norm operators, the share "
        "is of the operators' self time)")
