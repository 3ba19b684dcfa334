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
                       color=lambda s: _COLORS.get(s, "white"))  # fmt: skip
    return env


def _breakdown_keys(report: Report) -> list[str]:
    keys: list[str] = []
    for s in report.summary:
        for k in s.breakdown_us:
            if k not in keys:
                keys.append(k)
    return keys[:8]


def render_markdown(report: Report) -> str:
    return _env(False).get_template("report.md.j2").render(report=report, breakdown_keys=_breakdown_keys(report))


def render_terminal_markup(report: Report) -> str:
    return _env(True).get_template("report.term.j2").render(report=report, breakdown_keys=_breakdown_keys(report))


def render_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, ensure_ascii=False)
