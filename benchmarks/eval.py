"""Diagnosis accuracy on the scenario zoo (and, as observations, on labelled shared traces).

    python benchmarks/eval.py [--write docs/accuracy.md] [--check]

For every recorded scenario (benchmarks/scenarios/recorded/<name>/label.json beside the run
directories bad/ and fixed/: the monitor's log rank0.jsonl and the profiler's capture
rank0.capture-profile.json.gz; older recordings: bad.json.gz and fixed.json.gz), runs hermes
advise on the bad variant and on its fixed twin and scores:

- top-1 / top-3: the label's expected case ids, or its cause family (the label's cause and the
  causes of its expected cases), among the first 1 / 3 findings;
- false alarms: any high-severity finding on a fixed twin or a healthy control;
- gain error: the predicted step-time speedup range of the finding that names the cause
  against the measured speedup of the fix (hit if inside the range; relative error of the
  midpoint).

Targets (issue 5): top-1 >= 90%, no high-severity false alarm, median gain error <= 25%.
``--check`` (run by CI on the committed recordings, which makes every score deterministic) exits
1 when top-1 or the false alarms miss their targets, when top-3 falls below the committed
baseline (benchmarks/accuracy_baseline.json), or when the median gain error exceeds both its
target and the baseline (it is above target on the committed set: the report says why).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks/scenarios"))
import common  # noqa: E402  the scenario harness (standard library only at import): its step schedule
RECORDED = ROOT / "benchmarks/scenarios/recorded"
BASELINE = ROOT / "benchmarks/accuracy_baseline.json"
SHARED = ROOT.parent / "shared/data"

# Shared traces whose READMEs describe one dominant problem. Their READMEs call these
# observations, not ground truth, so they are reported but not counted in the targets.
OBSERVED = [
    ("param/resnet_kineto.json.gz", "io", "data loading (README: DataLoader 8.2 s of 16.2 s)"),
    ("tracelens/h100__google_owlv2-large-patch14-ensemble__1016001.json.gz", "io", "single-process DataLoader 619 of 1211 ms"),
    ("param/linear_kineto.json.gz", "cpu", "CPU launch overhead (tiny kernels, GPU idle)"),
    ("tracelens/h100__gaunernst_bert-small-uncased__1016001.json.gz", "cpu", "launch overhead, 97% kernels < 10 us"),
    ("tracelens/h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "computation", "GPU-bound compute"),
    ("param/dlrm_kineto_8rank", "communication", "communication-bound, rank imbalance"),
]


@dataclass
class Outcome:
    name: str
    label: dict
    first: list[dict] = field(default_factory=list)  # first 3 findings of the bad variant
    fixed_high: list[str] = field(default_factory=list)
    fixed_residue: int = 0  # of fixed_high: the injected cause itself, still there after the fix
    top1: bool = False
    top3: bool = False
    predicted: tuple[float, float] | None = None
    measured: float | None = None
    # the same ratio in the recorded runs themselves (the monitor's unprofiled steps): not scored,
    # it says how far two runs of the same code on this machine differ
    recorded: float | None = None
    # fixed-twin findings whose own fix was applied to the twin and timed (secondary.json)
    checked: list[dict] = field(default_factory=list)

    @property
    def gain_hit(self) -> bool | None:
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted[0] <= self.measured <= self.predicted[1]

    @property
    def gain_error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        mid = (self.predicted[0] + self.predicted[1]) / 2
        return abs(mid - self.measured) / self.measured


@functools.lru_cache(maxsize=1)
def _case_causes() -> dict[str, str]:
    from hermes_kb.advisor import knowledge_base

    return {e.item.id: e.item.cause for e in knowledge_base().cases}


def expected_causes(label: dict) -> set[str]:
    """The cause family a label names: its own cause, and the causes of its expected cases (a
    GC-pause case from the monitor names the same cause as one from the trace)."""
    causes = _case_causes()
    return {label.get("cause")} | {causes[c] for c in label.get("expected_cases", []) if c in causes}


def _matches(f: dict, label: dict) -> bool:
    return f["case_id"] in label.get("expected_cases", []) or f["cause"] in expected_causes(label)


def _advise(path: Path) -> dict:
    import hermes_kb

    return hermes_kb.advise(path).model_dump(mode="json")


def variant_input(d: Path, variant: str) -> Path | None:
    """The run directory of a variant (monitor log + capture), else its lone trace."""
    for p in (d / variant, d / f"{variant}.json.gz"):
        if p.exists():
            return p
    return None


def score_scenario(d: Path) -> Outcome:
    label = json.loads((d / "label.json").read_text())
    out = Outcome(d.name, label)
    healthy = label.get("healthy") or label.get("category") == "none"
    bad = variant_input(d, "bad")
    if bad is not None and not healthy:
        rep = _advise(bad)
        fs = rep["findings"]
        out.first = [{k: f[k] for k in ("case_id", "cause", "category", "severity", "expected_speedup", "explanation",
                                        "share_of_step_ratio", "time_at_stake_us")} for f in fs[:3]]  # fmt: skip
        out.top1 = bool(fs) and _matches(fs[0], label)
        out.top3 = any(_matches(f, label) for f in fs[:3])
        hit = next((f for f in fs if _matches(f, label)), None)
        if hit is not None:
            out.predicted = (hit["expected_speedup"]["low"], hit["expected_speedup"]["high"])
        # per-sample throughput where the fix changes the work per step (small batch)
        out.measured = label.get("throughput_speedup") or label.get("speedup_of_fix")
        out.recorded = recorded_speedup(d, label)
    for variant in ("fixed", "bad") if healthy else ("fixed",):
        p = variant_input(d, variant)
        if p is not None:
            rep = _advise(p)
            high = [f for f in rep["findings"] if f["severity"] == "high"]
            out.fixed_high += [f"{variant}: {f['case_id']}" for f in high]
            out.fixed_residue += sum(1 for f in high if not healthy and _matches(f, label))
            out.checked += _checked(d, variant, high)
    return out


def unprofiled_mean_s(run_dir: Path) -> float | None:
    """Mean wall time of the monitored steps before the profiler's window: the harness runs
    common.WARMUP steps, the monitored steps, then the profiler's schedule (1 warm-up step and
    common.PROFILE_STEPS recorded ones) at the end of the run."""
    from hermes_kb.monitor.reader import read_rank_log

    log = run_dir / "rank0.jsonl"
    if not log.is_file():
        return None
    walls = read_rank_log(log, 0).wall_s
    walls = walls[common.WARMUP:len(walls) - (common.PROFILE_STEPS + 1)]
    return statistics.fmean(walls) if len(walls) >= 2 else None


def recorded_speedup(d: Path, label: dict) -> float | None:
    """Speedup of the fix between the two recorded runs (unprofiled monitored steps; per sample
    where the label compares throughput)."""
    bad, fixed = unprofiled_mean_s(d / "bad"), unprofiled_mean_s(d / "fixed")
    if not bad or not fixed:
        return None
    per = label.get("samples_per_step")
    if label.get("throughput_speedup") and isinstance(per, dict):
        return (per["fixed"] / fixed) / (per["bad"] / bad)
    return bad / fixed


TARGETS = {"top1": 0.90, "false_alarms": 0, "median_gain_error": 0.25}  # issue 5
CONFIRMED = 1.1  # a second fix that gains at least this much was a real finding, not a false alarm


def _checked(d: Path, variant: str, high: list[dict]) -> list[dict]:
    """High findings on a twin whose fix verify_secondary.py applied and timed."""
    path = d / "secondary.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    out = []
    for f in high:
        m = done.get(f"{variant}/{f['case_id']}")
        if m:
            lo, hi = f["expected_speedup"]["low"], f["expected_speedup"]["high"]
            out.append({"variant": variant, "case_id": f["case_id"], "change": m["change"], "predicted": (lo, hi),
                        "measured": m["speedup"], "in_range": lo <= m["speedup"] <= hi})  # fmt: skip
    return out


def observed() -> list[tuple[str, str, str, list[str]]]:
    rows = []
    for rel, cat, what in OBSERVED:
        p = SHARED / rel
        if not p.exists():
            continue
        rep = _advise(p)
        rows.append((rel, cat, what, [f"{f['case_id']} ({f['category']}, {f['severity']})" for f in rep["findings"][:3]]))
    return rows


def _confirmed(outcomes: list[Outcome]) -> int:
    return sum(c["measured"] >= CONFIRMED for o in outcomes for c in o.checked)


def summarize(outcomes: list[Outcome]) -> dict:
    high, confirmed = sum(len(o.fixed_high) for o in outcomes), _confirmed(outcomes)
    scored = [o for o in outcomes if not (o.label.get("healthy") or o.label.get("category") == "none")]
    errors = [o.gain_error for o in scored if o.gain_error is not None]
    hits = [o.gain_hit for o in scored if o.gain_hit is not None]
    spread = [abs(o.recorded - o.measured) / o.measured for o in scored if o.recorded and o.measured]
    n = len(scored)
    return {
        "scenarios": n,
        "top1": sum(o.top1 for o in scored) / n if n else 0.0,
        "top3": sum(o.top3 for o in scored) / n if n else 0.0,
        # a high finding on a twin whose own fix, timed on the twin, gained CONFIRMED or more found a
        # real problem the twin still has: not a false alarm; every other one is
        "high_on_twins": high,
        "false_alarms": high - confirmed,
        "false_alarms_same_cause": sum(o.fixed_residue for o in outcomes),
        "false_alarms_checked": sum(len(o.checked) for o in outcomes),
        "false_alarms_checked_real": confirmed,
        "median_gain_error": statistics.median(errors) if errors else None,
        "gain_hits": f"{sum(hits)}/{len(hits)}",
        "median_run_to_run": statistics.median(spread) if spread else None,
    }


def _opening(text: str, limit: int = 320) -> str:
    """The explanation's first two sentences, on one line, cut at ``limit`` characters."""
    flat = " ".join(text.split())
    cut = flat.split(". ")
    out = ". ".join(cut[:2]) + ("." if len(cut) > 2 else "")
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


