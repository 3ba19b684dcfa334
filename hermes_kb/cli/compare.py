"""``hermes diff`` (two runs compared) and ``hermes annotate`` (a trace written back with the
critical path and the findings' evidence as extra tracks)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import HermesError
from .common import EngineOpt, advised, check_config, check_output, fail, warn


class DiffFormat(str, Enum):
    term = "term"
    md = "md"
    json = "json"
    html = "html"
    markdown = "markdown"  # the same as md


def diff(
    before: Annotated[Path, typer.Argument(help="the run before the change: trace file, directory of per-rank traces, or RUN_DIR")],
    after: Annotated[Path, typer.Argument(help="the run after the change (same kinds of input)")],
    fmt: Annotated[DiffFormat, typer.Option("--format", "-f", case_sensitive=False, help="term, md (markdown), json or html")] = DiffFormat.term,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the diff to this file")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="operators and kernels listed per direction")] = 10,
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
    record: Annotated[bool, typer.Option("--record", help="append each resolved finding's prediction and measured "
                                         "speedup to your ledger ($HERMES_LEDGER, else ~/.local/share/hermes/"
                                         "ledger.jsonl; read by `hermes kb calibration --ledger`)")] = False,  # fmt: skip
) -> None:
    """Compare two runs: step time by component, what changed most, and whether predicted gains were met.

    Per rank: the step by component, the operators and kernels that changed most, the findings
    resolved, new or unchanged, and for each resolved finding whether its predicted gain was met."""
    from ..tools.diff import diff_advised
    from ..render.diff import render_diff_html, render_diff_json, render_diff_markdown, render_diff_terminal
    from ..render.progress import stages

    fmt = DiffFormat.md if fmt is DiffFormat.markdown else fmt
    notes: list[str] = []
    try:
        check_config(config)
        check_output(output)
        with stages() as st:
            st.stage(f"before: {before.name}")
            a = advised([before], config=config, engine=engine.value, st=st, notes=notes)
            st.stage(f"after: {after.name}")
            b = advised([after], config=config, engine=engine.value, st=st, notes=notes)
            st.stage("comparing")
            result = diff_advised(a, b, top=top)
        if record:
            from ..core.version import __version__
            from ..tools import ledger

            lines = ledger.entries_of(result, __version__, str(before), str(after))
            where = ledger.append(lines) if lines else ledger.ledger_path()
            recorded = (f"hermes: ledger: {len(lines)} resolved finding(s) recorded in {where}" if lines else
                        "hermes: ledger: no resolved finding with a measured speedup, nothing recorded")  # fmt: skip
    except HermesError as err:
        fail(err)
    warn(notes)
    if record:
        typer.echo(recorded, err=True)
    if fmt is DiffFormat.term:
        if output is not None:
            from rich.console import Console

            with output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=120, no_color=True).print(render_diff_terminal(result), highlight=False)
        else:
            from ..render.inspect_table import console_for_output

            console_for_output().print(render_diff_terminal(result), highlight=False)
        return
    text = {DiffFormat.md: render_diff_markdown, DiffFormat.json: render_diff_json,
            DiffFormat.html: render_diff_html}[fmt](result)  # fmt: skip
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)


def annotate(
    paths: Annotated[list[Path], typer.Argument(help="Kineto trace file(s) (.json / .json.gz) or a directory of them")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the annotated trace (.json or .json.gz); a directory "
                                          "when several ranks are given")],  # fmt: skip
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
) -> None:
    """Write the trace back with tracks for Perfetto and chrome://tracing: critical paths and findings.

    The extra tracks hold each step's critical path and each finding's evidence windows, named by
    case id."""
    from ..tools.annotate import annotate_bundle
    from ..render.progress import stages

    notes: list[str] = []
    try:
        check_config(config)
        check_output(output, directory_ok=True)
        with stages() as st:
            adv = advised(paths, config=config, engine=engine.value, st=st, notes=notes)
            if adv.run is not None:
                from ..core.errors import UsageError

                raise UsageError("annotate writes a Kineto trace back: give the trace file(s), not a monitor RUN_DIR "
                                 "(its captures are rank<R>.capture<ID>.json.gz inside it)")  # fmt: skip
            st.stage("writing the annotated trace(s)")
            written = annotate_bundle(adv, output)
    except HermesError as err:
        fail(err)
    warn(notes)
    from ..core.sanitize import clean

    for w in written:
        typer.echo(f"wrote {clean(w.path)}: {w.original_events:,} original events + {w.added_events:,} added "
                   f"({w.path_segments:,} critical-path segments, {w.evidence_windows:,} evidence windows)")  # fmt: skip


__all__ = ["DiffFormat", "annotate", "diff"]
