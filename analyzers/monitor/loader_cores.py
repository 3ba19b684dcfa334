"""The CPU budget of a data-loading fix: a join of the trace's ``dataloader_wait`` with the
monitor's ``monitor_cpu`` of the same rank (only when a run directory holds both).

Moving batch preparation into worker processes, or adding workers, shortens the step only while
there are idle cores to run them on. The CPU work of a step (the training process and its
workers together, ``busy_cores`` x step) does not shrink when it is spread out, so the step
cannot get shorter than that work over the cores the job has, nor shorter than what it does
outside data loading:

    core_bound_us = T - max(T - D, T x min(1, busy_cores / job_cores))

with T the analysed step time and D the data time of the trace, and busy_cores the larger of
what the job used and what was busy on the machine. On a machine with idle cores the bound is D
(no effect); on one whose cores are already full it is near 0. Formulas and
doubts: docs/analysis/io.md.
"""

from __future__ import annotations

from hermes_kb.facts.base import Fact
from hermes_kb.facts.io import DataLoaderWait
from hermes_kb.facts.monitor import MonitorCpu


def job_cores(cpu: MonitorCpu) -> float | None:
    """CPUs per rank the job could spread loader work over. A mask narrower than the machine
    counts as the machine: removing that pinning is part of the loader advice (C-IO-003)."""
    cores = cpu.machine_cores if cpu.pinned else (cpu.host_usable_cores or cpu.usable_cores)
    if not cores:
        return None
    return cores / max(cpu.host_ranks_count, 1)


def busy_cores(cpu: MonitorCpu) -> float | None:
    """Cores per rank that more loader work could not use: what the training process and its
    workers used, or, when more is busy, the machine's busy cores per rank on the host. New
    workers only run on idle cores; cores that other processes keep busy are no budget either,
    and when the monitor's process scans missed the workers (children_cores unknown) the
    machine-wide share is the only measure of them."""
    own = None if cpu.process_cores is None else cpu.process_cores + (cpu.children_cores or 0.0)
    machine = None
    if cpu.system_busy_ratio is not None and cpu.machine_cores:
        machine = cpu.system_busy_ratio * cpu.machine_cores / max(cpu.host_ranks_count, 1)
    known = [x for x in (own, machine) if x is not None]
    return max(known) if known else None


def bounded(wait: DataLoaderWait, cpu: MonitorCpu) -> DataLoaderWait:
    budget = job_cores(cpu)
    if budget is None or cpu.process_cores is None:
        return wait
    busy = busy_cores(cpu)
    t, d = wait.step_us, wait.data_time_us
    floor = max(t - d, t * min(1.0, busy / budget))
    own = cpu.process_cores + (cpu.children_cores or 0.0)  # what the job itself used, apart from the others
    return wait.model_copy(update={"job_cores": budget, "busy_cores": busy, "own_cores": own,
                                   "core_bound_us": max(t - floor, 0.0)})  # fmt: skip


def with_core_bounds(facts: list[Fact]) -> list[Fact]:
    """The facts with each rank's dataloader_wait facts bounded by that rank's monitor_cpu."""
    cpus = {f.rank: f for f in facts if isinstance(f, MonitorCpu)}
    if not cpus:
        return facts
    return [bounded(f, cpus[f.rank]) if isinstance(f, DataLoaderWait) and f.rank in cpus else f for f in facts]


__all__ = ["bounded", "busy_cores", "job_cores", "with_core_bounds"]
