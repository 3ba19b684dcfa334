"""Facts of work that fusion removes: repeated sequences of element-wise kernels, normalisations
written out as separate kernels and element-wise epilogues after GEMMs
(analyzers/compute/fusion.py; formulas in docs/analysis/compute.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..base import Fact, measure, ratio, us


class FusionSequence(BaseModel):
    """One repeated run of consecutive element-wise/reduction/normalisation kernels on a stream."""

    model_config = ConfigDict(extra="forbid")

    kernels: list[str] = Field(description="class:short name of each kernel, in launch order")
    length_count: int = measure("count", "kernels in the sequence")
    occurrences_count: int = measure("count", "times the sequence occurs")
    total_time_us: float = us("summed duration of all occurrences")
    mean_time_us: float = us("per occurrence")
    share_of_kernel_time_ratio: float = ratio("total_time_us / total kernel time")
    gap_us: float = us("idle device time between consecutive kernels inside the occurrences (each gap once)",
                       default=0.0)
    exec_ratio: float = ratio("total_time_us / (total_time_us + gap_us): share of the occurrences' span the "
                              "device computes", default=1.0)  # fmt: skip
    host_bound: bool = Field(default=False, description="exec_ratio below the host-bound threshold: the device "
                             "waits between these kernels longer than it runs them (dispatch-bound)")  # fmt: skip
    mte_us: float | None = us("Ascend: Σ over the kernels of max(aic_mte2, aiv_mte2) + max(aic_fixpipe, aiv_mte3) "
                              "pipe time; null without pipe metrics", default=None)  # fmt: skip
    mte_ratio: float | None = measure("ratio", "Ascend: mte_us / Σ (aicore_time + aiv_time); can exceed 1 (two "
                                      "transfer pipes run at once); null without pipe metrics", default=None, le=None)  # fmt: skip
    mte_bound: bool | None = Field(default=None, description="Ascend: mte_ratio above the MTE-bound threshold: "
                                   "memory transfers dominate, so fusing saves the intermediate round trips")  # fmt: skip


class FusionCandidates(Fact):
    """The most time-consuming repeated sequences of fusable kernels (top 5), and how many such
    sequences there are in all."""

    kind: Literal["fusion_candidates"] = "fusion_candidates"
    sequences: list[FusionSequence] = Field(description="at most 5, by total time")
    candidate_kernels_count: int = measure("count", "element-wise, reduction and normalisation kernels")
    candidate_time_us: float = us("their total duration")
    candidate_time_ratio: float = ratio("candidate_time_us / total kernel time")
    min_occurrences_count: int = measure("count", "a sequence must occur at least this often")
    sequences_count: int = measure("count", "distinct repeated sequences found (same runs counted once; at most "
                                   "100 counted)", default=0)  # fmt: skip
    sequences_time_us: float = us("kernel time covered by all of them, each kernel once", default=0.0)
    sequences_gap_us: float = us("idle device time between their consecutive kernels, each gap once", default=0.0)
    host_bound_count: int = measure("count", "of the sequences, those that are host bound", default=0)
    mte_bound_count: int = measure("count", "of the sequences, those that are MTE bound (Ascend pipe metrics)",
                                   default=0)  # fmt: skip
    host_bound_threshold_ratio: float = ratio("a sequence is host bound when exec_ratio is below this", default=0.4)
    mte_bound_threshold_ratio: float = ratio("a sequence is MTE bound when mte_ratio is above this", default=0.8)


class DecomposedNorm(Fact):
    """Normalisations written out as separate kernels (a hand-written RMSNorm/LayerNorm: cast, pow,
    mean, add, rsqrt, mul, cast, mul) instead of one fused normalisation kernel."""

    kind: Literal["decomposed_norm"] = "decomposed_norm"
    occurrences_count: int = measure("count", "normalisations found (a mean/variance reduction followed by a "
                                     "[r]sqrt within two kernels)")  # fmt: skip
    kernels_count: int = measure("count", "kernels in them (each counted once)")
    kernels_per_occurrence: float = measure("count", "kernels_count / occurrences_count")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    fused_norm_time_us: float = us("time of fused normalisation kernels on the rank (class norm)")
    example: list[str] = Field(description="kernels of one occurrence, in order (short names)")


class GemmEpilogue(Fact):
    """Element-wise kernels (a bias or residual add, an activation) that run right after a GEMM on the
    same stream: work a GEMM epilogue applies to each output tile before it is stored, done instead
    as a separate pass that reads and writes the whole output again."""

    kind: Literal["gemm_epilogue"] = "gemm_epilogue"
    gemm_count: int = measure("count", "GEMM kernels (helpers such as split-K reductions excluded)")
    gemm_time_us: float = us("their summed duration")
    epilogue_count: int = measure("count", "element-wise kernels directly after a GEMM on the same stream that add, "
                                  "or apply an activation (gelu, relu, silu, tanh, sigmoid)")  # fmt: skip
    epilogue_time_us: float = us("their summed duration")
    add_time_us: float = us("the part in adds (bias, residual)")
    activation_time_us: float = us("the part in activations")
    share_of_device_time_ratio: float = ratio("epilogue_time_us / non-communication device time")
    epilogue_to_gemm_ratio: float = measure("ratio", "epilogue_time_us / gemm_time_us", le=None)
    top_kernel: str = Field(default="", description="the epilogue kernel (short name) with the most time")
