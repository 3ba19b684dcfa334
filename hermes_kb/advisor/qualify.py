"""What an answer left out, or rests on with less certainty, one short phrase each: the line the
report's headline carries (issue 37). The warnings say the same at length; a reader who stops at
the headline must still know that a capture, a step or a rank was not counted, or that host
findings were lowered because the trace cannot link kernels to their launches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..analysis.run import empty_stretches
from ..facts import Fact
from ..trace.kineto.reader import DEVICE_ONLY, UNLINKED_KERNELS


def _ranks(ranks) -> str:
    rs = sorted(set(ranks))
    return ", ".join(str(r) for r in rs[:8]) + (", ..." if len(rs) > 8 else "")


def qualifications(facts: Sequence[Fact], warnings: Sequence[str], *, skipped: int = 0, left_out: int = 0,
                   unlinked: set | frozenset = frozenset(), partly: set | frozenset = frozenset()) -> list[str]:  # fmt: skip
    out = []
    if skipped:
        out.append(f"{skipped} input file(s) could not be read and are not counted")
    if left_out:
        out.append(f"{left_out} capture(s) from another process or run left out")
    stretched = Counter(rank for rank, _ in empty_stretches(facts))
    if stretched:
        out.append(f"{sum(stretched.values())} empty stretched profiler step(s) left out (rank(s) {_ranks(stretched)})")
    outliers = {f.rank: f.outlier_steps_count for f in facts if f.kind == "monitor_steps" and f.outlier_steps_count}
    if outliers:
        out.append(f"{sum(outliers.values())} monitored step(s) over 1,000x the median left out (rank(s) {_ranks(outliers)})")
    if any(DEVICE_ONLY in w for w in warnings):
        out.append("device activity only: no host side, no steps (the capture is one window)")
    if unlinked:
        out.append(f"rank(s) {_ranks(unlinked)} link no kernel to a launch call: host (CPU) findings there lowered")
    if partly:
        out.append(f"rank(s) {_ranks(partly)} link fewer than half of their kernels to a launch call: host (CPU) "
                   "findings there lowered one level")
    if not (unlinked or partly) and any(UNLINKED_KERNELS in w for w in warnings):
        out.append("most kernels have no launch call in the trace: launch, dispatch and host-gap causes less sure")
    return out


__all__ = ["qualifications"]
