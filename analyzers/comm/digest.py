"""What the cross-rank analyzers read of one rank: its step windows, its collectives and its
per-step components, a few kilobytes where the rank's frames are megabytes.

A rank is analysed, digested and released; the cross-rank stage (comm, parallel, fluctuation)
then works on the digests of every rank, so a job of thousands of ranks never holds more than a
few ranks' frames at once (hermes_kb/scale/stream.py). Every digest's times are on its rank's own
clock until ``shifted`` puts them on the job's common origin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from ..context import RankContext, StepWindow

# the columns of collectives.rank_collectives that the cross-rank analyzers read
COLLECTIVE_COLUMNS = ["pg", "pg_ranks", "kind", "source", "step", "ts", "dur", "seq", "n", "name", "msg_bytes"]


@dataclass
class RankDigest:
    rank: int
    windows: list[StepWindow]
    span: tuple[float, float]
    collectives: pd.DataFrame  # COLLECTIVE_COLUMNS, one row per collective issued in an analysed step
    components: pd.DataFrame | None  # parallel.rank_components; None without analysed steps
    device_compute: bool  # parallel.has_device_compute
    job_forms: Any = None  # whatif.job_forms.RankForms: the rank's replay with its collectives' ends free

    def shifted(self, delta_us: float) -> RankDigest:
        """The same digest with every absolute time moved by ``delta_us`` (as TraceBundle's
        ``RankTrace.shift`` moves the frames: the same float additions)."""
        if delta_us == 0.0:
            return self
        coll = self.collectives
        if len(coll):
            coll = coll.copy()
            coll["ts"] = coll["ts"] + delta_us
        windows = [StepWindow(w.step, w.start_us + delta_us, w.end_us + delta_us, w.cpu_end_us + delta_us)
                   for w in self.windows]  # fmt: skip
        span = (self.span[0] + delta_us, self.span[1] + delta_us)
        forms = self.job_forms.moved(delta_us) if self.job_forms is not None else None
        return replace(self, windows=windows, span=span, collectives=coll, job_forms=forms)


def digest_of(ctx: RankContext) -> RankDigest:
    """The rank's digest, from its analysed context (after the per-rank analyzers, whose
    cached collectives and components it reuses)."""
    from .collectives import rank_collectives
    from .parallel import has_device_compute, rank_components

    coll = rank_collectives(ctx)
    coll = coll[COLLECTIVE_COLUMNS].reset_index(drop=True) if len(coll) else pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    return RankDigest(
        rank=ctx.rank,
        windows=list(ctx.windows),
        span=ctx.span,
        collectives=coll,
        components=rank_components(ctx) if ctx.windows else None,
        device_compute=has_device_compute(ctx),
        job_forms=ctx.shared.get("job_forms"),
    )


__all__ = ["COLLECTIVE_COLUMNS", "RankDigest", "digest_of"]
