"""Parallelism across ranks: imbalance of step time, compute and communication between ranks,
and the pipeline bubble of ranks that exchange point-to-point messages.

Per rank and step (``rank_components``): duration, compute = |union of non-communication
kernels ∩ step|, communication = |union of collectives ∩ step| (device kernels, or the CPU ops
on ranks without any), busy = |union of kernels and memcpy/memset ∩ step|.

``cross_rank``:
- ``rank_imbalance`` per component (step time, compute, communication, non-communication =
  step time - communication) over the job's ranks, and for compute and non-communication over
  each process group whose members are a proper subset of the ranks present: per-rank per-step
  means over the steps all compared ranks analysed, imbalance = 1 - mean/max, the rank with
  the largest value and its excess over the mean;
- ``pipeline_bubble`` on every rank that runs point-to-point collectives (send/recv, or
  send_recv in a 2-rank group): bubble = 1 - compute / step time. Ranks without them get no
  fact ('no pipeline parallelism seen').

Formulas and choices: docs/analysis/parallel.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.parallel import PipelineBubble, PipelineStageBalance, RankImbalance

from .. import intervals as iv
from .collectives import compute_union, parse_ranks
from .pipeline import pipeline_stages
from ..context import RankContext

MAX_GROUPS = 10
P2P_KINDS = ("send", "recv")
COMPONENTS = [
    ("step_time", "duration"),
    ("compute", "compute"),
    ("communication", "comm"),
    ("non_communication", "own"),
]


def _comm_union(ctx: RankContext) -> iv.Intervals:
    c = ctx.trace.collectives
    if not len(c):
        return iv.EMPTY
    c = c[c["collective"].astype(str).to_numpy() != "wait"]
    kern = c[c["source"].astype(str).to_numpy() == "kernel"]
    use = kern if len(kern) else c
    return iv.union(use["ts"].to_numpy(float), use["end"].to_numpy(float))


def rank_components(ctx: RankContext) -> pd.DataFrame:
    """Per analysed step of the rank: duration, compute, comm and busy µs (cached in
    ``ctx.shared['parallel_components']``)."""
    cached = ctx.shared.get("parallel_components")
    if cached is not None:
        return cached
    w = ctx.windows
    s = np.array([x.start_us for x in w], dtype=float)
    e = np.array([x.end_us for x in w], dtype=float)
    t = ctx.trace
    busy = iv.union(
        np.concatenate([t.kernels["ts"].to_numpy(float), t.memcpy["ts"].to_numpy(float)]),
        np.concatenate([t.kernels["end"].to_numpy(float), t.memcpy["end"].to_numpy(float)]),
    )
    out = pd.DataFrame(
        {
            "step": np.array([x.step for x in w], dtype=np.int64),
            "duration": e - s,
            "compute": iv.overlap_length(s, e, compute_union(ctx)),
            "comm": iv.overlap_length(s, e, _comm_union(ctx)),
            "busy": iv.overlap_length(s, e, busy),
        }
    )
    out["own"] = (out["duration"] - out["comm"]).clip(lower=0.0)
    ctx.shared["parallel_components"] = out
    return out


def has_device_compute(ctx: RankContext) -> bool:
    """Whether the rank's trace holds any device compute activity at all (a non-communication
    kernel anywhere in it). A rank without is one whose device data was not recorded or not
    kept (e.g. an Ascend export trimmed to its communication files): its compute is unknown,
    not zero."""
    return len(compute_union(ctx)[0]) > 0


def cross_rank(digests: dict, facts: list) -> list:
    """From the ranks' digests (digest.py: what this reads of a rank)."""
    comps = {r: d.components for r, d in digests.items() if d.windows and d.components is not None}
    with_compute = {r for r in comps if digests[r].device_compute}
    out: list = []
    stage_of = _stage_of(facts)
    if len(comps) >= 2:
        ranks = sorted(comps)
        stages = _stage_groups(ranks, stage_of)
        for comp, col in COMPONENTS:
            # compute is compared only between ranks that recorded device compute
            use = [r for r in ranks if r in with_compute] if comp == "compute" else ranks
            if stages and comp != "step_time":
                # pipeline stages do different work by design: who the others wait for is
                # found among the ranks of one stage (stage against stage: pipeline_stage_balance)
                for name, members in stages:
                    sub = [r for r in members if r in use]
                    f = _imbalance(comps, sub, comp, col, name) if len(sub) >= 2 else None
                    if f is not None:
                        out.append(f)
                continue
            f = _imbalance(comps, use, comp, col, None) if len(use) >= 2 else None
            if f is not None:
                out.append(f)
        for name, members in _subgroups(digests, set(ranks)):
            if len({stage_of.get(r) for r in members}) > 1:
                continue  # a group spanning pipeline stages (the pipeline group itself)
            for comp, col in COMPONENTS[1::2]:  # compute and non_communication: who the group waits for
                use = [r for r in members if r in with_compute] if comp == "compute" else members
                f = _imbalance(comps, use, comp, col, name) if len(use) >= 2 else None
                if f is not None:
                    out.append(f)
    for r, d in digests.items():
        f = _bubble(d, comps.get(r))
        if f is not None:
            out.append(f)
    out.extend(_stage_balance(facts, comps, with_compute))
    return out


