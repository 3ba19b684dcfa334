"""The analyzers hermes runs, in the order it runs them, and what each hands to those after it.

Every per-rank analyzer is ``per_rank(ctx: RankContext) -> list[Fact]`` in its module under
``hermes_kb/analyzers/``; a cross-rank one is ``cross_rank(digests: dict[int, RankDigest],
facts: list[Fact]) -> list[Fact]``, run once every rank is done, on each rank's digest
(analyzers/comm/digest.py: a few kilobytes of a rank) and the per-rank facts of the kinds in
``CROSS_RANK_READS``.

Analyzers pass derived data forward through ``ctx.shared``; each declares the keys it ``reads``
(given by an analyzer before it, or by the runner) and those it ``gives``. ``check()`` verifies
the declarations when the registry is first used, and the runner lets an analyzer touch only
the keys it declared (analyzers/context.py ``Shared``), so the order below is the one the data
needs, written down once (docs/architecture.md draws it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType

PACKAGE = "hermes_kb.analyzers"

# keys the runner itself puts into ctx.shared before the first analyzer
RUNNER_GIVES = frozenset({"whatif_defer", "job_alone"})


@dataclass(frozen=True)
class Analyzer:
    name: str  # as facts name it (``analyzer_error.analyzer``)
    module: str  # under hermes_kb.analyzers
    reads: frozenset[str] = frozenset()  # ctx.shared keys it needs from earlier analyzers
    gives: frozenset[str] = frozenset()  # keys it sets for later ones (or reuses itself)

    @property
    def touches(self) -> frozenset[str]:
        return self.reads | self.gives


def _a(name: str, module: str, reads: str = "", gives: str = "") -> Analyzer:
    return Analyzer(name, module, frozenset(reads.split()), frozenset(gives.split()))


PER_RANK: tuple[Analyzer, ...] = (
    # per step: device compute, communication and host busy sets, and the paper's components
    _a("overlap", "timeline.overlap", gives="device_compute device_comm host_busy device_busy overlap_components"),
    # the rank's dependency graph and each step's critical path through it
    _a("critical_path", "timeline.critical_path", gives="graph main_tid critical_path critical_segments"),
    # the analyzers below register the events their fix shortens as what-if sets (whatif_sets)
    _a("io", "io.io", reads="critical_path", gives="whatif_sets"),
    _a("cpu", "host.cpu", gives="whatif_sets"),
    _a("dispatch", "host.dispatch", gives="whatif_sets ops_in_optimizer dispatch_device_busy"),
    _a("pyframes", "host.pyframes", gives="whatif_sets"),
    # compute hands kernels its device activities, launching operators and their FLOPs
    _a("compute", "compute.compute", gives="whatif_sets compute compute_ops compute_kernels sdpa_math_ops "
                                           "cpu_op_groups ops_in_optimizer"),
    _a("kernels", "compute.kernels", reads="compute_ops compute_kernels sdpa_math_ops", gives="whatif_sets"),
    _a("cpu_batch", "host.cpu_batch", reads="cpu_op_groups", gives="ops_in_optimizer"),
    _a("comm", "comm.comm", gives="whatif_sets comm_collectives comm_compute_union"),
    _a("buckets", "comm.buckets", gives="buckets_top_ops"),
    _a("fluctuation", "timeline.fluctuation"),
    _a("npu", "npu.npu"),
    _a("breakdown", "timeline.breakdown", reads="graph main_tid"),
    # the step by program phase, and the user's functions outside the phases
    _a("program", "program.phases", gives="whatif_sets"),
    # replays the graph with each registered set shortened
    _a("whatif", "whatif.replay", reads="graph main_tid whatif_sets whatif_defer",
       gives="whatif_model whatif_host_scale whatif_chain whatif_amounts whatif_drops whatif_critical"),
    # the rank's part of the job graph: its replay with every collective's end left free
    _a("job_forms", "whatif.job_forms", reads="graph whatif_model comm_collectives job_alone", gives="job_anchors job_forms job_steps"),
)
CROSS_RANK: tuple[Analyzer, ...] = (
    _a("comm", "comm.comm"),
    _a("parallel", "comm.parallel"),
    _a("fluctuation", "timeline.fluctuation"),
    # the ranks joined at their collectives: the job's replay and its straggler counterfactuals
    _a("job", "whatif.job"),
)
# the kinds of per-rank facts the cross-rank analyzers read (besides the ranks' digests): a
# streamed job hands them only these (scale/stream.py gather)
CROSS_RANK_READS = frozenset({"pipeline_stage"})


class RegistryError(RuntimeError):
    """The registry's declarations do not fit together (a bug in hermes, found at start-up)."""


def check(per_rank: tuple[Analyzer, ...] = PER_RANK) -> None:
    """Every key an analyzer reads is given before it (by the runner or an earlier analyzer);
    names are unique."""
    given = set(RUNNER_GIVES)
    names = [a.name for a in per_rank]
    if len(set(names)) != len(names):
        raise RegistryError(f"analyzer names repeat: {names}")
    for a in per_rank:
        missing = a.reads - given
        if missing:
            raise RegistryError(f"analyzer {a.name} reads {sorted(missing)} that no analyzer before it gives")
        given |= a.gives


def module(a: Analyzer) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{a.module}")


@cache
def checked() -> bool:
    check()
    return True


def import_all() -> None:
    """Every analyzer module imported (before forking workers, so each has them)."""
    checked()
    for a in (*PER_RANK, *CROSS_RANK):
        module(a)


__all__ = ["CROSS_RANK", "CROSS_RANK_READS", "PER_RANK", "RUNNER_GIVES", "Analyzer", "RegistryError", "check",
           "checked", "import_all", "module"]  # fmt: skip
