"""Charts as inline SVG, drawn by hand so that the HTML report needs no script and no network.

Every text that goes into a chart is escaped here (markupsafe.escape); every number is checked
to be finite. The functions return ``Markup`` ready to be placed in a jinja2 template with
autoescape on."""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

# the seven components of summary[].breakdown_us, in stacking order, with their colours
COMPONENTS = (
    ("compute", "compute", "#4e79a7"),
    ("communication", "exposed communication", "#f28e2b"),
    ("host_launch", "host: launch", "#e15759"),
    ("host_dispatch", "host: dispatch", "#ff9d9a"),
    ("host_python", "host: Python", "#b07aa1"),
    ("data", "data wait", "#59a14f"),
    ("idle", "idle", "#bab0ac"),
)
CRITICAL_PARTS = {"host": ("host_launch", "host_dispatch", "host_python")}
PHASES = (
    ("data", "data", "#59a14f"),
    ("forward", "forward", "#4e79a7"),
    ("backward", "backward", "#76b7b2"),
    ("optimizer", "optimizer", "#edc948"),
    ("communication", "collectives", "#f28e2b"),
    ("user_code", "your code", "#e15759"),
    ("other", "untraced", "#bab0ac"),
)
RANK_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
               "#bab0ac")  # fmt: skip
SPIKE_COLORS = {"gc": "#b07aa1", "checkpoint": "#e15759", "marked_event": "#edc948", "data_wait": "#59a14f",
                "unexplained": "#333333", "spike": "#e15759"}  # fmt: skip
FONT = "font-family:system-ui,sans-serif;font-size:11px"
# a trace's fluctuation analysis flags a step without a cause ("spike"); the monitor names one
_SPIKE_WORDS = {"spike": "spike (cause not measured)", "gc": "spike: GC", "checkpoint": "spike: checkpoint",
                "marked_event": "spike: marked event", "data_wait": "spike: data wait",
                "unexplained": "spike: unexplained"}  # fmt: skip


def spike_label(cause: str) -> str:
    return _SPIKE_WORDS.get(cause, f"spike: {cause}")


def num(v, default: float = 0.0) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default


def f(v, digits: int = 1) -> str:
    return f"{num(v):.{digits}f}"


def ms(us) -> str:
    v = num(us) / 1e3
    return f"{v:,.2f} ms" if abs(v) < 100 else f"{v:,.1f} ms"


def _svg(width: float, height: float, body: list[str], label: str, cls: str = "chart") -> Markup:
    return Markup(
        f'<svg class="{escape(cls)}" xmlns="http://www.w3.org/2000/svg" width="{f(width, 0)}" height="{f(height, 0)}" '
        f'viewBox="0 0 {f(width, 0)} {f(height, 0)}" role="img" aria-label="{escape(label)}" style="{FONT}">'
        + "".join(body) + "</svg>"
    )