def _stage_of(facts: list) -> dict[int, int]:
    """Each rank's pipeline stage (position in its pipeline group)."""
    return {r: stage for r, (_, stage) in pipeline_stages(facts).items()}


def _stage_groups(ranks: list[int], stage_of: dict[int, int]) -> list[tuple[str, list[int]]]:
    """The ranks of each pipeline stage, when every compared rank has a known stage and they
    span at least two stages; otherwise none (the ranks are compared all together)."""
    if not ranks or any(r not in stage_of for r in ranks) or len({stage_of[r] for r in ranks}) < 2:
        return []
    by: dict[int, list[int]] = {}
    for r in ranks:
        by.setdefault(stage_of[r], []).append(r)
    return [(f"pipeline stage {k}", members) for k, members in sorted(by.items())]


def _stage_balance(facts: list, comps: dict, with_compute: set[int]) -> list:
    """Per pipeline group (from the ranks' pipeline_stage facts): mean device compute per step of
    each stage present with device compute; imbalance = 1 - mean/max over the stages compared."""
    groups: dict[tuple, list] = {}
    for f in facts:
        if getattr(f, "kind", None) == "pipeline_stage" and f.rank in with_compute and f.rank in comps:
            groups.setdefault((f.process_group, tuple(f.pp_ranks)), []).append(f)
    out = []
    for (name, pp), stages in list(groups.items())[:MAX_GROUPS]:
        by_stage = {}
        for f in sorted(stages, key=lambda x: x.stage_index):
            c = comps[f.rank]
            if len(c):
                by_stage[f.stage_index] = (f.rank, float(c["compute"].mean()), float(c["duration"].mean()), len(c))
        if len(by_stage) < 2:
            continue
        vals = {k: v[1] for k, v in by_stage.items()}
        hi = max(vals, key=lambda k: (vals[k], -k))
        lo = min(vals, key=lambda k: (vals[k], k))
        mx, mean = vals[hi], float(np.mean(list(vals.values())))
        if not mx > 0:
            continue
        step = by_stage[hi][2]
        out.append(PipelineStageBalance(
            rank=None, process_group=name, pp_ranks=list(pp), stages_count=len(pp), compared_count=len(by_stage),
            steps_count=min(v[3] for v in by_stage.values()), per_stage_compute_us=vals, max_us=mx, mean_us=mean,
            min_us=vals[lo], imbalance_ratio=float(np.clip(1.0 - mean / mx, 0.0, 1.0)), heaviest_stage=hi,
            heaviest_rank=by_stage[hi][0], lightest_stage=lo, last_stage_heaviest=hi == len(pp) - 1,
            excess_us=mx - mean, step_us=step, excess_share_ratio=float(np.clip((mx - mean) / step, 0.0, 1.0)) if step > 0 else 0.0,
            evidence=Evidence(counts={"stages": len(by_stage)},
                              note="compute = union of non-communication kernels per step (rank_components), mean over "
                                   "the rank's analysed steps; stages = positions in the pipeline group's rank list"),
        ))  # fmt: skip
    return out


def _subgroups(digests: dict, present: set[int]) -> list[tuple[str, list[int]]]:
    """Process groups used by collectives whose present members are >= 2 ranks and fewer than all."""
    seen: dict[tuple[int, ...], str] = {}
    for dg in digests.values():
        df = dg.collectives
        if not len(df):
            continue
        for pg, text in df[["pg", "pg_ranks"]].drop_duplicates().itertuples(index=False):
            members = tuple(sorted(set(parse_ranks(text)) & present))
            if 2 <= len(members) < len(present):
                seen.setdefault(members, pg)
    return [(pg, list(m)) for m, pg in list(seen.items())[:MAX_GROUPS]]


