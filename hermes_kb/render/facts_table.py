"""Terminal rendering of `hermes analyze`: facts grouped by kind, one row per fact.

Values are shown with their unit and the unit suffix is taken off the field name
(``duration=73.96 ms``, not ``duration_us=73.96 ms``); names from the trace are cleaned of
control characters and shown as plain text (never read as rich markup)."""

from __future__ import annotations

import math
from collections import defaultdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..facts.base import Fact
from ..core.sanitize import clean_line
from .inspect_table import console_for_output

_SKIP = {"kind", "rank", "step", "evidence"}
_SUFFIXES = ("_flops_per_s", "_us", "_ratio", "_bytes", "_gbps", "_flops")
_STRIPPED = ("_flops_per_s", "_us", "_bytes", "_flops")  # the value shows another unit than the name says


def _unit(name: str) -> str | None:
    return next((s for s in _SUFFIXES if str(name).endswith(s)), None)


def _label(name: str) -> str:
    """The field name without the unit suffix when the value is shown in another unit
    (``duration_us`` holding ms becomes ``duration``); ``_ratio`` and ``_gbps`` stay."""
    s = _unit(name)
    return name[: -len(s)] if s in _STRIPPED and len(name) > len(s) else name


def _scalar(unit: str | None, value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        v = float(value)
        if not math.isfinite(v):
            return str(value)
        if unit == "_us":
            return f"{v / 1e3:,.2f} ms" if abs(v) >= 1000 else f"{v:,.1f} µs"
        if unit == "_ratio":
            return f"{v:.1%}"
        if unit == "_bytes":
            return f"{v / 1e6:,.2f} MB"
        if unit == "_flops_per_s":
            return f"{v / 1e12:,.2f} TFLOP/s"
        if unit == "_gbps":
            return f"{v:,.2f} GB/s"
        if unit == "_flops":
            return f"{v / 1e9:,.2f} GFLOP"
        return f"{value:,}" if isinstance(value, int) else f"{v:,.4g}"
    return clean_line(value)


def _fmt(name: str, value, unit: str | None = None) -> str:
    unit = _unit(name) or unit
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            return "; ".join(", ".join(f"{_label(k)}={_fmt(k, v)}" for k, v in list(d.items())[:4])
                             for d in value[:3]) + (" ..." if len(value) > 3 else "")  # fmt: skip
        return ", ".join(_fmt("", v, unit) for v in value[:6]) + (" ..." if len(value) > 6 else "")
    if isinstance(value, dict):
        return ", ".join(f"{clean_line(k)}: {_fmt(str(k), v, unit)}" for k, v in list(value.items())[:6]) + (
            " ..." if len(value) > 6 else "")
    return _scalar(unit, value)


def fact_values(f: Fact) -> str:
    items = [(k, v) for k, v in f.model_dump(exclude=_SKIP).items() if v not in (None, [], {})]
    labels = [_label(k) for k, _ in items]
    taken = {lb for lb, (k, _) in zip(labels, items) if lb == k}  # fields whose name has no unit suffix
    # a stripped name that another field already has ("optimizer_us" beside "optimizer") says what it is
    labels = [f"{lb}_time" if lb in taken and lb != k and k.endswith("_us") else (k if lb in taken and lb != k else lb)
              for lb, (k, _) in zip(labels, items)]  # fmt: skip
    return "  ".join(f"{lb}={_fmt(k, v)}" for lb, (k, v) in zip(labels, items))


def print_facts(facts: list[Fact], console: Console | None = None) -> None:
    console = console or console_for_output()
    by_kind: dict[str, list[Fact]] = defaultdict(list)
    for f in facts:
        by_kind[f.kind].append(f)
    for kind, group in by_kind.items():
        table = Table(title=Text(f"{kind} ({len(group)})"), title_justify="left", show_lines=False)
        table.add_column("scope")
        table.add_column("values", overflow="fold")
        for f in group:
            table.add_row(Text(clean_line(f.scope())), Text(fact_values(f)))
        console.print(table)
