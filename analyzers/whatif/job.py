"""The job graph: every rank's reduced replay (job_forms.py) joined at its matched collectives
(docs/analysis/whatif.md, "The job").

A collective instance is matched on every rank of its group present in the input (by sequence
number where recorded, else by its order among the group's collectives of that kind within the
step, as the sync-wait analyzer matches them). It ends on every member at the latest arrival plus
its transfer time, measured on the rank that arrived last (the member with the shortest recorded
duration: it waited least). The clocks of the ranks are aligned on their collectives' ends (all
members of an instance finish together); what the ranks' traces say about each other's clocks is
not used.

The join answers for the job what the rank's replay answers for a rank: the analysed span with
some ranks' sets shortened (job-level gains), and the counterfactuals a cluster maintainer asks
for: the slowest rank at the median rank's pace (its cost to the job), the rank and pipeline stage
that holds each collective, the gain of balancing the stages (fact ``job_replay``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.whatif import JobReplay

from ..comm.pipeline import pipeline_stages
from ..comm.sync import occurrence
from .job_forms import FREE, RankForms, evaluate

ALIGN_ROUNDS = 3
MAX_LISTED = 10


@dataclass
class Job:
    """The ranks' collectives matched into instances, and the clock shift of every rank."""

    ranks: list[int]
    inst_of: dict[int, list[int]]  # rank -> per anchored collective: instance id, -1 unmatched
    local_end: dict[int, list[float]]  # rank -> per anchored collective: recorded end (rank clock)
    local_dur: dict[int, list[float]]
    transfer: list[float]  # per instance
    rec_end: list[float]  # per instance: recorded end on the job clock (median over members)
    members: list[list[tuple[int, int]]]  # per instance: (rank, anchored index)
    order: list[int]  # instances by recorded end
    group: list[str]  # per instance: "pg/kind"
    shift: dict[int, float] = field(default_factory=dict)  # job clock = rank clock + shift
    steps: int = 1
    unmatched: int = 0


def build_job(tables: dict[int, pd.DataFrame], forms: dict[int, RankForms], steps: int = 1) -> Job | None:
    """``tables``: each rank's collectives frame (digest.COLLECTIVE_COLUMNS, the rows forms.rows
    index); ``forms``: its unchanged forms. None when fewer than two ranks share an instance."""
    parts = []
    for r, f in forms.items():
        df = tables.get(r)
        if df is None or not len(df) or not f.rows:
            continue
        d = df[["pg", "pg_ranks", "kind", "source", "step", "ts", "dur", "seq"]].copy()
        d["occ"] = occurrence(d)
        d = d.iloc[f.rows].copy()
        d["rank"] = r
        d["k"] = np.arange(len(f.rows))
        parts.append(d)
    if len(parts) < 2:
        return None
    df = pd.concat(parts, ignore_index=True)
    ranks = sorted(forms)
    inst_of = {r: [-1] * len(forms[r].rows) for r in ranks}
    local_end = {r: [0.0] * len(forms[r].rows) for r in ranks}
    local_dur = {r: [0.0] * len(forms[r].rows) for r in ranks}
    for rk, k, ts, dur in zip(df["rank"].tolist(), df["k"].tolist(), df["ts"].tolist(), df["dur"].tolist()):
        local_end[rk][k], local_dur[rk][k] = float(ts) + float(dur), float(dur)
    members: list[list[tuple[int, int]]] = []
    group: list[str] = []
    unmatched = 0
    for key, grp in df.groupby(["pg", "pg_ranks", "kind", "source"], sort=False):
        present = grp["rank"].nunique()
        if present < 2:
            unmatched += len(grp)
            continue
        cols = ["seq"] if bool((grp["seq"] >= 0).all()) else ["step", "occ"]
        for _, inst in grp.groupby(cols, sort=False):
            inst = inst.drop_duplicates("rank")
            if len(inst) != present:
                unmatched += len(inst)
                continue
            mem = list(zip(inst["rank"].tolist(), inst["k"].tolist()))
            for rk, k in mem:
                inst_of[rk][k] = len(members)
            members.append(mem)
            group.append(f"{key[0]}/{key[2]}")
    if not members:
        return None
    transfer = [min(local_dur[rk][k] for rk, k in mem) for mem in members]
    shift = {r: 0.0 for r in ranks}
    rec_end = [0.0] * len(members)
    for _ in range(ALIGN_ROUNDS):  # the instance's end on the common clock, then each rank's offset to it
        rec_end = [statistics.median(local_end[rk][k] + shift[rk] for rk, k in mem) for mem in members]
        for r in ranks:
            d = [rec_end[i] - local_end[r][k] for k, i in enumerate(inst_of[r]) if i >= 0]
            shift[r] = statistics.median(d) if d else shift[r]
    base = min(shift.values())
    shift = {r: s - base for r, s in shift.items()}
    rec_end = [statistics.median(local_end[rk][k] + shift[rk] for rk, k in mem) for mem in members]
    order = sorted(range(len(members)), key=lambda i: rec_end[i])
    return Job(ranks=ranks, inst_of=inst_of, local_end=local_end, local_dur=local_dur, transfer=transfer,
               rec_end=rec_end, members=members, order=order, group=group, shift=shift, steps=max(1, steps),
               unmatched=unmatched)  # fmt: skip


