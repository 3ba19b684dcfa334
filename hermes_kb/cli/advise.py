"""``hermes advise``: the report, in the terminal, Markdown, JSON or HTML."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import EXIT_FINDINGS, HermesError
from .common import EngineOpt, advised, check_config, check_output, fail, warn


class ReportFormat(str, Enum):
    term = "term"
    md = "md"
    json = "json"
    html = "html"
    markdown = "markdown"  # the same as md


class SeverityOpt(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"


def advise(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", case_sensitive=False, help="term, md (markdown), json or html")] = ReportFormat.term,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the report to this file")] = None,
    top: Annotated[int | None, typer.Option("--top", help="show at most N findings", min=1)] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="only findings involving this rank")] = None,
    fail_on: Annotated[
        SeverityOpt | None, typer.Option("--fail-on", help="exit 1 when a finding at or above this severity exists")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="ranks analysed at once, one process each (default: the cores)")] = None,
    sample: Annotated[int | None, typer.Option("--sample", min=1, help="analyse only K ranks: every process group and the slowest, by a first pass over the step times")] = None,
    dask: Annotated[str | None, typer.Option("--dask", envvar="HERMES_DASK_SCHEDULER", help="Dask scheduler (tcp://host:8786) to run the per-rank stage on; needs hermes-kb[dask]")] = None,
) -> None:
    """Diagnose: bottlenecks, causes, concrete optimizations and their expected speedup."""
    from ..render.progress import stages
    from ..render.report import render_json, render_markdown, render_terminal
    from ..advisor.report import SEVERITY_ORDER

    fmt = ReportFormat.md if fmt is ReportFormat.markdown else fmt
    notes: list[str] = []
    try:
        check_config(config)
        check_output(output)
        with stages() as st:
            adv = advised(paths, config=config, engine=engine.value, top=top, rank=rank, st=st, notes=notes,
                           scale={"workers": workers, "sample": sample, "dask": dask or None})  # fmt: skip
            st.stage("writing the report")
            report = adv.report
            text = None
            if fmt in (ReportFormat.json, ReportFormat.html):
                from ..render.details import with_details

                report = with_details(report, adv.facts, adv.run)
                if fmt is ReportFormat.json:
                    text = render_json(report) + "\n"
                else:
                    from ..render.html import render_html

                    text = render_html(report)
            elif fmt is ReportFormat.md:
                text = render_markdown(report)
    except HermesError as err:
        fail(err)
    warn(notes)
    if output is not None:
        if text is None:
            from rich.console import Console

            with output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=120, no_color=True).print(render_terminal(report), highlight=False)
        else:
            output.write_text(text, encoding="utf-8")
    elif text is not None:
        typer.echo(text, nl=False)
    else:
        from ..render.inspect_table import console_for_output

        # the warnings went to stderr just above: printed again in the report they would show twice
        shown = report.model_copy(update={"warnings": [w for w in report.warnings if w not in notes]})
        console_for_output().print(render_terminal(shown), highlight=False)
    worst = report.worst_severity()
    if fail_on is not None and worst is not None and SEVERITY_ORDER[worst] >= SEVERITY_ORDER[fail_on.value]:
        raise typer.Exit(EXIT_FINDINGS)


__all__ = ["ReportFormat", "SeverityOpt", "advise"]