def _imbalance(
    comps: dict[int, pd.DataFrame], ranks: list[int], component: str, col: str, pg: str | None
) -> RankImbalance | None:
    common = set.intersection(*(set(comps[r]["step"].tolist()) for r in ranks))
    if common:
        steps = sorted(common)
        table = pd.DataFrame(
            {r: comps[r].drop_duplicates("step").set_index("step").loc[steps, col] for r in ranks}
        )
    else:  # ranks analysed different step numbers: compare each rank's own mean
        steps = []
        table = None
    means = (
        table.mean(axis=0)
        if table is not None
        else pd.Series({r: float(comps[r][col].mean()) for r in ranks})
    )
    mx = float(means.max())
    if not mx > 0:
        return None
    mean = float(means.mean())
    worst = spread = None
    if table is not None and len(steps):
        sp = table.max(axis=1) - table.min(axis=1)
        worst, spread = int(sp.idxmax()), float(sp.max())
    top = means.sort_values(ascending=False).head(10)
    hi, lo = int(means.idxmax()), int(means.idxmin())
    n_steps = len(steps) if steps else int(min(len(comps[r]) for r in ranks))
    return RankImbalance(
        rank=None,
        component=component,
        process_group=pg,
        ranks_count=len(ranks),
        steps_count=n_steps,
        per_rank_us={int(k): float(v) for k, v in top.items()},
        max_us=mx,
        mean_us=mean,
        min_us=float(means.min()),
        imbalance_ratio=float(np.clip(1.0 - mean / mx, 0.0, 1.0)),
        max_rank=hi,
        max_excess_us=mx - mean,
        min_rank=lo,
        worst_step=worst,
        worst_step_spread_us=spread,
        evidence=Evidence(
            counts={"ranks": len(ranks), "steps": n_steps},
            note=(
                f"per rank: mean over {'the common steps' if steps else 'its own steps'} of the {component} "
                "per step; imbalance = 1 - mean/max over ranks"
                + ("; compute = union of non-communication kernels" if component == "compute" else "")
                + (
                    "; communication = union of collectives (includes time spent waiting for peers)"
                    if component == "communication"
                    else ""
                )
                + (
                    "; non_communication = step time - communication"
                    if component == "non_communication"
                    else ""
                )
            ),
        ),
    )


def _bubble(dg, comp: pd.DataFrame | None) -> PipelineBubble | None:
    df = dg.collectives
    if not len(df) or comp is None or not len(comp):
        return None
    if not dg.device_compute:
        return None  # no device compute recorded: the bubble is unknown, not 100%
    kind = df["kind"].to_numpy()
    p2p = np.isin(kind, P2P_KINDS) | ((kind == "send_recv") & (df["n"].to_numpy() == 2))
    if not p2p.any():
        return None  # no pipeline parallelism seen
    sel = df[p2p]
    total = float(comp["duration"].sum())
    if not total > 0:
        return None
    compute = float(comp["compute"].sum())
    busy = float(comp["busy"].sum())
    peers = sorted({r for text in sel["pg_ranks"].unique() for r in parse_ranks(text) if r != dg.rank})
    return PipelineBubble(
        rank=dg.rank,
        p2p_count=int(p2p.sum()),
        p2p_time_us=float(sel["dur"].sum()),
        peers=peers,
        steps_count=len(comp),
        step_time_us=total,
        compute_us=compute,
        bubble_ratio=float(np.clip(1.0 - compute / total, 0.0, 1.0)),
        idle_ratio=float(np.clip(1.0 - busy / total, 0.0, 1.0)),
        evidence=Evidence(
            time_ranges_us=[dg.span],
            events=[str(x) for x in sel["name"].unique()[:5]],
            counts={"p2p": int(p2p.sum()), "steps": len(comp)},
            note=(
                "bubble = 1 - sum(compute in steps) / sum(step durations); compute = union of "
                "non-communication kernels, so time in send/recv kernels waiting for the neighbour "
                "stage counts "
                "as bubble; idle = 1 - union(kernels, memcpy) / step time"
            ),
        ),
    )
