"""The HTML report (``hermes advise --format html``): one self-contained page, no script, no
network (a Content-Security-Policy says so to the browser too), charts as inline SVG
(render/svg.py). Every string from the report is cleaned of control characters and
HTML-escaped by jinja2's autoescape; chart labels are escaped by render/svg.py."""

from __future__ import annotations

import re
from pathlib import PurePath

import jinja2
from markupsafe import Markup

from ..advisor.report import Report
from ..core.sanitize import clean_model
from . import svg
from .report import (PHASE_NAMES, TEMPLATES, WORDS, MIN_SPEEDUP, breakdown_rows, confidence_text, coverage_text, phase_rows, slowest_row,
                     shown_findings, worth_little)

MAX_HTML_RANKS = 64  # breakdown bars
MAX_SERIES_RANKS = 8  # lines in the step-time chart
MAX_PATH_RANKS = 8


def _pct(v) -> str:
    return f"{svg.num(v):.0%}"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def env() -> jinja2.Environment:
    e = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    e.filters.update(ms=svg.ms, pct=_pct, num=_num, f1=lambda v: f"{svg.num(v):,.1f}", f2=lambda v: f"{svg.num(v):,.2f}",
                     basename=lambda p: PurePath(str(p)).name or str(p),
                     is_url=lambda s: bool(re.fullmatch(r"https?://[^\s<>\"'`\\]+", str(s))),
                     confidence=confidence_text, covered=coverage_text, slowest=slowest_row)  # fmt: skip
    e.globals.update(bar=svg.hbar)
    return e


def _series_ranks(report: Report) -> list:
    """The ranks drawn in the step-time chart: all up to MAX_SERIES_RANKS, else the slowest and
    the fastest by mean step."""
    have = [s for s in report.summary if s.series]
    if len(have) <= MAX_SERIES_RANKS:
        return have
    have.sort(key=lambda s: -(s.mean_step_us or 0.0))
    keep = have[: MAX_SERIES_RANKS // 2] + have[-MAX_SERIES_RANKS // 2 :]
    return sorted(keep, key=lambda s: s.rank)


def one_step_note(report: Report, rows: list[dict]) -> str | None:
    """What the step-time section says instead of a chart when every rank with step times has a
    single profiled step: a chart over the run would be one dot per rank. The step's time per
    rank (the breakdown's mean step, which is that step), and where its parts are drawn."""
    have = [s for s in report.summary if s.series]
    if not have or any(len(s.series) > 1 for s in have):
        return None
    steps = sorted({s.series[0].step for s in have})
    which = f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(str(x) for x in steps[:4]) + (
        ", …" if len(steps) > 4 else "")  # fmt: skip
    times = sorted((svg.num(s.series[0].duration_us), s.rank) for s in have)
    if len(times) == 1:
        said = f"One profiled step ({which}, {svg.ms(times[0][0])})"
    else:
        (lo, lo_rank), (hi, hi_rank) = times[0], times[-1]
        said = (f"One profiled step per rank ({which}): {svg.ms(lo)} on rank {lo_rank} to {svg.ms(hi)} on rank "
                f"{hi_rank} across {len(times)} ranks")  # fmt: skip
    parts = (" Its parts are the bar" + ("s" if len(rows) > 1 else "") + " of the step breakdown above."
             if rows else "")  # fmt: skip
    return (f"{said}: no step time over the run to draw; step-to-step variation and spikes need several steps. "
            f"{parts.strip()} Profile at least 3 active steps (torch.profiler.schedule(wait=1, warmup=1, active=3)).")


def render_html(report: Report) -> str:
    r = clean_model(report)
    rows = breakdown_rows(r, MAX_HTML_RANKS)
    prows = phase_rows(r, MAX_HTML_RANKS)
    shown, hidden = shown_findings(r)
    drawn = _series_ranks(r)
    spikes = sorted(((s.rank, p) for s in r.summary for p in s.series if p.spike),
                    key=lambda rp: -(rp[1].excess_us or rp[1].duration_us))  # fmt: skip
    monitor = any(s.steps_count is not None for s in r.summary)
    causes = sorted({p.spike for _, p in spikes})
    series_note = ("Every step of the monitored run after warm-up (at most 2,000 points per rank: the longest step of "
                   "each bucket), per rank; circled: spikes above the rolling median, coloured by cause."
                   if monitor else "The profiled steps, per rank; circled: steps the fluctuation analysis found "
                   "above their rolling threshold.")  # fmt: skip
    if len(drawn) < len([s for s in r.summary if s.series]):
        series_note += f" {len(drawn)} ranks drawn: the slowest and the fastest."
    path_ranks = [s for s in r.summary if s.critical_path_ops]
    one_step = one_step_note(r, rows)
    ctx = {
        "report": r,
        "title": ", ".join(PurePath(s).name for s in r.inputs.sources[:3]) or "report",
        "rows": rows,
        "components": svg.COMPONENTS,
        "words": WORDS,
        "ranks_left_out": max(0, len([s for s in r.summary if s.breakdown_us]) - MAX_HTML_RANKS),
        "breakdown_chart": svg.breakdown_chart(rows) if rows else Markup(""),
        "breakdown_legend": svg.legend([(n, c) for _, n, c in svg.COMPONENTS] + [("holds the step (outlined)", "#000")]),
        "phase_rows": prows,
        "phases": svg.PHASES,
        "phase_names": PHASE_NAMES,
        "phase_chart": svg.breakdown_chart(prows, components=svg.PHASES, held="largest:",
                                           title="program phases per rank") if prows else Markup(""),  # fmt: skip
        "phase_legend": svg.legend([(n, c) for _, n, c in svg.PHASES] + [("the largest (outlined)", "#000")]),
        "one_step": one_step,
        "step_chart": svg.step_chart([(s.rank, s.series) for s in drawn]) if drawn and not one_step else None,
        "step_legend": svg.legend([(f"rank {s.rank}", svg.RANK_COLORS[i % len(svg.RANK_COLORS)]) for i, s in enumerate(drawn)]
                                  + [(svg.spike_label(c), svg.SPIKE_COLORS.get(c, "#333")) for c in causes]),  # fmt: skip
        "series_note": series_note,
        "spikes": spikes,
        "path_ranks": path_ranks[:MAX_PATH_RANKS],
        "path_left_out": max(0, len(path_ranks) - MAX_PATH_RANKS),
        "findings": [(f, svg.gain_chart(f.step_time_us, f.removable_us.low if f.removable_us else 0.0,
                                        f.removable_us.high if f.removable_us else 0.0,
                                        f.expected_speedup.low, f.expected_speedup.high)) for f in shown],  # fmt: skip
        "hidden": hidden,
        "worth_little": worth_little(r),
        "min_speedup": MIN_SPEEDUP,
        "combined_chart": svg.gain_chart(r.combined.step_time_us, r.combined.removable_us.low, r.combined.removable_us.high,
                                         r.combined.expected_speedup.low, r.combined.expected_speedup.high)
        if r.combined else Markup(""),
    }  # fmt: skip
    return env().get_template("report.html.j2").render(**ctx)


__all__ = ["one_step_note", "render_html"]
