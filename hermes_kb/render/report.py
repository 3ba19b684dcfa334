"""Render a Report through the jinja2 templates in hermes_kb/templates (or as JSON).

Every string of the report is cleaned of control characters first (hermes_kb/core/sanitize.py), then
escaped for the output's own syntax: rich markup for the terminal, Markdown (no trace text can
open HTML, close a code span or end a fenced block) for ``md``, HTML for ``html``
(render/html.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
from rich.console import Group, RenderableType
from rich.markup import escape as rich_escape
from rich.text import Text

from ..advisor.report import Finding, Report
from ..core.sanitize import clean, clean_line, clean_model, json_terminal_safe
from ..facts.breakdown import HOST_PARTS

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
# what GFM turns into a link without any markup: a scheme's colon, "www."'s dot, an e-mail's @
_MD_AUTOLINK = re.compile(r"(?i)(\b(?:https?|ftp|mailto))(:)|(\bwww)(\.)|()(@)")


def _md(text) -> str:
    """Escape text that came from a trace for Markdown, inline: one line (a newline, which could
    end a paragraph or a table row, becomes a space), every character that opens emphasis, code,
    links, HTML, strikethrough or a table cell backslash-escaped, and the characters GFM's
    autolinks start from (``https:``, ``www.``, ``a@b``) too: a name in a trace is never a link."""
    s = _MD_SPECIAL.sub(r"\\\1", clean_line(text).strip())
    return _MD_AUTOLINK.sub(lambda m: "".join(f"{a}\\{b}" for a, b in zip(m.groups()[::2], m.groups()[1::2]) if b), s)


def _code(text) -> str:
    """Text for inside a Markdown code span: one line, no backtick (a backtick would close the
    span, a blank line would end it; inside the span the rest is shown literally)."""
    s = clean_line(text).replace("`", "'")
    return s.strip() or "-"


def _cell(text) -> str:
    """A code span inside a Markdown table cell: as ``_code``, with ``|`` escaped (GFM tables
    split cells at a bare pipe, even inside a code span)."""
    return _code(text).replace("|", "\\|")


def _fence(text) -> str:
    """A fence longer than any run of backticks in ``text``, so the block cannot be closed early."""
    runs = [len(m) for m in re.findall(r"`+", str(text))]
    return "`" * max(3, max(runs, default=0) + 1)


def _url(text) -> str:
    """A reference as a Markdown autolink when it is a plain http(s) URL, else escaped text."""
    s = clean_line(text).strip()
    if re.fullmatch(r"https?://[^\s<>`\\]+", s):
        return f"<{s}>"
    return _md(s)


def _ms(v) -> str:
    return "-" if v is None else f"{float(v) / 1e3:,.2f} ms"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return _md(v)


def _term_num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return _t(v)


def _t(text) -> str:
    """Text for rich markup: control characters made visible, markup brackets escaped."""
    return rich_escape(clean(str(text)).strip())


def _label(key: str) -> str:
    return key.removesuffix("_us").replace("_", " ")


_COLORS = {"high": "red", "medium": "yellow", "low": "cyan"}


def _bar(share: float, width: int = 20) -> str:
    n = int(round(max(0.0, min(1.0, float(share))) * width))
    return "█" * n + "·" * (width - n)


def template_env(terminal: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(md=_md, code=_code, cell=_cell, fence=_fence, url=_url, ms=_ms, num=_term_num if terminal else _num,
                       label=_label, t=_t, tcode=lambda s: rich_escape(clean_line(s).rstrip()), lines=lambda s: str(s).strip("\n").split("\n"),
                       color=lambda s: _COLORS.get(s, "white"), pct=lambda v: f"{float(v):.0%}",
                       f1=lambda v: f"{float(v):,.1f}", bar=_bar, confidence=confidence_text, covered=coverage_text,
                       slowest=slowest_row)  # fmt: skip
    return env


def slowest_row(rows: list[dict], job=None) -> dict:
    """The rank that sets the job's pace, so that the headline names what holds the step there:
    with the ranks joined at their collectives (``job``), the one with the longest step had it
    never waited for a peer; else the one whose mean step is longest (ties: the lowest rank)."""
    if job is not None:
        row = next((r for r in rows if r["rank"] == job.slowest_rank), None)
        if row is not None:
            return row
    return max(rows, key=lambda r: (r["mean_ms"], -r["rank"]))


def confidence_text(f) -> str:
    """A finding's confidence as the measured hit rate it is, or that it was never measured."""
    if f.confidence is None:
        return "confidence not yet measured"
    return f"confidence {f.confidence:.0%} (its range held on {round(f.confidence * f.confidence_runs)} of {f.confidence_runs} zoo run(s))"


