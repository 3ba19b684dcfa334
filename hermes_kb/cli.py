"""The `hermes` command: wiring only; the work lives in the library."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import __version__
from .errors import EXIT_OK, HermesError

app = typer.Typer(
    name="hermes",
    help="Explain why deep-learning training is slow, from profiler traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Format(str, Enum):
    table = "table"
    json = "json"


def _fail(err: HermesError) -> None:
    typer.echo(f"hermes: error: {err}", err=True)
    raise typer.Exit(err.exit_code)


def _load(paths: list[Path]):
    from .trace import load

    from .render.progress import load_progress

    with load_progress(len(paths)) as progress:
        bundle = load([str(p) for p in paths], progress=progress)
    for problem in bundle.problems:
        typer.echo(f"hermes: warning: skipped {problem.message}", err=True)
    for note in bundle.warnings:
        typer.echo(f"hermes: warning: {note}", err=True)
    return bundle


@app.command()
def inspect(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s) or a directory of per-rank traces")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
) -> None:
    """Show what was loaded, per rank: events by kind, steps, time span, device, world size."""
    from .trace.summary import summarize

    try:
        summary = summarize(_load(paths))
    except HermesError as err:
        _fail(err)
    if fmt is Format.json:
        typer.echo(json.dumps(summary.model_dump(), indent=2))
        return
    from .render.inspect_table import print_summary

    print_summary(summary)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hermes {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """hermes: profiler traces in, bottlenecks, causes and concrete fixes out."""


def main() -> None:
    try:
        app()
    except HermesError as err:  # a library error that escaped a command's own handling
        print(f"hermes: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
