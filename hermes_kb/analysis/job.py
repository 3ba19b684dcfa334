"""The job's replay for the advisor: the ranks' reduced replays joined at their collectives
(analyzers/whatif/job.py), and how much shorter the job's step gets with some sets shortened on
some ranks (docs/advice.md, "Job-level gains")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analyzers.whatif.job import Job, build_job, steady
from ..analyzers.whatif.job_forms import RankForms, rank_forms
from ..analyzers.whatif.replay import together


@dataclass
class JobState:
    job: Job
    forms: dict[int, RankForms]  # unchanged
    period: float  # the job's analysed steps in the steady join (µs, whole window)
    states: Mapping[int, Any]  # rank -> ReplayState
    _memo: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # job-level gains that failed (advisor/job_gains.py)

    @property
    def steps(self) -> int:
        return self.job.steps

    @property
    def step_us(self) -> float:
        return self.period / self.job.steps


def job_state(replay: Mapping[int, Any], targets: set[str] | None = None) -> JobState | None:
    """The job's join from the ranks' replay states; None with fewer than two ranks that share a
    matched collective. ``targets``: the only sets job_removed will be asked about (the others'
    per-node amounts are not kept)."""
    parts = {}
    for r in replay:
        s = replay[r]
        if getattr(s, "job", None) is not None:
            if targets is not None:
                s = dataclasses.replace(s, amounts={t: a for t, a in s.amounts.items() if t in targets})
            parts[r] = s
    if len(parts) < 2:
        return None
    forms = {r: rank_forms(s.model, s.job.anchors) for r, s in parts.items()}
    steps = min(s.job.steps for s in parts.values())
    job = build_job({r: s.job.table for r, s in parts.items()}, forms, steps)
    if job is None:
        return None
    forms = {r: forms[r] for r in job.ranks}
    return JobState(job=job, forms=forms, period=steady(job, forms).period, states=parts)


def job_removed(js: JobState, changes: Mapping[int, list[tuple[np.ndarray, float, bool]]]) -> float:
    """µs the job's analysed steps lose (steady join) with, on each rank of ``changes``, its sets
    shortened at once (parts as in replay.removed_together: amounts per node, fraction, drops
    waits). Ranks outside the join are left out."""
    key = tuple(sorted((r, tuple((id(a), round(f, 9), d) for a, f, d in p)) for r, p in changes.items()))
    if key in js._memo:
        return js._memo[key]
    forms = dict(js.forms)
    transfer = list(js.job.transfer)
    changed = False
    for r, parts in changes.items():
        st = js.states.get(r)
        if r not in forms or st is None or not parts:
            continue
        rkey = (r, tuple((id(a), round(f, 9), d) for a, f, d in parts))
        if rkey not in js._memo:
            shrink, drop = together(st.model, parts)
            if not shrink.any() and drop is None:
                js._memo[rkey] = (js.forms[r], np.zeros(0))
            else:
                # a set holding the collectives themselves (a faster transfer) shortens their
                # instances: by the largest share any member's collective loses
                an, own = st.job.anchors, st.model.own
                oc = own[an.carrier_node]
                frac = np.where(oc > 0, np.minimum(shrink[an.carrier_node] / np.where(oc > 0, oc, 1.0), 1.0), 0.0)
                js._memo[rkey] = (rank_forms(st.model, an, shrink, drop), frac)
        forms[r], frac = js._memo[rkey]
        for k, f in zip(st.job.anchors.carrier_of.tolist(), frac.tolist()):
            i = js.job.inst_of[r][k]
            if i >= 0 and f > 0:
                transfer[i] = min(transfer[i], js.job.transfer[i] * (1.0 - f))
                changed = True
    out = js.period - steady(js.job, forms, transfer if changed else None).period
    js._memo[key] = out
    return out


__all__ = ["JobState", "job_removed", "job_state"]