@dataclass
class Joined:
    stop: dict[int, float]  # rank -> its last analysed step's end, on the job clock
    holder: list[int]  # per instance: the rank that arrived last
    end: list[float]  # per instance: its end on the job clock
    period: float = 0.0  # the analysed steps' length in the steady state (steady())


def join(job: Job, forms: dict[int, RankForms], delay: dict[int, float] | None = None,
         fallback: list[float] | None = None, transfer: list[float] | None = None) -> Joined:  # fmt: skip
    """Every instance in order of its recorded end: its end is the latest member's arrival plus
    its transfer; then each rank's end of the analysed steps. ``delay`` moves a rank's
    plain times (its own work began that much later); a form naming an instance not yet joined
    (clock skew) takes its ``fallback`` end (default: recorded); a collective matched on no peer
    keeps its own recorded duration after its arrival. ``transfer``: the instances' transfer
    times, where a fix changes them (default: recorded)."""
    E: list[float | None] = [None] * len(job.members)
    xfer = transfer if transfer is not None else job.transfer
    holder = [-1] * len(job.members)
    local_memo: dict[tuple[int, int], float] = {}
    delay = delay or {}
    before = fallback if fallback is not None else job.rec_end

    def end_for(r: int):
        inst, sh, f, d = job.inst_of[r], job.shift[r], forms[r], delay.get(r, 0.0)

        def get(k: int) -> float:
            i = inst[k]
            if i >= 0:
                e = E[i]
                return (e if e is not None else before[i]) - sh
            key = (r, k)
            if key not in local_memo:
                local_memo[key] = job.local_end[r][k] + d  # guard against a form naming itself
                local_memo[key] = evaluate(f.arrival[k], get, d) + job.local_dur[r][k]
            return local_memo[key]

        return get

    getters = {r: end_for(r) for r in job.ranks}
    for i in job.order:
        best, who = float("-inf"), -1
        for rk, k in job.members[i]:
            t = evaluate(forms[rk].arrival[k], getters[rk], delay.get(rk, 0.0)) + job.shift[rk]
            if t > best:
                best, who = t, rk
        if who < 0:  # no member's arrival is known (a form that never came up): as recorded
            E[i] = before[i]
            continue
        E[i] = best + xfer[i]
        holder[i] = who
    stop = {r: evaluate(forms[r].end, getters[r], delay.get(r, 0.0)) + job.shift[r] for r in job.ranks}
    return Joined(stop=stop, holder=holder, end=[float(e) for e in E])  # type: ignore[arg-type]


STEADY_ROUNDS = 12  # the analysed steps repeated this many times
STEADY_AVERAGE = 4  # the period averaged over the last rounds (a job can alternate between two states)