def render(outcomes: list[Outcome], summary: dict, obs) -> str:
    def pct(x):
        return "-" if x is None else f"{x:.0%}"

    lines = [
        "# Diagnosis accuracy",
        "",
        "Made by `python benchmarks/eval.py --write docs/accuracy.md` on the recorded scenario zoo "
        "(`benchmarks/scenarios/`, CPU runs with torch 2.13.0; each label.json says how and where it was recorded).",
        "",
        "| metric | value | target |",
        "|---|---|---|",
        f"| scenarios scored | {summary['scenarios']} | |",
        f"| top-1 (case id or cause) | {pct(summary['top1'])} | >= 90% |",
        f"| top-3 | {pct(summary['top3'])} | |",
        f"| high-severity findings on fixed twins and the healthy control | {summary.get('high_on_twins', summary['false_alarms'])} | |",
        f"| of which the injected cause, still measured after the fix | {summary.get('false_alarms_same_cause', 0)} | |",
        f"| checked by timing their own fix on the twin | {summary.get('false_alarms_checked', 0)}, "
        f"of which gained >= {CONFIRMED:.1f}x (real problems the twin has) {summary.get('false_alarms_checked_real', 0)} | |",
        f"| high-severity false alarms (the others) | {summary['false_alarms']} | 0 |",
        f"| median gain error (midpoint vs measured speedup) | {pct(summary['median_gain_error'])} | <= 25% |",
        f"| measured speedup inside the predicted range | {summary['gain_hits']} | |",
        f"| run to run: the fix's speedup in the recorded runs against the timed one (median difference) "
        f"| {pct(summary.get('median_run_to_run'))} | |",
        "",
        "## Per scenario",
        "",
        "*measured*: the fix's speedup timed without the profiler (3 alternating rounds x 12 steps, best round "
        "mean; per sample for small_batch). *recorded runs*: the same ratio over the unprofiled monitored steps of "
        "the two recorded runs hermes analysed; not scored, it shows how much two runs of the same code differ here.",
        "",
        "| scenario | label (category / cause) | expected | hermes first | top-1 | top-3 | predicted speedup | measured | error "
        "| recorded runs | false alarms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        first = o.first[0] if o.first else None
        said = f"{first['case_id']} ({first['cause']}, {first['severity']})" if first else "-"
        pred = f"{o.predicted[0]:.2f}-{o.predicted[1]:.2f}x" if o.predicted else "-"
        meas = f"{o.measured:.2f}x" if o.measured else "-"
        rec = f"{o.recorded:.2f}x" if o.recorded and not o.label.get("healthy") else "-"
        lines.append(
            f"| {o.name} | {o.label.get('category')} / {o.label.get('cause')} | {', '.join(o.label.get('expected_cases', [])) or '-'} "
            f"| {said} | {'yes' if o.top1 else 'no'} | {'yes' if o.top3 else 'no'} | {pred} | {meas} | {pct(o.gain_error)} "
            f"| {rec} | {', '.join(o.fixed_high) or 'none'} |"
        )
    checked = [(o.name, c) for o in outcomes for c in o.checked]
    if checked:
        lines += ["", "## Findings on fixed twins, checked by timing their fix", "",
                  "`benchmarks/scenarios/verify_secondary.py` applied the finding's own fix to the twin and timed both "
                  "(secondary.json). A finding whose fix gained at least "
                  f"{CONFIRMED:.1f}x found a problem the twin really has and is not counted as a false alarm; "
                  "the others are.", "",
                  "| scenario | finding | change | predicted | measured | in range |", "|---|---|---|---|---|---|"]  # fmt: skip
        for name, c in checked:
            lines.append(f"| {name} ({c['variant']}) | {c['case_id']} | {c['change']} | {c['predicted'][0]:.2f}-{c['predicted'][1]:.2f}x "
                         f"| {c['measured']:.2f}x | {'yes' if c['in_range'] else 'no'} |")  # fmt: skip
    lines += ["", "## What hermes said first, and why", "",
              "The first three findings on each bad variant; the first one with the opening of its explanation "
              "(the evidence it was measured from).", ""]  # fmt: skip
    for o in outcomes:
        if o.label.get("healthy"):
            lines.append(f"- **{o.name}**: healthy control")
            continue
        said = "; ".join(f"{f['case_id']} {f['cause']} ({f['severity']}, {f['expected_speedup']['low']:.2f}-"
                         f"{f['expected_speedup']['high']:.2f}x)" for f in o.first)  # fmt: skip
        lines.append(f"- **{o.name}**: {said or 'no finding on the bad variant'}")
        if o.first:
            f = o.first[0]
            lines.append(f"  - {f['case_id']}, {f['time_at_stake_us'] / 1e3:,.1f} ms removable "
                         f"({f['share_of_step_ratio']:.0%} of the analysed steps): {_opening(f['explanation'])}")  # fmt: skip
    notes = ROOT / "benchmarks/accuracy_notes.md"
    if notes.is_file():
        lines += ["", notes.read_text().strip()]
    if obs:
        lines += ["", "## Shared traces (observed labels, not counted)", "",
                  "| trace | observed | hermes first three |", "|---|---|---|"]  # fmt: skip
        for rel, cat, what, first in obs:
            lines.append(f"| {rel} | {cat}: {what} | {'; '.join(first) or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", default=None, help="write the Markdown report here")
    ap.add_argument("--check", action="store_true", help="exit 1 when below the committed baseline")
    ap.add_argument("--update-baseline", action="store_true")
    ap.add_argument("--no-shared", action="store_true")
    args = ap.parse_args()
    dirs = sorted(p.parent for p in RECORDED.glob("*/label.json"))
    if not dirs:
        print("no recorded scenarios under", RECORDED)
        return 1
    outcomes = [score_scenario(d) for d in dirs]
    summary = summarize(outcomes)
    obs = [] if args.no_shared else observed()
    text = render(outcomes, summary, obs)
    if args.write:
        Path(args.write).write_text(text)
    print(json.dumps(summary, indent=1))
    if args.update_baseline:
        BASELINE.write_text(json.dumps(summary, indent=1) + "\n")
    if args.check:
        failed = check(summary, json.loads(BASELINE.read_text()))
        if failed:
            print("accuracy check failed: " + "; ".join(failed))
            return 1
    return 0


def check(summary: dict, base: dict) -> list[str]:
    """What falls short: a target the committed recordings meet must stay met; where one is not
    met yet (the gain error), the committed baseline must not get worse; top-3 never below it."""
    out = []
    if summary["top1"] < TARGETS["top1"] - 1e-9:
        out.append(f"top-1 {summary['top1']:.0%} < target {TARGETS['top1']:.0%}")
    if summary["top3"] < base["top3"] - 1e-9:
        out.append(f"top-3 {summary['top3']:.0%} < baseline {base['top3']:.0%}")
    if summary["false_alarms"] > TARGETS["false_alarms"]:
        out.append(f"{summary['false_alarms']} high-severity false alarms > target {TARGETS['false_alarms']}")
    err, base_err = summary.get("median_gain_error"), base.get("median_gain_error")
    allowed = max(TARGETS["median_gain_error"], base_err or 0.0)
    if err is not None and err > allowed + 1e-6:
        out.append(f"median gain error {err:.1%} > {allowed:.1%} (target {TARGETS['median_gain_error']:.0%}, "
                   f"baseline {base_err:.1%})")  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
