"""The `hermes` command: wiring only; the work lives in the library."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import __version__
from .errors import EXIT_FINDINGS, EXIT_OK, HermesError

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


def _run_dir(paths: list[Path]) -> Path | None:
    """A monitor RUN_DIR given alone (rank<R>.jsonl logs): read as a run, not as traces."""
    from .run_advice import as_run_dir

    return as_run_dir(paths)


def _warn(notes: list[str]) -> None:
    for note in notes:
        typer.echo(f"hermes: warning: {note}", err=True)


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


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
    kind: Annotated[list[str] | None, typer.Option("--kind", "-k", help="only facts of these kinds")] = None,
) -> None:
    """Measure the trace (or the monitor logs of a run) and print the typed facts the analyzers emit."""
    from .analysis import analyze_bundle

    try:
        if (run_dir := _run_dir(paths)) is not None:
            from .run_advice import analyze_run_dir

            ra = analyze_run_dir(run_dir)
            _warn(ra.warnings)
            facts = ra.facts
        else:
            facts = analyze_bundle(_load(paths))
    except HermesError as err:
        _fail(err)
    if kind:
        facts = [f for f in facts if f.kind in set(kind)]
    if fmt is Format.json:
        typer.echo(json.dumps([f.model_dump(mode="json") for f in facts], indent=1))
        return
    from .render.facts_table import print_facts

    print_facts(facts)


class ReportFormat(str, Enum):
    term = "term"
    md = "md"
    json = "json"


class SeverityOpt(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"


class EngineOpt(str, Enum):
    auto = "auto"
    durable = "durable"
    python = "python"


@app.command()
def advise(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="term, md or json")] = ReportFormat.term,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the report to this file")] = None,
    top: Annotated[int | None, typer.Option("--top", help="show at most N findings", min=1)] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="only findings involving this rank")] = None,
    fail_on: Annotated[
        SeverityOpt | None, typer.Option("--fail-on", help="exit 1 when a finding at or above this severity exists")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
) -> None:
    """Diagnose: bottlenecks, causes, concrete optimizations and their expected speedup."""
    from .advisor import advise_bundle
    from .render.report import render_json, render_markdown, render_terminal_markup
    from .report import SEVERITY_ORDER

    try:
        if (run_dir := _run_dir(paths)) is not None:
            from .run_advice import advise_run_dir

            report = advise_run_dir(run_dir, config=config, engine=engine.value, top=top, rank=rank)
            _warn(report.warnings)
        else:
            report = advise_bundle(_load(paths), config=config, engine=engine.value, top=top, rank=rank)
    except HermesError as err:
        _fail(err)
    if fmt is ReportFormat.json:
        text = render_json(report) + "\n"
    elif fmt is ReportFormat.md:
        text = render_markdown(report)
    else:
        text = None
    if output is not None:
        if text is None:
            from rich.console import Console

            with output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=120, no_color=True).print(render_terminal_markup(report), highlight=False)
        else:
            output.write_text(text, encoding="utf-8")
    elif text is not None:
        typer.echo(text, nl=False)
    else:
        from .render.inspect_table import console_for_output

        console_for_output().print(render_terminal_markup(report), highlight=False)
    worst = report.worst_severity()
    if fail_on is not None and worst is not None and SEVERITY_ORDER[worst] >= SEVERITY_ORDER[fail_on.value]:
        raise typer.Exit(EXIT_FINDINGS)


kb_app = typer.Typer(help="Check, test and browse the knowledge base (rules/ and cases/).", no_args_is_help=True)
app.add_typer(kb_app, name="kb")


def _kb(config: Path | None = None):
    from .kb.loader import load_kb, load_overrides

    try:
        return load_kb(overrides=load_overrides(config) if config else None)
    except HermesError as err:
        _fail(err)


@kb_app.command("validate")
def kb_validate() -> None:
    """Check every rule and case file: schema, fact kinds and fields, parameters, ids, templates."""
    kb = _kb()
    typer.echo(f"ok: {len(kb.rules)} rules, {len(kb.cases)} cases")


@kb_app.command("test")
def kb_test(
    item: Annotated[str | None, typer.Argument(help="only this rule or case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="auto runs both engines when durable-rules is installed")] = EngineOpt.auto,
) -> None:
    """Run every example (fire / no_fire) and an automatic probe of each threshold, on both engines."""
    from .kb.testing import run_examples

    kb = _kb()
    engines = None if engine is EngineOpt.auto else [engine.value]
    report = run_examples(kb, only=item, engines=engines)
    for r in report.failures:
        why = "engines disagree" if not r.agree else ("did not fire" if r.expect_fire else "fired")
        typer.echo(f"FAIL {r.item_id} {r.name}: {why} {r.fired} ({r.path})")
    n = len(report.results)
    failed = len(report.failures)
    typer.echo(f"{n - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(EXIT_FINDINGS)


@kb_app.command("list")
def kb_list(fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table) -> None:
    """Every rule and case: id, status, category, title."""
    kb = _kb()
    rows = [{"id": e.item.id, "status": e.item.status,
             "category": getattr(e.item, "category", None) or e.item.emit.category,
             "cause": getattr(e.item, "cause", ""), "title": e.item.title, "file": e.path}
            for e in (*kb.rules, *kb.cases)]  # fmt: skip
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.table import Table

    from .render.inspect_table import console_for_output

    table = Table(title=f"{len(kb.rules)} rules, {len(kb.cases)} cases", title_justify="left")
    for col in ("id", "status", "category", "cause", "title"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["status"], r["category"], r["cause"], r["title"])
    console_for_output().print(table)


@kb_app.command("show")
def kb_show(item: Annotated[str, typer.Argument(help="rule or case id")]) -> None:
    """The rule or case as loaded (YAML), with its parameters in force."""
    import yaml

    kb = _kb()
    entry = kb.by_id(item)
    if entry is None:
        _fail(HermesError(f"no rule or case with id {item!r} (see hermes kb list)"))
    typer.echo(f"# {entry.path}")
    typer.echo(yaml.safe_dump(entry.item.model_dump(by_alias=True, exclude_none=True), sort_keys=False, allow_unicode=True))


@kb_app.command("explain")
def kb_explain(
    item: Annotated[str, typer.Argument(help="case or rule id")],
    paths: Annotated[list[Path], typer.Argument(help="trace file(s) or directory")],
) -> None:
    """On a real trace: why ITEM did or did not fire, condition by condition, with the values seen."""
    from .analysis import analyze_bundle
    from .kb.explain import explain

    kb = _kb()
    if kb.by_id(item) is None:
        _fail(HermesError(f"no rule or case with id {item!r} (see hermes kb list)"))
    try:
        facts = analyze_bundle(_load(paths))
    except HermesError as err:
        _fail(err)
    typer.echo(explain(kb, item, facts))


monitor_app = typer.Typer(help="The always-on training monitor's logs (hermes_kb.monitor).", no_args_is_help=True)
app.add_typer(monitor_app, name="monitor")


@monitor_app.command("profile")
def monitor_profile(
    run_dir: Annotated[Path, typer.Argument(help="the running job's monitor RUN_DIR")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="steps to capture")] = 3,
) -> None:
    """Ask every rank of a running job to capture the next STEPS steps with torch.profiler."""
    from .errors import InputNotFoundError
    from .monitor.capture import write_request

    if not run_dir.is_dir():
        _fail(InputNotFoundError("no such directory", str(run_dir)))
    req = write_request(run_dir, steps)
    typer.echo(f"requested capture {req['id']} of {steps} step(s); each rank writes rank<R>.capture{req['id']}.json.gz")


@monitor_app.command("status")
def monitor_status(
    run_dir: Annotated[Path, typer.Argument(help="the monitor's RUN_DIR (rank<R>.jsonl files)")],
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
) -> None:
    """Ranks, last step, median step time, data wait and GC shares, recent fluctuations."""
    from .errors import InputNotFoundError, NoTracesError
    from .monitor.logs import status

    if not run_dir.is_dir():
        _fail(InputNotFoundError("no such directory", str(run_dir)))
    rows = status(run_dir)
    if not rows:
        _fail(NoTracesError("no monitor logs (rank<R>.jsonl)", str(run_dir)))
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.table import Table

    from .render.inspect_table import console_for_output

    table = Table(title=f"monitor: {run_dir}", title_justify="left")
    for col in ("rank", "steps", "last step", "median step", "data wait", "GC", "fluctuations", "recent", "finished"):
        table.add_column(col)
    for r in rows:
        pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
        table.add_row(str(r["rank"]), str(r["steps"]), str(r["last_step"]),
                      "-" if r["median_step_s"] is None else f"{r['median_step_s'] * 1e3:,.1f} ms",
                      pct(r["data_wait_ratio"]), pct(r["gc_pause_ratio"]), str(r["fluctuations"]),
                      ", ".join(map(str, r["recent_fluctuations"])) or "-", "yes" if r["finished"] else "no")  # fmt: skip
    console_for_output().print(table)


schema_app = typer.Typer(help="JSON Schemas of what hermes reads and writes.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")


@schema_app.command("facts")
def schema_facts(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to this file")] = None,
) -> None:
    """The JSON Schema of every fact kind (docs/facts.schema.json holds a copy)."""
    from .facts import facts_json_schema

    text = json.dumps(facts_json_schema(), indent=2, ensure_ascii=False) + "\n"
    if output:
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)


@schema_app.command("report")
def schema_report(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of the report `hermes advise --format json` prints."""
    from .report import Report

    _emit_schema(Report.model_json_schema(), output)


@schema_app.command("rule")
def schema_rule(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of a rules/*.yaml file."""
    from .kb.models import Rule

    _emit_schema(Rule.model_json_schema(by_alias=True), output)


@schema_app.command("case")
def schema_case(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of a cases/<category>/*.yaml file."""
    from .kb.models import Case

    _emit_schema(Case.model_json_schema(by_alias=True), output)


def _emit_schema(schema: dict, output: Path | None) -> None:
    text = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    if output:
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)


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