def _text(x, y, s, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{f(x)}" y="{f(y)}" text-anchor="{anchor}" {extra}>{escape(s)}</text>'


def breakdown_chart(rows: Sequence[dict], width: int = 860, components: Sequence[tuple[str, str, str]] = COMPONENTS,
                    held: str = "held by", title: str = "step breakdown per rank") -> Markup:  # fmt: skip
    """Stacked horizontal bars, one per rank: the parts of the mean step (the seven components,
    or the program phases), the bar's length the rank's mean step; the part that holds the step
    outlined and named."""
    label_w, right_w, bar_h, gap, top = 200, 250, 18, 8, 8
    plot_w = width - label_w - right_w
    longest = max((num(r["mean_ms"]) for r in rows), default=0.0) or 1.0
    height = top + len(rows) * (bar_h + gap) + 24
    body: list[str] = []
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        dev = r.get("device") or r.get("kind") or ""
        short = dev if len(dev) <= 22 else dev[:21] + "…"
        body.append(_text(label_w - 8, y + bar_h - 5, f"rank {r['rank']}" + (f" · {short}" if dev else ""), "end"))
        x = float(label_w)
        crit = r.get("critical") or ""
        crit_parts = CRITICAL_PARTS.get(crit, (crit,))
        crit_x0 = crit_x1 = None
        for key, name, color in components:
            v = num(r["ms"].get(key, 0.0))
            w = plot_w * v / longest
            if w <= 0:
                continue
            share = num(r["share"].get(key, 0.0))
            tip = escape(f"rank {r['rank']}: {name} {v:,.2f} ms ({share:.0%})")
            body.append(f'<rect class="seg seg-{key}" x="{f(x, 2)}" y="{f(y)}" width="{f(w, 2)}" height="{bar_h}" '
                        f'fill="{color}"><title>{tip}</title></rect>')  # fmt: skip
            if key in crit_parts:
                crit_x0 = x if crit_x0 is None else crit_x0
                crit_x1 = x + w
            x += w
        if crit_x0 is not None:
            body.append(f'<rect class="critical" x="{f(crit_x0, 2)}" y="{f(y - 2)}" width="{f(crit_x1 - crit_x0, 2)}" '
                        f'height="{bar_h + 4}" fill="none" stroke="#000" stroke-width="2"/>')  # fmt: skip
        names = {k: n for k, n, _ in components}
        body.append(_text(x + 6, y + bar_h - 5, f"{num(r['mean_ms']):,.1f} ms · {held} {names.get(crit, crit)} "
                                                f"{num(r.get('critical_ratio')):.0%}"))  # fmt: skip
    axis_y = top + len(rows) * (bar_h + gap) + 4
    body.append(f'<line x1="{label_w}" y1="{f(axis_y)}" x2="{label_w + plot_w}" y2="{f(axis_y)}" stroke="#888"/>')
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        tx = label_w + plot_w * frac
        body.append(f'<line x1="{f(tx)}" y1="{f(axis_y)}" x2="{f(tx)}" y2="{f(axis_y + 4)}" stroke="#888"/>')
        body.append(_text(tx, axis_y + 15, f"{longest * frac:,.1f} ms", "middle", 'fill="#555"'))
    return _svg(width, height, body, title)


def legend(items: Sequence[tuple[str, str]]) -> Markup:
    return Markup("".join(f'<span class="key"><i style="background:{escape(c)}"></i>{escape(n)}</span>' for n, c in items))


def nice_ticks(top: float, n: int = 4) -> tuple[list[float], int]:
    """Round tick values from 0 to at least ``top`` (about ``n`` steps of 1, 2, 2.5 or 5 x 10^k,
    so an axis reads 0/20/40/60/80, not 0/19.97/39.9/...) and the decimals their labels need."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0], 0
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    m = next(m for m in (1, 2, 2.5, 5, 10) if m * mag >= raw - 1e-12)
    step = m * mag
    k = math.ceil(top / step - 1e-9)
    dec = next(d for d in range(8) if abs(round(step, d) - step) <= 1e-9 * step)
    return [round(i * step, dec) for i in range(k + 1)], dec


def step_chart(series: Sequence[tuple[int, Sequence]], width: int = 860, height: int = 240) -> Markup:
    """Step time over the run, one line per rank (rank, points), spikes marked by cause."""
    left, right, top, bottom = 60, 44, 10, 34
    pw, ph = width - left - right, height - top - bottom
    pts_all = [p for _, pts in series for p in pts]
    if not pts_all:
        return _svg(width, 40, [_text(10, 24, "no step times")], "step time over the run")
    lo_step = min(p.step for p in pts_all)
    hi_step = max(p.step for p in pts_all)
    span = max(hi_step - lo_step, 1)
    ticks, dec = nice_ticks(max(num(p.duration_us) for p in pts_all) / 1e3 * 1.04 or 1.0)
    top_ms = ticks[-1]

    def xy(p) -> tuple[float, float]:
        x = left + pw * ((p.step - lo_step) / span if hi_step > lo_step else 0.5)
        return x, top + ph * (1 - num(p.duration_us) / 1e3 / top_ms)

    body: list[str] = []
    for v in ticks:
        y = top + ph * (1 - v / top_ms)
        body.append(f'<line x1="{left}" y1="{f(y)}" x2="{left + pw}" y2="{f(y)}" stroke="#e4e4e4"/>')
        body.append(_text(left - 6, y + 4, f"{v:,.{dec}f}", "end", 'fill="#555"'))
    body.append(_text(14, top + ph / 2, "ms", "middle", 'fill="#555"'))
    for frac in (0, 0.5, 1.0):
        step = lo_step + span * frac if hi_step > lo_step else lo_step
        x = left + pw * (frac if hi_step > lo_step else 0.5)
        body.append(_text(x, height - bottom + 16, f"step {step:,.0f}", "middle", 'fill="#555"'))
    for i, (rank, pts) in enumerate(series):
        color = RANK_COLORS[i % len(RANK_COLORS)]
        coords = [xy(p) for p in pts]
        if len(coords) > 1:
            body.append(f'<polyline class="line" fill="none" stroke="{color}" stroke-width="1.5" points="'
                        + " ".join(f"{f(x)},{f(y)}" for x, y in coords) + f'"><title>rank {int(rank)}</title></polyline>')  # fmt: skip
        if len(coords) <= 60:
            for p, (x, y) in zip(pts, coords):
                body.append(f'<circle cx="{f(x)}" cy="{f(y)}" r="2.5" fill="{color}"><title>'
                            f'{escape(f"rank {rank}, step {p.step}: {ms(p.duration_us)}")}</title></circle>')  # fmt: skip
        for p, (x, y) in zip(pts, coords):
            if p.spike:
                c = SPIKE_COLORS.get(p.spike, "#333")
                why = f" ({p.spike}, +{ms(p.excess_us)} over the rolling median)" if p.excess_us else f" ({p.spike})"
                body.append(f'<circle class="spike" cx="{f(x)}" cy="{f(y)}" r="5" fill="none" stroke="{c}" '
                            f'stroke-width="2"><title>{escape(f"rank {rank}, step {p.step}: {ms(p.duration_us)}{why}")}'
                            f'</title></circle>')  # fmt: skip
    return _svg(width, height, body, "step time over the run")


def hbar(value: float, total: float, width: int = 160, color: str = "#4e79a7") -> Markup:
    """A small horizontal bar: value against total."""
    w = width * max(0.0, min(1.0, num(value) / num(total, 1.0))) if num(total) > 0 else 0.0
    return _svg(width, 12, [f'<rect x="0" y="1" width="{width}" height="10" fill="#eee"/>',
                            f'<rect x="0" y="1" width="{f(w, 2)}" height="10" fill="{color}"/>'], "share", "chart mini")  # fmt: skip


def gain_chart(step_us: float, low_us: float, high_us: float, speedup_low: float, speedup_high: float,
               width: int = 620) -> Markup:  # fmt: skip
    """The step as a bar; at its end, the time the fix removes: surely (low, dark) and at most
    (high, light). What remains is the step after the fix."""
    left, bar_w, h = 10, width - 20, 16
    step = num(step_us)
    if step <= 0:
        return _svg(width, 20, [_text(left, 14, "no step time")], "gain")
    hi = max(0.0, min(step, num(high_us)))
    lo = max(0.0, min(hi, num(low_us)))
    x_hi = left + bar_w * (1 - hi / step)
    x_lo = left + bar_w * (1 - lo / step)
    body = [
        f'<rect class="step" x="{left}" y="4" width="{bar_w}" height="{h}" fill="#cfd8e3"><title>step {escape(ms(step))}</title></rect>',
        f'<rect class="removable-high" x="{f(x_hi, 2)}" y="4" width="{f(left + bar_w - x_hi, 2)}" height="{h}" fill="#f6b26b">'
        f'<title>removable at most: {escape(ms(hi))}</title></rect>',
        f'<rect class="removable-low" x="{f(x_lo, 2)}" y="4" width="{f(left + bar_w - x_lo, 2)}" height="{h}" fill="#e06666">'
        f'<title>removable surely: {escape(ms(lo))}</title></rect>',
        f'<line x1="{f(x_hi, 2)}" y1="0" x2="{f(x_hi, 2)}" y2="{h + 8}" stroke="#333" stroke-dasharray="2,2"/>',
        _text(left, h + 20, f"step {ms(step)}"),
        _text(left + bar_w, h + 20, f"removes {ms(lo)} – {ms(hi)}  →  {num(speedup_low):.2f}x – {num(speedup_high):.2f}x", "end"),
    ]  # fmt: skip
    return _svg(width, h + 26, body, "expected gain against the step", "chart gain")
