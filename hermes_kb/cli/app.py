"""The `hermes` command: wiring only; each command group is a module of this package and the
work lives in the library."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..core.errors import EXIT_OK, HermesError
from ..core.version import __version__
from . import advise, assist, compare, inputs
from .style import HermesTyper
from .kb import kb_app
from .monitor import monitor_app
from .schema import schema_app

app = HermesTyper(
    name="hermes",
    help="Explain why deep-learning training is slow, from profiler traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for command in (advise.advise, compare.diff, compare.annotate, inputs.inspect, inputs.analyze):  # the main job first
    app.command()(command)
app.add_typer(kb_app, name="kb")
app.add_typer(monitor_app, name="monitor")
app.add_typer(schema_app, name="schema")
app.command("mcp")(assist.mcp)


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
        app(prog_name="hermes")  # the name in usage lines and messages, also under python -m
    except HermesError as err:  # a library error that escaped a command's own handling
        from ..core.sanitize import clean_line

        print(f"hermes: error: {clean_line(str(err))}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
