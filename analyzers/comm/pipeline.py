"""Pipeline stages of the rank's job: the rank's stage in the trace's pipeline process group
(fact ``pipeline_stage``, per rank), each rank's stage read back from those facts across ranks,
and whether a point-to-point collective joins two stages of one pipeline (its waits are then
the pipeline schedule's, not a straggler's)."""

from __future__ import annotations

import re

from hermes_kb.facts.base import Evidence

from ..context import RankContext
from .collectives import parse_ranks

PIPELINE_GROUP = re.compile(r"^(pp|pipe)$|pipeline", re.I)


def pipeline_stage(ctx: RankContext):
    """The rank's stage in the first recorded process group named like a pipeline group ('pp',
    'pipe', or containing 'pipeline': MindSpeed / Megatron names), from the trace's process-group
    table; None when there is none, it has one rank, or this rank is not in it."""
    from hermes_kb.facts.parallel import PipelineStage

    for pg in ctx.trace.meta.process_groups:
        desc, name = str(pg.get("pg_desc") or ""), str(pg.get("pg_name") or "")
        if not (PIPELINE_GROUP.search(desc) or PIPELINE_GROUP.search(name)):
            continue
        raw = pg.get("ranks") or []
        try:
            ranks = parse_ranks(raw) if isinstance(raw, str) else [int(r) for r in raw]
        except (TypeError, ValueError):
            continue  # a rank list that is not one: no stage
        if len(ranks) < 2 or len(set(ranks)) != len(ranks) or ctx.rank not in ranks:
            continue
        return PipelineStage(
            rank=ctx.rank, process_group=name, pg_desc=desc or None, pp_ranks=ranks,
            stage_index=ranks.index(ctx.rank), stages_count=len(ranks),
            evidence=Evidence(note="from the trace's process-group table (distributedInfo pg_config, or torch_npu "
                                   "metadata parallel_group_info); stage = position of the rank in the group's ranks"),
        )  # fmt: skip
    return None


P2P_KINDS = ("send_recv", "send", "recv")


def pipeline_stages(facts: list) -> dict[int, tuple[tuple, int]]:
    """Each rank's pipeline group (its ranks, in stage order) and stage, from pipeline_stage facts."""
    return {f.rank: (tuple(f.pp_ranks), f.stage_index) for f in facts
            if getattr(f, "kind", None) == "pipeline_stage" and f.rank is not None}  # fmt: skip


def pipeline_neighbours(ranks: list[int], stages: dict[int, tuple[tuple, int]]) -> bool:
    """Two ranks of one pipeline group at different stages: their point-to-point messages are
    the pipeline's activations and gradients, whose waits are the pipeline schedule's."""
    if len(ranks) != 2 or any(r not in stages for r in ranks):
        return False
    (pp_a, st_a), (pp_b, st_b) = stages[ranks[0]], stages[ranks[1]]
    return pp_a == pp_b and st_a != st_b


__all__ = ["P2P_KINDS", "PIPELINE_GROUP", "pipeline_neighbours", "pipeline_stage", "pipeline_stages"]
