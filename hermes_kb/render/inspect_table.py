"""Terminal rendering of `hermes inspect`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.sanitize import clean_line
from ..trace.summary import BundleSummary

COUNTS = ("cpu_ops", "python", "annotations", "kernels", "runtime", "memcpy", "syncs", "collectives", "memory")


def _steps(steps: list[int]) -> str:
    if not steps:
        return "-"
    if steps == list(range(steps[0], steps[0] + len(steps))):
        return f"{len(steps)} (#{steps[0]}..#{steps[-1]})"
    return f"{len(steps)} ({', '.join(f'#{s}' for s in steps[:6])}{', ...' if len(steps) > 6 else ''})"


def console_for_output() -> Console:
    """A console that keeps tables readable when piped (rich assumes 80 columns then)."""
    c = Console()
    return c if c.is_terminal else Console(width=140)


def print_summary(summary: BundleSummary, console: Console | None = None) -> None:
    console = console or console_for_output()
    overview = Table(title="ranks loaded", title_justify="left")
    for col in ("rank", "from", "file", "device", "world", "steps", "span ms"):
        overview.add_column(col, justify="left" if col in ("from", "file", "device") else "right", overflow="fold")
    counts = Table(title="rows per frame", title_justify="left")
    counts.add_column("rank", justify="right")
    for col in COUNTS:
        counts.add_column(col, justify="right")
    for r in summary.ranks:
        overview.add_row(
            str(r.rank),
            Text(clean_line(r.rank_source)),
            Text(clean_line(r.source.rsplit("/", 1)[-1])),
            Text(clean_line(r.device or "-")),
            str(r.world_size) if r.world_size else "-",
            _steps(r.steps),
            f"{r.span_ms:,.1f}",
        )
        counts.add_row(str(r.rank), *(f"{r.rows.get(k, 0):,}" for k in COUNTS))
    console.print(overview)
    console.print(counts)
    for r in summary.ranks:
        for w in r.warnings:
            console.print(Text(f"rank {r.rank}: {clean_line(w)}", style="yellow"), highlight=False)
    for s in summary.skipped:
        console.print(Text(f"skipped {clean_line(s['error'])}", style="red"), highlight=False)
