"""Render a DiffResult (hermes_kb/tools/diff.py): terminal, Markdown, HTML, JSON. The same escaping as
the report: control characters cleaned from every string, then rich markup / Markdown / HTML
escaping (render/report.py, render/html.py)."""

from __future__ import annotations

import json
from pathlib import PurePath

from markupsafe import Markup

from ..tools.diff import DiffResult
from ..core.sanitize import clean_model, json_terminal_safe
from . import svg
from .report import template_env, indented

_NAMES = {"compute": "compute", "communication": "exposed communication", "host": "host", "data": "data wait",
          "idle": "idle", "host_launch": "  launch", "host_dispatch": "  dispatch", "host_python": "  Python"}  # fmt: skip
# a Markdown or HTML cell loses its leading spaces: there the host's parts say whose parts they are
_CELL_NAMES = {**_NAMES, **{k: f"host: {v.strip()}" for k, v in _NAMES.items() if k.startswith("host_")}}


def _signed_ms(us) -> str:
    v = svg.num(us) / 1e3
    return f"{v:+,.2f} ms"


def _components(d: DiffResult) -> list:
    """The step's components in reading order: the host's parts right under the host (the JSON
    lists them after the five components)."""
    parts = [c for c in d.components if c.component.startswith("host_")]
    out = []
    for c in d.components:
        if c.component.startswith("host_"):
            continue
        out.append(c)
        if c.component == "host":
            out += parts
    return out if any(c.component == "host" for c in d.components) else list(d.components)


def _ctx(d: DiffResult, names: dict = _NAMES) -> dict:
    resolved = [f for f in d.findings if f.status == "resolved"]
    # several findings resolved by one change: the measured speedup is their joint effect, no test
    # of any one finding's range (tools/diff.py says so in the verdict): no ✓ or ✗ is drawn
    joint = len([f for f in resolved if f.measured_speedup is not None]) > 1
    return {"d": d, "names": names, "components": _components(d), "resolved": resolved, "joint": joint,
            "new": [f for f in d.findings if f.status == "new"],
            "unchanged": [f for f in d.findings if f.status == "unchanged"]}  # fmt: skip


def _filters(env):
    env.filters.update(sms=_signed_ms, basename=lambda p: PurePath(str(p)).name or str(p),
                       x2=lambda v: "-" if v is None else f"{svg.num(v):.2f}x")  # fmt: skip
    return env


def render_diff_markdown(d: DiffResult) -> str:
    return _filters(template_env(False)).get_template("diff.md.j2").render(**_ctx(clean_model(d), _CELL_NAMES))


def render_diff_terminal_markup(d: DiffResult) -> str:
    return _filters(template_env(True)).get_template("diff.term.j2").render(**_ctx(clean_model(d)))


def render_diff_terminal(d: DiffResult):
    return indented(render_diff_terminal_markup(d))


def render_diff_json(d: DiffResult) -> str:
    return json_terminal_safe(json.dumps(d.model_dump(mode="json"), indent=2, ensure_ascii=False)) + "\n"


def _component_chart(d: DiffResult, width: int = 860) -> Markup:
    """Per component of the mean step: before and after as paired bars."""
    from markupsafe import escape

    comps = [c for c in d.components if not c.component.startswith("host_")]
    if not comps:
        return Markup("")
    label_w, row_h, bar_h, top = 170, 34, 12, 6
    plot_w = width - label_w - 170
    longest = max(max(svg.num(c.before_us), svg.num(c.after_us)) for c in comps) or 1.0
    body = []
    for i, c in enumerate(comps):
        y = top + i * row_h
        body.append(f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">{escape(_NAMES.get(c.component, c.component))}</text>')
        for j, (v, color, what) in enumerate(((c.before_us, "#9fb3c8", "before"), (c.after_us, "#4e79a7", "after"))):
            w = plot_w * svg.num(v) / longest
            body.append(f'<rect class="{what}" x="{label_w}" y="{y + j * (bar_h + 2)}" width="{svg.f(w, 2)}" height="{bar_h}" '
                        f'fill="{color}"><title>{escape(f"{what}: {svg.ms(v)}")}</title></rect>')  # fmt: skip
        delta = svg.num(c.delta_us)
        cls = "pos" if delta > 0 else "neg"
        body.append(f'<text class="{cls}" x="{label_w + plot_w + 8}" y="{y + 17}" fill="{"#b03a2e" if delta > 0 else "#1e7b34"}">'
                    f'{escape(_signed_ms(delta))}</text>')  # fmt: skip
    height = top + len(comps) * row_h + 4
    return svg._svg(width, height, body, "step components before and after")


def render_diff_html(d: DiffResult) -> str:
    from .html import env

    r = clean_model(d)
    e = env()
    e.filters.update(sms=_signed_ms, x2=lambda v: "-" if v is None else f"{svg.num(v):.2f}x")
    rows = []
    for rk in r.ranks:
        if rk.before_step_us and rk.after_step_us:
            rows.append(rk)
    return e.get_template("diff.html.j2").render(
        **_ctx(r, _CELL_NAMES), chart=_component_chart(r), legend=svg.legend([("before", "#9fb3c8"), ("after", "#4e79a7")]),
        title=f"{PurePath(r.before.sources[0]).name if r.before.sources else 'before'} → "
              f"{PurePath(r.after.sources[0]).name if r.after.sources else 'after'}")  # fmt: skip


__all__ = ["render_diff_html", "render_diff_json", "render_diff_markdown", "render_diff_terminal",
           "render_diff_terminal_markup"]