def coverage_text(sp) -> str:
    """' (most likely 1.30x, 80% range)' for a calibrated range, '' for the model's own."""
    if not sp.coverage:
        return ""
    point = f"most likely {sp.point:.2f}x, " if sp.point else ""
    return f" ({point}{sp.coverage:.0%} range)"


# findings whose best case is below this speedup are left out of the terminal and Markdown
# reports (they stay in JSON): within the noise of a real job's step time
from ..advisor.findings import MIN_REPORTED_SPEEDUP as MIN_SPEEDUP  # noqa: E402
MAX_RANK_ROWS = 16
_TOP = ("compute", "communication", "host", "data", "idle")
_HOST = HOST_PARTS
WORDS = {
    "compute": "the device's computation",
    "communication": "exposed communication (collectives nothing hides)",
    "host": "the host (launches, operator dispatch, Python between operators)",
    "data": "waiting for the DataLoader",
    "idle": "idle time nothing traced explains",
}


def breakdown_rows(report: Report, max_rows: int | None = MAX_RANK_ROWS) -> list[dict]:
    """Per rank: the five components' mean ms and shares, the host's three parts, what holds the
    step (at most ``max_rows`` ranks: the slowest, then the fastest)."""
    rows = []
    for s in report.summary:
        b = s.breakdown_us or {}
        if not b or not s.mean_step_us:
            continue
        ms = {k: float(b.get(f"{k}_us", 0.0)) / 1e3 for k in ("compute", "communication", "data", "idle", *_HOST)}
        ms["host"] = sum(ms[k] for k in _HOST)
        total = s.mean_step_us / 1e3
        rows.append({"rank": s.rank, "device": s.device, "kind": s.device_kind, "mean_ms": total,
                     "steps": s.steps_count if s.steps_count is not None else len(s.steps),
                     "ms": ms, "share": {k: (ms[k] / total if total > 0 else 0.0) for k in ms},
                     "critical": s.critical_component, "critical_ratio": s.critical_ratio or 0.0})  # fmt: skip
    if max_rows is not None and len(rows) > max_rows:
        rows.sort(key=lambda r: -r["mean_ms"])
        rows = rows[: max_rows // 2] + rows[-max_rows // 2 :]
        rows.sort(key=lambda r: r["rank"])
    return rows


PHASES = ("data", "forward", "backward", "optimizer", "communication", "user_code", "other")
PHASE_WORDS = {"data": "waiting for data", "forward": "forward", "backward": "backward", "optimizer": "the optimizer",
               "communication": "collectives the program issues", "user_code": "the user's code outside those",
               "other": "nothing traced"}  # fmt: skip
PHASE_NAMES = {"data": "data", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
               "communication": "collectives", "user_code": "your code", "other": "untraced"}  # fmt: skip


def phase_rows(report: Report, max_rows: int | None = MAX_RANK_ROWS) -> list[dict]:
    """Per rank: the program phases' mean ms and shares, the largest, the user function named
    (the same ranks as ``breakdown_rows``: the slowest, then the fastest)."""
    rows = []
    for s in report.summary:
        p = s.phases_us or {}
        total = sum(float(v) for v in p.values()) / 1e3
        if not p or total <= 0:
            continue
        ms = {k: float(p.get(f"{k}_us", 0.0)) / 1e3 for k in PHASES}
        largest = max(PHASES, key=lambda k: ms[k])
        rows.append({"rank": s.rank, "device": s.device, "kind": s.device_kind, "mean_ms": total, "ms": ms,
                     "share": {k: ms[k] / total for k in ms}, "critical": largest, "critical_ratio": ms[largest] / total,
                     "site": s.program_site, "site_ms": (s.program_site_us or 0.0) / 1e3,
                     "site_share": s.program_site_ratio or 0.0, "sources": s.phases_sources,
                     "steps": s.steps_count if s.steps_count is not None else len(s.steps)})  # fmt: skip
    if max_rows is not None and len(rows) > max_rows:
        rows.sort(key=lambda r: -r["mean_ms"])
        rows = rows[: max_rows // 2] + rows[-max_rows // 2 :]
        rows.sort(key=lambda r: r["rank"])
    return rows


def shown_findings(report: Report) -> tuple[list, int]:
    shown = [f for f in report.findings if f.expected_speedup.high >= MIN_SPEEDUP or f.profile_only]
    return shown, len(report.findings) - len(shown)


VISIBLE_SHARE = 0.2  # a finding left out while this much of the step is at stake says why it is worth so little
_BOUND_RE = re.compile(r"Bound: [^.]*(?:\.\d[^.]*)*\.")


def worth_little(report: Report) -> list[tuple[Finding, str, str]]:
    """The findings left out (under MIN_SPEEDUP) although their time at stake, or their breakdown
    component on their ranks, is at least VISIBLE_SHARE of the step: each with what is at stake
    and why its fix is rated so low (the bound the gain hit, the CPU budget, the critical path,
    or that the cause is a small part of a large component)."""
    shares = {r["rank"]: r["share"] for r in breakdown_rows(report, None)}
    out = []
    for f in report.findings:
        if f.expected_speedup.high >= MIN_SPEEDUP or f.profile_only:
            continue
        own = f.share_of_step_ratio
        comp = max((shares.get(r, {}).get(f.component or "", 0.0) for r in f.ranks), default=0.0)
        if own < VISIBLE_SHARE and comp < VISIBLE_SHARE:
            continue
        if own >= VISIBLE_SHARE:
            stake = f"{own * 100:.0f}% of the step is at stake"
        else:
            stake = f"{f.component} holds {comp * 100:.0f}% of the step and this cause {own * 100:.0f}% of it"
        m = _BOUND_RE.search(f.assumption)
        if m:
            why = m.group(0)
            if "core_bound_us" in why:  # the monitor's CPU budget: process and workers already fill the cores
                why = "the job's CPU work already fills its cores, so the step cannot get shorter. " + why
        elif "Replayed" in f.assumption:
            why = "the replay of the rank's dependency graph finds little of this time on the critical path"
        elif own < VISIBLE_SHARE:
            why = (f"the time this cause accounts for is {own * 100:.0f}% of the step; the rest of the {f.component} "
                   "time is not what its fix removes")  # fmt: skip
        else:
            why = "see its assumption in the JSON report"
        out.append((f, stake, why))
    return out


def _context(report: Report) -> dict:
    shown, hidden = shown_findings(report)
    return {"report": report, "rows": breakdown_rows(report), "phase_rows": phase_rows(report), "phases": PHASES,
            "phase_names": PHASE_NAMES, "phase_words": PHASE_WORDS, "findings": shown, "hidden": hidden,
            "worth_little": worth_little(report),
            "top": _TOP, "words": WORDS, "min_speedup": MIN_SPEEDUP,
            "ranks_left_out": max(0, len([s for s in report.summary if s.breakdown_us]) - MAX_RANK_ROWS)}  # fmt: skip


def render_markdown(report: Report) -> str:
    return template_env(False).get_template("report.md.j2").render(**_context(clean_model(report)))


def render_terminal_markup(report: Report) -> str:
    """The terminal report as rich markup, one line per line (``render_terminal`` wraps it)."""
    return template_env(True).get_template("report.term.j2").render(**_context(clean_model(report)))


_BULLET = re.compile(r"^( *)((?:→|·|•|-|│|\d+\.|warning:) )?")


class _Hanging:
    """One line of the terminal report: wrapped to the console's width, its continuation lines
    indented under the text after the line's indent and bullet (no trailing padding)."""

    def __init__(self, lead: str, body: Text):
        self.lead, self.body = lead, body

    def __rich_console__(self, console, options):
        hang = len(self.lead)
        width = max(20, options.max_width - hang)
        for i, line in enumerate(self.body.wrap(console, width, overflow="fold")):
            line.rstrip()
            yield Text.assemble(self.lead if i == 0 else " " * hang, line)


def indented(markup: str) -> RenderableType:
    """Rich markup lines as renderables whose wrapped continuation lines keep the line's indent
    (and hang after a leading bullet: ``→ ``, ``· ``, ``│ ``, ``1. ``)."""
    parts: list[RenderableType] = []
    for line in markup.rstrip("\n").split("\n"):
        m = _BULLET.match(line)
        parts.append(_Hanging(m.group(0), Text.from_markup(line[m.end():])))
    return Group(*parts)


def render_terminal(report: Report) -> RenderableType:
    """The terminal report as a rich renderable (wrapped lines keep their indent)."""
    return indented(render_terminal_markup(report))


def render_json(report: Report) -> str:
    """The report as JSON: every value as measured (nothing cleaned), with the characters a
    terminal could act on written as \\u escapes (the same JSON value)."""
    return json_terminal_safe(json.dumps(report.model_dump(mode="json"), indent=2, ensure_ascii=False))
