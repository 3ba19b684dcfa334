"""Terminal rendering of `hermes analyze`: facts grouped by kind, one row per fact."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from ..facts.base import Fact
from .inspect_table import console_for_output

_SKIP = {"kind", "rank", "step", "evidence"}


def _fmt(name: str, value) -> str:
    if isinstance(value, float):
        if name.endswith("_us"):
            return f"{value / 1e3:,.2f} ms" if abs(value) >= 1000 else f"{value:,.1f} µs"
        if name.endswith("_ratio"):
            return f"{value:.1%}"
        if name.endswith("_bytes"):
            return f"{value / 1e6:,.2f} MB"
        if name.endswith("_flops_per_s"):
            return f"{value / 1e12:,.2f} TFLOP/s"
        return f"{value:,.4g}"
    if isinstance(value, int) and name.endswith("_bytes"):
        return f"{value / 1e6:,.2f} MB"
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            return "; ".join(", ".join(f"{k}={v}" for k, v in list(d.items())[:3]) for d in value[:3]) + (
                " ..." if len(value) > 3 else ""
            )
        return ", ".join(str(v) for v in value[:6]) + (" ..." if len(value) > 6 else "")
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(k, v)}" for k, v in list(value.items())[:6])
    return str(value)


def print_facts(facts: list[Fact], console: Console | None = None) -> None:
    console = console or console_for_output()
    by_kind: dict[str, list[Fact]] = defaultdict(list)
    for f in facts:
        by_kind[f.kind].append(f)
    for kind, group in by_kind.items():
        table = Table(title=f"{kind} ({len(group)})", title_justify="left", show_lines=False)
        table.add_column("scope")
        table.add_column("values", overflow="fold")
        for f in group:
            values = "  ".join(
                f"{k}={_fmt(k, v)}" for k, v in f.model_dump(exclude=_SKIP).items() if v not in (None, [], {})
            )
            table.add_row(f.scope(), values)
        console.print(table)
