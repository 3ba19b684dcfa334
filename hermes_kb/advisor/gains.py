"""What one match of a case removes from the step: a replay of the rank's dependency graph with
the fix's events shortened when the case names them (gain.whatif), else the case's fraction of
its measured time, bounded by the components that time sits in (docs/advice.md)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..analysis.replay import removed_at
from ..kb.matches import Match
from ..kb.models import Case


def step_windows(facts: list[dict[str, Any]]) -> dict[int | None, tuple[float, int]]:
    """Per rank: the analysed steps' total time and their number."""
    out: dict[int | None, list[float]] = defaultdict(list)
    for f in facts:
        if f.get("kind") == "step_time" and isinstance(f.get("duration_us"), (int, float)):
            out[f.get("rank")].append(float(f["duration_us"]))
    return {r: (sum(v), len(v)) for r, v in out.items()}


def steps_spanned(t: float, rank: int | None, windows: dict[int | None, tuple[float, int]]) -> int:
    """How many steps a gain's step time T covers: rank-level facts and the replay measure the
    whole analysed window (the sum of n steps), per-step and monitor facts one step. Findings are
    reported per step, so amounts over the window are divided by n."""
    total, n = windows.get(rank, (0.0, 0))
    return n if n > 1 and abs(t - total) <= 0.02 * total else 1


def mean_steps(windows: dict[int | None, tuple[float, int]]) -> dict[int | None, float]:
    """Mean step time per rank, and over all ranks' steps (key None)."""
    out = {r: total / n for r, (total, n) in windows.items() if n}
    n_all = sum(n for _, n in windows.values())
    if n_all:
        out[None] = sum(total for total, _ in windows.values()) / n_all
    return out


def value_of(m: Match, ref) -> float | None:
    """The number a case's field reference points at in one match (None when absent or not a number)."""
    v = m.bindings.get(ref.binding, {}).get(ref.field) if ref is not None else None
    return float(v) if isinstance(v, (int, float)) else None


# which breakdown components a case's category can shorten: without a replay, its removable time
# is bounded by their share of the step (exposed time: removing work the device waits on cannot
# save more than the wait); a CPU-only rank's operators are its compute, so there the host cases
# may also take the compute share
CATEGORY_COMPONENTS = {
    "io": ("data",),
    "cpu": ("host_launch", "host_dispatch", "host_python", "data"),
    "computation": ("compute",),
    "communication": ("communication",),
}


@dataclass
class MatchGain:
    step: float  # T: the analysed step time the removal is part of (µs)
    removes: float  # R: the case's measured time (µs)
    lo: float  # step time the fix removes at the low end of its fraction (µs)
    hi: float
    rank: int | None
    note: str  # how lo/hi were obtained
    target: str | None = None  # the replayed set, when the gain comes from a replay
    phi: tuple[float, float] = (0.0, 0.0)  # the set's fraction at the low and high end
    extra: tuple[float, float] = (0.0, 0.0)  # measured time beyond the set, counted one for one
    per: int = 1  # steps the amounts span: the whole analysed window (n steps) or one step

    def per_step(self, us: float) -> float:
        return us / self.per


def breakdowns(facts: list[dict[str, Any]]) -> dict[int | None, dict[str, Any]]:
    return {f.get("rank"): f for f in facts if f.get("kind") == "step_breakdown" and f.get("step") is None}


def component_cap(case: Case, bd: dict[str, Any] | None, t: float) -> tuple[float | None, str]:
    """At most the share of the step the case's breakdown components hold."""
    comps = CATEGORY_COMPONENTS.get(case.category)
    if bd is None or not comps:
        return None, ""
    if case.category == "cpu" and bd.get("device") == "cpu":
        comps = (*comps, "compute")
    share = sum(float(bd.get(f"{c}_ratio") or 0.0) for c in comps)
    return share * t, "+".join(comps)


