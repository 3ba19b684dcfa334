"""``hermes kb coverage`` as a terminal table."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..tools.coverage import Coverage, cell
from .inspect_table import console_for_output


def render_table(cov: Coverage, console=None) -> None:
    c = cov.counts()
    s = cov.sources_count()
    title = (f"{c['cases']} cases on {s['real']} real traces, {s['scenario']} scenario runs, {s['example']} examples: "
             f"{c['real_or_scenario']} fire on a real trace or scenario, {c['never']} never")  # fmt: skip
    table = Table(title=title, title_justify="left")
    for col in ("case", "category", "hw", "real traces", "scenarios", "examples"):
        table.add_column(col)
    for r in cov.rows:
        table.add_row(*(Text(x) for x in (r.case_id, r.category, r.hardware, cell(r.where["real"]),
                                          cell(r.where["scenario"]), cell(r.where["example"]))))  # fmt: skip
    (console or console_for_output()).print(table)
    for j in cov.judged:
        if j.error:
            (console or console_for_output()).print(Text(f"not analysed: {j.source.name}: {j.error}"))


__all__ = ["render_table"]
