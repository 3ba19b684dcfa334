"""Why a predicted speedup misses: decompose each zoo scenario's gain error (issue 33, item 1).

For each scored scenario (CPU and GPU zoo) whose expected finding has a range, the log of the
measured speedup over the gain model's midpoint (before calibration) splits exactly into three
parts, and a fourth that is only arithmetic:

- fraction: the case's measured time R against what the prediction removes (midpoint of the
  removable range): log(T / (T - R)) - log(T / (T - removed_mid)). Positive when the fix's
  fraction (or a bound) keeps part of R in the step.
- outside: what the fix removed from the traced step beyond R: log(traced speedup) - log(T / (T - R)),
  with the traced speedup = the bad capture's mean step over the fixed capture's. Positive when
  the fix removed time the case's measurement did not count (waits, Python and allocator work
  around the cause, the device idle behind it); negative when R holds work the fix kept.
- profiler: log(measured) - log(traced speedup): the profiler's own cost (and run-to-run noise)
  changes the ratio between the two traced steps and the two unprofiled ones. Positive when the
  profiler inflated the fixed step's residue more than the bad step.
- rest: the speedup at the middle of the removable range against the middle of the speedup range
  (a wide range's arithmetic middle lies above the speedup of its middle removal).

Run: python benchmarks/gain_decomposition.py [--write FILE] (Markdown table; about 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval as zoo  # noqa: E402  (benchmarks/eval.py: the zoo's inputs and labels)
from hermes_kb.advisor.report import Removable, Speedup, model_ends  # noqa: E402


@dataclass
class Decomposition:
    name: str
    gpu: bool
    case: str
    step_us: float  # T: the finding's analysed step
    at_stake_us: float  # R: the case's measured time per step
    removed_mid_us: float
    traced_bad_us: float
    traced_fixed_us: float
    predicted: tuple[float, float]
    measured: float

    @property
    def mid(self) -> float:
        return (self.predicted[0] + self.predicted[1]) / 2

    @property
    def traced(self) -> float:
        return self.traced_bad_us / self.traced_fixed_us

    @property
    def at_r(self) -> float:
        t = self.step_us
        return t / max(t - min(self.at_stake_us, 0.99 * t), 1e-9)

    @property
    def parts(self) -> dict[str, float]:
        t = self.step_us
        pred_mid = t / max(t - self.removed_mid_us, 1e-9)
        return {
            "fraction": math.log(self.at_r) - math.log(pred_mid),
            "outside": math.log(self.traced) - math.log(self.at_r),
            "profiler": math.log(self.measured) - math.log(self.traced),
            "rest": math.log(pred_mid) - math.log(self.mid),  # midpoint of speedups vs speedup of mid removal
        }

    @property
    def total(self) -> float:
        return math.log(self.measured / self.mid)


def _mean_step(path) -> float | None:
    if path is None:
        return None
    rep = zoo._advise(path)
    steps = [s["mean_step_us"] for s in rep["summary"] if s.get("mean_step_us")]
    return steps[0] if steps else None


def decompose(d: Path) -> Decomposition | None:
    label = json.loads((d / "label.json").read_text())
    if label.get("healthy") or label.get("category") == "none" or label.get("throughput_speedup"):
        return None
    measured = label.get("speedup_of_fix")
    bad = zoo.variant_input(d, "bad")
    if not measured or bad is None:
        return None
    fs = zoo._advise(bad)["findings"]
    hit = next((f for f in fs if zoo._matches(f, label)), None)
    if hit is None or not hit.get("removable_us"):
        return None
    tb, tf = _mean_step(zoo.trace_only_input(d, "bad")), _mean_step(zoo.trace_only_input(d, "fixed"))
    if not tb or not tf:
        return None
    # the gain model's own numbers, before calibration
    rm = model_ends(Removable.model_validate(hit["removable_us"]))
    sp = model_ends(Speedup.model_validate(hit["expected_speedup"]))
    return Decomposition(d.name, bool(label.get("gpu")), hit["case_id"], hit["step_time_us"], hit["time_at_stake_us"],
                         sum(rm) / 2, tb, tf, sp, measured)  # fmt: skip


def render(rows: list[Decomposition]) -> list[str]:
    def pct(x: float) -> str:
        return f"{math.expm1(x):+.0%}"

    out = ["| scenario | case | T ms | R ms | removed (mid) ms | traced bad / fixed ms | predicted | traced | measured "
           "| error | fraction | outside R | profiler |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r.gpu, r.name)):
        p = r.parts
        out.append(f"| {r.name} | {r.case} | {r.step_us / 1e3:.2f} | {r.at_stake_us / 1e3:.2f} | {r.removed_mid_us / 1e3:.2f} "
                   f"| {r.traced_bad_us / 1e3:.2f} / {r.traced_fixed_us / 1e3:.2f} | {r.predicted[0]:.2f}-{r.predicted[1]:.2f}x "
                   f"| {r.traced:.2f}x | {r.measured:.2f}x | {pct(r.total)} | {pct(p['fraction'])} | {pct(p['outside'])} "
                   f"| {pct(p['profiler'])} |")  # fmt: skip
    misses = [r for r in rows if not r.predicted[0] <= r.measured <= r.predicted[1]]
    under = [r for r in misses if r.measured > r.predicted[1]]
    out += ["", f"{len(rows)} scenarios; measured inside the range on {len(rows) - len(misses)}; of the {len(misses)} misses "
            f"{len(under)} under-predicted. Over the under-predictions, the mean share of the log error from each part: "
            + ", ".join(f"{k} {sum(r.parts[k] for r in under) / max(sum(r.total for r in under), 1e-9):.0%}"
                        for k in ("fraction", "outside", "profiler", "rest")) + "."]  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", default=None, help="write the Markdown table here")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    dirs = sorted(p.parent for p in zoo.RECORDED.glob("*/label.json"))
    cpu, gpu, _ = zoo.split_zoo(dirs)
    rows = [r for d in cpu + gpu if (r := decompose(d)) is not None]
    text = "\n".join(render(rows)) + "\n"
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps([{**r.__dict__, "parts": r.parts, "total": r.total} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
