"""``hermes kb ...``: check, test and browse the knowledge base, and say why an item fired."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import EXIT_FINDINGS, HermesError
from .style import HermesTyper
from .common import EngineOpt, Format, fail, load_paths, run_dir_of, warn


kb_app = HermesTyper(help="Check, test and browse the knowledge base (rules/ and cases/).", no_args_is_help=True)


def kb_or_fail(config: Path | None = None):
    from ..kb.loader import load_kb, load_overrides

    try:
        return load_kb(overrides=load_overrides(config) if config else None)
    except HermesError as err:
        fail(err)


@kb_app.command("validate")
def kb_validate() -> None:
    """Check every rule and case file: schema, fact kinds and fields, parameters, ids, templates."""
    kb = kb_or_fail()
    typer.echo(f"ok: {len(kb.rules)} rules, {len(kb.cases)} cases")


@kb_app.command("test")
def kb_test(
    item: Annotated[str | None, typer.Argument(help="only this rule or case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="auto runs both engines when durable-rules is installed")] = EngineOpt.auto,
) -> None:
    """Run every example (fire / no_fire) and an automatic probe of each threshold, on both engines."""
    from .checks import check_item
    from ..kb.testing import run_examples

    kb = kb_or_fail()
    try:
        check_item(kb, item)
    except HermesError as err:
        fail(err)
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
def kb_list(fmt: Annotated[Format, typer.Option("--format", "-f", case_sensitive=False)] = Format.table) -> None:
    """Every rule and case, rules first, each sorted by id: id, status, category, title."""
    from ..kb import cache
    from ..kb.files import kb_dirs, kb_files
    from ..kb.ids import id_key
    from ..kb.yaml_io import MAX_YAML_BYTES

    try:
        files = kb_files(*kb_dirs())
    except HermesError as err:
        fail(err)
    _, docs = cache.documents(files, MAX_YAML_BYTES)  # a checked KB's rows, with no model built
    if docs is not None:
        where = {(kind, name): str(path) for kind, name, path in files}
        rows = [{**d["row"], "file": where[(d["kind"], d["name"])]} for d in docs]
        n_rules = sum(d["kind"] == "rule" for d in docs)
    else:
        from ..kb.loader import list_row

        kb = kb_or_fail()
        rows = [{**list_row(e.item), "file": e.path} for e in (*kb.rules, *kb.cases)]
        n_rules = len(kb.rules)
    rows.sort(key=lambda r: id_key(r["id"]))
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from ..core.sanitize import clean_line

    cols = ("id", "status", "category", "cause", "title")
    cells = [[clean_line(str(r[c] or "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    # plain aligned columns (as pip list): greppable, no wrapping, and ~0.2 s faster than a rich table
    lines = [f"{n_rules} rules, {len(rows) - n_rules} cases", ""]
    for row in ([*cols], ["-" * w for w in widths], *cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    typer.echo("\n".join(lines))


@kb_app.command("show")
def kb_show(item: Annotated[str, typer.Argument(help="rule or case id")]) -> None:
    """The rule or case as loaded (YAML), with its parameters in force."""
    import yaml

    from .checks import check_item

    kb = kb_or_fail()
    try:
        check_item(kb, item)
    except HermesError as err:
        fail(err)
    entry = kb.by_id(item)
    typer.echo(f"# {entry.path}")
    typer.echo(yaml.safe_dump(entry.item.model_dump(by_alias=True, exclude_none=True), sort_keys=False, allow_unicode=True))


@kb_app.command("explain")
def kb_explain(
    item: Annotated[str, typer.Argument(help="case or rule id")],
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
) -> None:
    """On a real trace or run: why ITEM did or did not fire, condition by condition, with the values seen."""
    from .checks import check_item
    from ..kb.explain import explain
    from ..render.progress import stages
    from ..core.sanitize import clean

    kb = kb_or_fail()
    notes: list[str] = []
    try:
        check_item(kb, item)
        with stages() as st:
            if (run_dir := run_dir_of(paths)) is not None:
                from ..analysis.run_dir import analyze_run_dir

                st.stage(f"analysing the monitor logs of {run_dir.name}")
                ra = analyze_run_dir(run_dir)
                notes += ra.warnings
                facts = ra.facts
            else:
                from ..analysis.run import analyze_bundle

                bundle = load_paths(paths, st, notes)
                st.stage(f"analysing {len(bundle)} rank(s)")
                facts = analyze_bundle(bundle)
    except HermesError as err:
        fail(err)
    warn(notes)
    typer.echo(clean(explain(kb, item, facts)))


class CoverageFormat(str, Enum):
    table = "table"
    md = "md"
    json = "json"


@kb_app.command("coverage")
def kb_coverage(
    fmt: Annotated[CoverageFormat, typer.Option("--format", "-f", case_sensitive=False)] = CoverageFormat.table,
    shared: Annotated[Path | None, typer.Option("--shared", help="the shared real traces (default: ../shared/data)")] = None,
    no_shared: Annotated[bool, typer.Option("--no-shared", help="leave the real traces out")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="source kinds: real, scenario, example")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="worker processes (default: usable cores, at most 4)")] = None,
    write: Annotated[Path | None, typer.Option("--write", help="with --format md: replace the coverage section of this file")] = None,
) -> None:
    """For every case, where it fires: real traces, recorded scenarios, bundled examples (each analysed once)."""
    import sys

    kb = kb_or_fail()
    tty = sys.stderr.isatty()
    try:
        coverage_command(kb, fmt=fmt.value, shared=shared, no_shared=no_shared, only=only, jobs=jobs, write=write, echo=typer.echo,
                progress=(lambda j: typer.echo(f"  {j.source.kind} {j.source.name}: {len(j.fired)} case(s)", err=True))
                if tty else None)  # fmt: skip
    except HermesError as err:
        fail(err)


def coverage_command(kb, *, fmt: str = "table", shared: Path | None = None, no_shared: bool = False,
            only: Sequence[str] | None = None, jobs: int | None = None, write: Path | None = None,
            echo: Callable[[str], None] = print, progress=None):  # fmt: skip
    """What ``hermes kb coverage`` does; raises UsageError for a bad option."""
    from ..core.errors import UsageError
    from ..render.coverage import render_table
    from ..tools.coverage import KINDS, default_shared, markers, run, to_json, to_markdown, write_section

    if write is not None and fmt != "md":
        raise UsageError("--write replaces a Markdown section: use it with --format md")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    if shared is not None and not no_shared and not shared.is_dir():
        raise UsageError(f"--shared {shared}: no such directory")
    kinds = [k.strip() for part in (only or KINDS) for k in str(part).split(",") if k.strip()]
    if write is not None:  # before the minute of analysis, not after
        markers(write)
    use = None if no_shared else (shared or default_shared())
    cov = run(kb, shared=use, kinds=kinds, jobs=jobs, progress=progress)
    if fmt == "json":
        import json

        echo(json.dumps(to_json(cov), indent=1))
    elif fmt == "md":
        text = to_markdown(cov)
        if write is not None:
            write_section(write, text)
            c = cov.counts()
            echo(f"wrote the coverage of {c['cases']} cases to {write} ({c['real_or_scenario']} fire on a real trace "
                 f"or scenario, {c['never']} never)")  # fmt: skip
        else:
            echo(text)
    else:
        render_table(cov)
    return cov


__all__ = ["kb_app"]


@kb_app.command("calibration")
def kb_calibration(
    fmt: Annotated[Format, typer.Option("--format", "-f", case_sensitive=False)] = Format.table,
    ledger: Annotated[bool, typer.Option("--ledger", help="also read your ledger (`hermes diff --record`; "
                                         "$HERMES_LEDGER, else ~/.local/share/hermes/ledger.jsonl)")] = False,  # fmt: skip
) -> None:
    """How often each case's stated range held the measured speedup: on the recorded zoo (leave-one-out) and in your ledger."""
    from ..advisor import calibration
    from ..tools import ledger as ledger_mod

    cal = calibration._load(str(calibration.CALIBRATION_FILE))
    if cal is None:
        fail(HermesError(f"{calibration.CALIBRATION_FILE}: no calibration shipped with this install"))
    mine: dict[str, tuple[int, int]] = {}
    if ledger:
        try:
            entries, notes = ledger_mod.read()
        except HermesError as err:
            fail(err)
        warn(notes)
        mine = ledger_mod.case_records(entries)
    zoo = cal.case_records
    held, mg = cal.held(), cal.margins()
    cases = sorted(set(zoo) | set(mine))
    rows = [{"case_id": c, "zoo_hits": zoo.get(c, (0, 0))[0], "zoo_runs": zoo.get(c, (0, 0))[1],
             "ledger_hits": mine.get(c, (0, 0))[0], "ledger_runs": mine.get(c, (0, 0))[1]} for c in cases]  # fmt: skip
    if fmt is Format.json:
        typer.echo(json.dumps({"coverage": cal.coverage, "made": cal.made, "leave_one_out": held,
                               "margins": mg.__dict__ if mg else None, "cases": rows,
                               "ledger": str(ledger_mod.ledger_path()) if ledger else None}, indent=1))  # fmt: skip
        return
    typer.echo(f"Ranges stated as {cal.coverage:.0%} ranges, calibrated on {len(cal.scenarios)} zoo runs ({cal.made}).")
    typer.echo(f"Leave-one-out: the measured speedup inside the stated range on {held['hits']} of {held['n']} runs "
               f"({held['under']} above it, {held['over']} below); median |log(point / measured)| "
               f"{held['median_log_error']:.0%}.")  # fmt: skip
    if mg is not None:
        typer.echo(f"Margins (logit of the removed share): low end {-mg.below:+.2f}, high end {mg.above:+.2f}, point {mg.shift:+.2f}.")
    if ledger:
        typer.echo(f"Your ledger: {ledger_mod.ledger_path()} ({sum(n for _, n in mine.values())} run(s) of one resolved finding).")
    from rich.table import Table
    from rich.text import Text

    from ..render.inspect_table import console_for_output

    table = Table(title="hits / runs per case", title_justify="left")
    for col in ("case", "zoo", *(("ledger",) if ledger else ())):
        table.add_column(col)
    for r in rows:
        cells = [r["case_id"], f"{r['zoo_hits']}/{r['zoo_runs']}" if r["zoo_runs"] else "-"]
        if ledger:
            cells.append(f"{r['ledger_hits']}/{r['ledger_runs']}" if r["ledger_runs"] else "-")
        table.add_row(*(Text(c) for c in cells))
    console_for_output().print(table)
