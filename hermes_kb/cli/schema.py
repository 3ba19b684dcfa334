"""``hermes schema ...``: the JSON Schemas of what hermes reads and writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .style import HermesTyper
from .common import check_output, fail
from ..core.errors import HermesError


schema_app = HermesTyper(help="JSON Schemas of what hermes reads and writes.", no_args_is_help=True)


@schema_app.command("facts")
def schema_facts(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to this file")] = None,
) -> None:
    """The JSON Schema of every fact kind (docs/facts.schema.json holds a copy)."""
    from ..facts import facts_json_schema

    emit_schema(facts_json_schema(), output)


@schema_app.command("report")
def schema_report(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of the report `hermes advise --format json` prints."""
    from ..advisor.report import Report

    emit_schema(Report.model_json_schema(), output)


@schema_app.command("diff")
def schema_diff(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of what `hermes diff --format json` prints."""
    from ..tools.diff import DiffResult

    emit_schema(DiffResult.model_json_schema(), output)


@schema_app.command("rule")
def schema_rule(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of a rules/*.yaml file."""
    from ..kb.models import Rule

    emit_schema(Rule.model_json_schema(by_alias=True), output)


@schema_app.command("case")
def schema_case(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of a cases/<category>/*.yaml file."""
    from ..kb.models import Case

    emit_schema(Case.model_json_schema(by_alias=True), output)


def emit_schema(schema: dict, output: Path | None) -> None:
    text = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    try:
        check_output(output)
    except HermesError as err:
        fail(err)
    if output:
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)


__all__ = ["schema_app"]