def steady(job: Job, forms: dict[int, RankForms], transfer: list[float] | None = None) -> Joined:
    """The analysed steps as the job runs them over and over: each round, every rank begins them
    again where it ended them last round, and the collectives join as before. The period is the
    growth of the last end per round once it settles (the max-plus system's cycle time), so that
    where the ranks' step boundaries fall in the recording (a rank that came early to the first
    collective of a one-step trace waits there for the others' previous step) does not count.
    The rounds' last one is returned, with ``period``."""
    base = {r: evaluate(forms[r].start, job.local_end[r]) + job.shift[r] for r in job.ranks}
    delay: dict[int, float] = {}
    last_stops: list[float] = []
    j = join(job, forms, transfer=transfer)
    for _ in range(STEADY_ROUNDS):
        last_stops.append(max(j.stop.values()))
        delay = {r: j.stop[r] - base[r] for r in job.ranks}
        grow = last_stops[-1] - last_stops[-2] if len(last_stops) > 1 else max(delay.values())
        fallback = [e + grow for e in j.end]
        j = join(job, forms, delay, fallback, transfer)
    last_stops.append(max(j.stop.values()))
    k = min(STEADY_AVERAGE, len(last_stops) - 1)
    j.period = (last_stops[-1] - last_stops[-1 - k]) / k
    return j


def recorded_spans(job: Job, forms: dict[int, RankForms]) -> dict[int, float]:
    """Each rank's analysed span with every collective ending when it ended in the recording."""
    return {r: evaluate(forms[r].end, job.local_end[r]) - evaluate(forms[r].start, job.local_end[r])
            for r in job.ranks}  # fmt: skip


def free_running(job: Job, forms: RankForms, r: int) -> float:
    """The rank's span had it never waited for a peer: each collective ends its transfer after the
    rank's own arrival."""
    ends = list(job.local_end[r])
    for k in sorted(range(len(ends)), key=lambda k: job.local_end[r][k]):
        i = job.inst_of[r][k]
        ends[k] = evaluate(forms.arrival[k], ends) + (job.transfer[i] if i >= 0 else job.local_dur[r][k])
    return evaluate(forms.end, ends) - evaluate(forms.start, ends)


def paced(forms: RankForms, pace: float) -> RankForms:
    """The rank's forms with every path through its own work scaled by ``pace`` (the rank running
    at another rank's pace): offsets after a collective's end, and plain times from the span's
    start."""
    t0 = evaluate(forms.start, lambda k: 0.0) if not isinstance(forms.start, dict) else None

    def scale(v):
        if isinstance(v, dict):
            return {k: (t0 + (o - t0) * pace if k == FREE and t0 is not None else o * pace) for k, o in v.items()}
        if t0 is None:
            return v
        return t0 + (v - t0) * pace

    return RankForms(rows=forms.rows, arrival=[scale(a) for a in forms.arrival], start=forms.start, end=scale(forms.end),
                     chain=forms.chain)


def at_pace(job: Job, forms: RankForms, r: int, target_us: float) -> RankForms:
    """The rank's forms with its own work scaled (``paced``) so that its free-running span is
    ``target_us``: the factor found by bisection, the transfers kept."""
    if free_running(job, forms, r) <= target_us:
        return forms
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if free_running(job, paced(forms, mid), r) > target_us:
            hi = mid
        else:
            lo = mid
    return paced(forms, lo)


