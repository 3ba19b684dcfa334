"""Render a Report through the jinja2 templates in hermes_kb/templates (or as JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from rich.markup import escape as rich_escape

from ..report import Report

_TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


def _md(text) -> str:
    """Escape text that came from a trace for Markdown (tables, emphasis, HTML)."""
    s = str(text)
    for ch in ("\\", "|", "*", "_", "`", "[", "]", "<", ">"):
        s = s.replace(ch, "\\" + ch)
    return s


def _code(text) -> str:
    return str(text).replace("`", "'")


def _ms(v) -> str:
    return "-" if v is None else f"{float(v) / 1e3:,.2f} ms"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return _md(v)


def _label(key: str) -> str:
    return key.removesuffix("_us").replace("_", " ")


_COLORS = {"high": "red", "medium": "yellow", "low": "cyan"}


def _bar(share: float, width: int = 20) -> str:
    n = int(round(max(0.0, min(1.0, float(share))) * width))
    return "█" * n + "·" * (width - n)


def _env(terminal: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(md=_md, code=_code, ms=_ms, num=_num, label=_label, t=lambda s: rich_escape(str(s)),
                       color=lambda s: _COLORS.get(s, "white"), pct=lambda v: f"{float(v):.0%}",
                       f1=lambda v: f"{float(v):,.1f}", bar=_bar)  # fmt: skip
    return env


# findings whose best case is below this speedup are left out of the terminal and Markdown
# reports (they stay in JSON): within the noise of a real job's step time
from ..advisor import MIN_REPORTED_SPEEDUP as MIN_SPEEDUP  # noqa: E402
MAX_RANK_ROWS = 16
_TOP = ("compute", "communication", "host", "data", "idle")
_HOST = ("host_launch", "host_dispatch", "host_python")
_WORDS = {
    "compute": "the device's computation",
    "communication": "exposed communication (collectives nothing hides)",
    "host": "the host (launches, operator dispatch, Python between operators)",
    "data": "waiting for the DataLoader",
    "idle": "idle time nothing traced explains",
}


def breakdown_rows(report: Report) -> list[dict]:
    """Per rank: the five components' mean ms and shares, the host's three parts, what holds the
    step (at most MAX_RANK_ROWS ranks: the slowest, then the fastest)."""
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
    if len(rows) > MAX_RANK_ROWS:
        rows.sort(key=lambda r: -r["mean_ms"])
        rows = rows[: MAX_RANK_ROWS // 2] + rows[-MAX_RANK_ROWS // 2 :]
        rows.sort(key=lambda r: r["rank"])
    return rows


def shown_findings(report: Report) -> tuple[list, int]:
    shown = [f for f in report.findings if f.expected_speedup.high >= MIN_SPEEDUP]
    return shown, len(report.findings) - len(shown)


def _context(report: Report) -> dict:
    shown, hidden = shown_findings(report)
    return {"report": report, "rows": breakdown_rows(report), "findings": shown, "hidden": hidden,
            "top": _TOP, "words": _WORDS, "min_speedup": MIN_SPEEDUP,
            "ranks_left_out": max(0, len([s for s in report.summary if s.breakdown_us]) - MAX_RANK_ROWS)}  # fmt: skip


def render_markdown(report: Report) -> str:
    return _env(False).get_template("report.md.j2").render(**_context(report))


def render_terminal_markup(report: Report) -> str:
    return _env(True).get_template("report.term.j2").render(**_context(report))


def render_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, ensure_ascii=False)