def match_gain(case: Case, m: Match, step_means: dict, whatif: dict, bds: dict,
          windows: dict[int | None, tuple[float, int]]) -> MatchGain | None:
    """What the case's fix removes from the analysed steps in one match: a replay of the rank's
    dependency graph when the case names its events (gain.whatif) and the rank has that set,
    else the case's fraction of its measured time, bounded by its components' critical time."""
    g = case.gain
    r = value_of(m, g.removes)
    if r is None:
        return None
    rank = gain_rank(case, m)
    lo_f, hi_f = g.fraction
    if g.fraction_from is not None:
        f_lo, f_hi = (value_of(m, ref) for ref in g.fraction_from)
        if f_lo is not None and f_hi is not None:
            lo_f, hi_f = sorted((min(max(float(f_lo), 0.0), 1.0), min(max(float(f_hi), 0.0), 1.0)))
    r = max(r, 0.0)
    low = value_of(m, g.removes_low)
    r_low = min(max(low, 0.0), r) if low is not None else r
    c = value_of(m, g.at_most)
    w = whatif.get((rank, g.whatif.target)) if g.whatif is not None else None
    if w is not None and w.get("linked", True) is False:
        w = None  # device work not linked to its launches: the replay's dependencies are guesses
    if g.whatif is not None and w is None and (rank, "*linked") in whatif:
        # the rank's graph is replayable but holds none of the events this fix shortens (e.g. an
        # explicit-sync case where every sync is an implicit read-back): it removes nothing here
        t = float(whatif[(rank, "*linked")]["step_us"])
        return MatchGain(step=t, removes=min(r, t), lo=0.0, hi=0.0, rank=rank, per=steps_spanned(t, rank, windows),
                          note=f"The rank's trace holds none of the events this fix shortens ({g.whatif.target}).")
    if w is not None and float(w.get("own_us") or 0.0) > 0 and float(w.get("step_us") or 0.0) > 0:
        t = float(w["step_us"])
        own = float(w["own_us"])
        # the device time the case measured compares with the set's device part: the launching
        # operators' host time in the set goes with its kernels at the same fraction
        own_device = max(own - float(w.get("launch_host_us") or 0.0), 1e-9)
        extra_lo = extra_hi = 0.0
        if g.whatif.scale == "set":
            phi_lo, phi_hi = lo_f, hi_f
        else:
            phi_lo, phi_hi = lo_f * min(1.0, r_low / own_device), hi_f * min(1.0, r / own_device)
            # measured time beyond the set's events (work around them that goes with the fix):
            # counted one for one, as nothing in the graph says what it overlaps
            extra_lo, extra_hi = lo_f * max(0.0, r_low - own_device), hi_f * max(0.0, r - own_device)
        half, full = float(w.get("removed_half_us") or 0.0), float(w.get("removed_all_us") or 0.0)
        rm_lo = removed_at(half, full, phi_lo) + extra_lo
        rm_hi = removed_at(half, full, phi_hi) + extra_hi
        launch_host = own - own_device if own - own_device > 1e-6 else 0.0
        note = (f"Replayed on rank {rank}'s dependency graph (docs/advice.md): the {g.whatif.target} events "
                f"({own / 1e3:,.2f} ms, {float(w.get('critical_us') or 0.0) / 1e3:,.2f} ms of it on the critical path"
                + (f"; {launch_host / 1e3:,.2f} ms of it the host work of the operators that launched only these kernels, "
                   "whose calls the fix removes too" if launch_host else "") + ") "
                f"shortened by {phi_lo:.0%}-{phi_hi:.0%}"
                + ("" if g.whatif.scale == "set" else
                   f" (the fix's {lo_f:.0%}-{hi_f:.0%} of the {r / 1e3:,.2f} ms measured as {g.removes.field})")
                + f" make the analysed steps {rm_lo / 1e3:,.2f}-{rm_hi / 1e3:,.2f} ms shorter;"
                  " what stays hidden under other work is not counted.")  # fmt: skip
        if extra_hi > 0:
            note += (f" Of that, {extra_lo / 1e3:,.2f}-{extra_hi / 1e3:,.2f} ms is measured time beyond the set's "
                     f"events ({(r - own) / 1e3:,.2f} ms), counted one for one.")  # fmt: skip
    else:
        t = value_of(m, g.step)
        if t is None or t <= 0:
            t = step_means.get(rank, step_means.get(None))
        if not isinstance(t, (int, float)) or t <= 0:
            return None
        t = float(t)
        r, r_low = min(r, t), min(r_low, t)
        rm_lo, rm_hi = lo_f * r_low, hi_f * r
        note = f"The fix removes {lo_f:.0%}-{hi_f:.0%} of the {r / 1e3:,.2f} ms measured ({g.removes.field})."
        if r_low < r:
            note += (f" The measurement is itself a range: {r_low / 1e3:,.2f}-{r / 1e3:,.2f} ms "
                     f"({g.removes_low.field} to {g.removes.field}); the low end starts from the smaller one.")  # fmt: skip
        cap, comps = component_cap(case, bds.get(rank), t) if g.within_component else (None, "")
        if cap is not None and cap < rm_hi:
            rm_lo, rm_hi = min(rm_lo, cap), cap
            note += (f" Bound: the step's {comps} time in the breakdown is {cap / 1e3:,.2f} ms "
                     f"({cap / t:.0%}); no more can go.")  # fmt: skip
    if c is not None:
        cap = min(max(c, 0.0), t)
        if cap < rm_hi:
            note += f" Bound: at most {cap / 1e3:,.2f} ms can go ({g.at_most.field}, {cap / t:.0%} of the step)."
        rm_lo, rm_hi = min(rm_lo, cap), min(rm_hi, cap)
    rm_hi = min(max(rm_hi, 0.0), t)
    rm_lo = min(max(rm_lo, 0.0), rm_hi)
    out = MatchGain(step=t, removes=min(r, t), lo=rm_lo, hi=rm_hi, rank=rank, note=note,
                     per=steps_spanned(t, rank, windows))
    if w is not None and "Replayed" in note:
        out.target, out.phi, out.extra = g.whatif.target, (phi_lo, phi_hi), (extra_lo, extra_hi)
    return out


def gain_rank(case: Case, m: Match) -> Any:
    """The rank a match's gain is computed on: that of the binding whose time the fix removes."""
    return m.bindings.get(case.gain.removes.binding, {}).get("rank")


__all__ = ["CATEGORY_COMPONENTS", "MatchGain", "breakdowns", "component_cap", "gain_rank", "match_gain", "mean_steps", "step_windows", "steps_spanned", "value_of"]