def job_replay(job: Job, forms: dict[int, RankForms], facts: list) -> JobReplay:
    """The job's fact: the join against the recording, the straggler's cost, who holds the
    collectives, and for pipeline-parallel jobs the stage that holds the step."""
    joined = steady(job, forms)
    recorded = statistics.median(recorded_spans(job, forms).values())
    free = {r: free_running(job, forms[r], r) for r in job.ranks}
    slow = max(free, key=lambda r: (free[r], -r))
    med = statistics.median(free.values())
    cf = steady(job, {**forms, slow: at_pace(job, forms[slow], slow, med)})
    cost = max(0.0, joined.period - cf.period)
    n = job.steps
    counts = pd.Series([h for h in joined.holder if h >= 0]).value_counts()
    top = int(counts.index[0]) if len(counts) else -1
    holders = {int(k): int(v) for k, v in counts.head(MAX_LISTED).items()}
    stage_fields = _stages(job, forms, joined, free, facts)
    by_group: dict[str, dict[int, int]] = {}
    for g, h in zip(job.group, joined.holder):
        if h >= 0:
            by_group.setdefault(g, {}).setdefault(h, 0)
            by_group[g][h] += 1
    group_top = {g: max(c, key=lambda r: (c[r], -r)) for g, c in by_group.items()}
    group_share = {g: c[group_top[g]] / sum(c.values()) for g, c in by_group.items()}
    slowest_free = free[slow]
    return JobReplay(
        ranks_count=len(job.ranks), chain_ranks_count=sum(1 for r in job.ranks if forms[r].chain),
        instances_count=len(job.members), unmatched_count=job.unmatched,
        steps_count=n, recorded_step_us=recorded / n, modelled_step_us=joined.period / n,
        model_error=(joined.period - recorded) / recorded if recorded > 0 else 0.0,
        free_running_us={int(r): v / n for r, v in sorted(free.items(), key=lambda kv: -kv[1])[:MAX_LISTED]},
        slowest_rank=int(slow), slowest_free_us=slowest_free / n, median_free_us=med / n,
        straggler_cost_us=cost / n, straggler_cost_ratio=cost / joined.period if joined.period > 0 else 0.0,
        gpu_hours_per_1000_steps=cost / n * 1e-6 * len(job.ranks) * 1000 / 3600,
        holders_count=holders, top_holder_rank=top,
        top_holder_share_ratio=(int(counts.iloc[0]) / len(job.members)) if len(counts) else 0.0,
        group_holder=dict(sorted(group_top.items())[:MAX_LISTED]),
        group_holder_share=dict(sorted(group_share.items())[:MAX_LISTED]),
        **stage_fields,
        evidence=Evidence(
            events=sorted(set(job.group))[:5],
            note=f"{len(job.members)} collective instances joined across {len(job.ranks)} ranks "
                 "(docs/analysis/whatif.md, 'The job')",
        ),
    )  # fmt: skip


def _stages(job: Job, forms: dict[int, RankForms], joined: Joined, free: dict[int, float], facts: list) -> dict:
    stages = pipeline_stages(facts)
    if not stages or not any(r in stages for r in job.ranks):
        return {}
    of = {r: stages[r][1] for r in job.ranks if r in stages}
    counts = pd.Series([of[h] for h in joined.holder if h in of]).value_counts()
    pace_of: dict[int, float] = {}
    for r, s in of.items():
        pace_of[s] = max(pace_of.get(s, 0.0), free[r])
    if len(pace_of) < 2:
        return {}
    slow = max(pace_of, key=lambda s: pace_of[s])
    med = statistics.median(pace_of.values())
    cf = steady(job, {r: (at_pace(job, f, r, med) if of.get(r) == slow else f) for r, f in forms.items()})
    gain = max(0.0, joined.period - cf.period) / job.steps
    return {"holding_stage": int(counts.index[0]) if len(counts) else int(slow),
            "stage_free_us": {int(s): v / job.steps for s, v in sorted(pace_of.items())},
            "stage_balance_gain_us": gain}  # fmt: skip


def cross_rank(digests: dict, facts: list) -> list:
    forms = {r: d.job_forms for r, d in digests.items() if getattr(d, "job_forms", None) is not None}
    if len(forms) < 2:
        return []
    steps = min(len(digests[r].windows) for r in forms) or 1
    job = build_job({r: digests[r].collectives for r in forms}, forms, steps)
    if job is None:
        return []
    return [job_replay(job, {r: forms[r] for r in job.ranks}, facts)]


__all__ = ["Job", "Joined", "at_pace", "build_job", "free_running", "job_replay", "join", "paced", "recorded_spans", "steady"]
