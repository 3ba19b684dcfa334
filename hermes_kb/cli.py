"""The `hermes` command: wiring only; the work lives in the library.

Every string that came from a trace is cleaned of control characters before it reaches the
terminal (hermes_kb/sanitize.py); usage mistakes exit 2 and name what exists; config mistakes
exit 6 and name the user's file (docs/cli.md lists every exit code)."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import __version__
from .errors import EXIT_FINDINGS, EXIT_OK, HermesError

CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="hermes",
    help="Explain why deep-learning training is slow, from profiler traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)


class Format(str, Enum):
    table = "table"
    json = "json"


def _fail(err: HermesError) -> None:
    from .sanitize import clean

    typer.echo(f"hermes: error: {clean(str(err))}", err=True)
    raise typer.Exit(err.exit_code)


def _warn(notes: list[str]) -> None:
    from .sanitize import clean

    for note in notes:
        typer.echo(f"hermes: warning: {clean(note)}", err=True)


def _load(paths: list[Path], st, notes: list[str]):
    """Load traces with progress; the loader's warnings go to ``notes`` (printed once the
    progress display is gone)."""
    from .trace import load

    st.reading([str(p) for p in paths])
    bundle = load([str(p) for p in paths], progress=st.loaded if st.live else None)
    notes.extend(f"skipped {problem.message}" for problem in bundle.problems)
    notes.extend(bundle.warnings)
    return bundle


def _run_dir(paths: list[Path]) -> Path | None:
    """A monitor RUN_DIR given alone (rank<R>.jsonl logs): read as a run, not as traces."""
    from .run_advice import as_run_dir

    return as_run_dir(paths)


def _run_dir_ranks(run_dir: Path) -> list[int]:
    from .monitor.reader import LOG_RE

    return sorted(int(m.group(1)) for c in run_dir.iterdir() if (m := LOG_RE.match(c.name)))


def _config(config: Path | None):
    """Check the user's --config against the knowledge base (ConfigError / UsageError)."""
    if config is None:
        return
    from .advisor import knowledge_base
    from .checks import read_config

    read_config(config, knowledge_base())


@app.command()
def inspect(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s) or a directory of per-rank traces")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
) -> None:
    """Show what was loaded, per rank: events by kind, steps, time span, device, world size."""
    from .checks import bundle_warnings
    from .render.progress import stages
    from .trace.summary import summarize

    notes: list[str] = []
    try:
        with stages() as st:
            bundle = _load(paths, st, notes)
            summary = summarize(bundle)
        notes += bundle_warnings(bundle)
    except HermesError as err:
        _fail(err)
    _warn(notes)
    if fmt is Format.json:
        typer.echo(json.dumps(summary.model_dump(), indent=2))
        return
    from .render.inspect_table import print_summary

    print_summary(summary)


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
    kind: Annotated[list[str] | None, typer.Option("--kind", "-k", help="only facts of these kinds (hermes schema facts)")] = None,
) -> None:
    """Measure the trace (or the monitor logs of a run) and print the typed facts the analyzers emit."""
    from .checks import bundle_warnings, check_kinds, run_warnings
    from .render.progress import stages

    notes: list[str] = []
    try:
        check_kinds(kind)
        with stages() as st:
            if (run_dir := _run_dir(paths)) is not None:
                from .run_advice import analyze_run_dir

                st.stage(f"analysing the monitor logs of {run_dir.name}")
                ra = analyze_run_dir(run_dir)
                notes += ra.warnings + run_warnings(ra.run)
                facts = ra.facts
            else:
                from .pipeline import analyze_staged

                bundle = _load(paths, st, notes)
                notes += bundle_warnings(bundle)
                facts = analyze_staged(bundle, st)[0]
    except HermesError as err:
        _fail(err)
    _warn(notes)
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
    html = "html"


class SeverityOpt(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"


class EngineOpt(str, Enum):
    auto = "auto"
    durable = "durable"
    python = "python"


def _streams(paths: list[Path], scale: dict | None) -> bool:
    """Rank by rank (docs/scale.md): several rank files, or any of --workers/--sample/--dask."""
    if scale is None:
        return False
    if any(v is not None for v in scale.values()):
        return True
    from .trace import discover

    return len(discover([str(p) for p in paths])) > 1


def _advised(paths: list[Path], *, config, engine: str, top=None, rank=None, st=None, notes: list[str],
             scale: dict | None = None):  # fmt: skip
    """Load and advise PATHS (traces or a RUN_DIR) through the pipeline, with the input checks.
    ``scale`` (advise only): workers, sample and dask; several rank files are then streamed."""
    from .checks import bundle_warnings, check_rank, run_warnings
    from .pipeline import advise_run, advise_streamed, advise_traces

    if (run_dir := _run_dir(paths)) is not None:
        check_rank(rank, _run_dir_ranks(run_dir), str(run_dir))
        adv = advise_run(run_dir, config=config, engine=engine, top=top, rank=rank, stages=st)
        extra = run_warnings(adv.run)
        notes += adv.report.warnings
    elif _streams(paths, scale):
        st.reading([str(p) for p in paths])
        adv = advise_streamed(paths, config=config, engine=engine, top=top, rank=rank, stages=st, **scale)
        bundle = adv.bundle
        notes.extend(f"skipped {problem.message}" for problem in bundle.problems)
        notes.extend(bundle.warnings)
        check_rank(rank, bundle.rank_ids, ", ".join(str(p) for p in paths))
        extra = bundle_warnings(bundle)
    else:
        bundle = _load(paths, st, notes)
        check_rank(rank, bundle.rank_ids, ", ".join(str(p) for p in paths))
        extra = bundle_warnings(bundle)
        adv = advise_traces(bundle, config=config, engine=engine, top=top, rank=rank, stages=st)
    notes += extra
    adv.report.warnings += extra
    return adv


@app.command()
def advise(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="term, md, json or html")] = ReportFormat.term,
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
    from .render.progress import stages
    from .render.report import render_json, render_markdown, render_terminal
    from .report import SEVERITY_ORDER

    notes: list[str] = []
    try:
        _config(config)
        with stages() as st:
            adv = _advised(paths, config=config, engine=engine.value, top=top, rank=rank, st=st, notes=notes,
                           scale={"workers": workers, "sample": sample, "dask": dask or None})  # fmt: skip
            st.stage("writing the report")
            report = adv.report
            text = None
            if fmt in (ReportFormat.json, ReportFormat.html):
                from .render.details import with_details

                report = with_details(report, adv.facts, adv.run)
                if fmt is ReportFormat.json:
                    text = render_json(report) + "\n"
                else:
                    from .render.html import render_html

                    text = render_html(report)
            elif fmt is ReportFormat.md:
                text = render_markdown(report)
    except HermesError as err:
        _fail(err)
    _warn(notes)
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
        from .render.inspect_table import console_for_output

        # the warnings went to stderr just above: printed again in the report they would show twice
        shown = report.model_copy(update={"warnings": [w for w in report.warnings if w not in notes]})
        console_for_output().print(render_terminal(shown), highlight=False)
    worst = report.worst_severity()
    if fail_on is not None and worst is not None and SEVERITY_ORDER[worst] >= SEVERITY_ORDER[fail_on.value]:
        raise typer.Exit(EXIT_FINDINGS)


class DiffFormat(str, Enum):
    term = "term"
    md = "md"
    json = "json"
    html = "html"


@app.command()
def diff(
    before: Annotated[Path, typer.Argument(help="the run before the change: trace file, directory of per-rank traces, or RUN_DIR")],
    after: Annotated[Path, typer.Argument(help="the run after the change (same kinds of input)")],
    fmt: Annotated[DiffFormat, typer.Option("--format", "-f", help="term, md, json or html")] = DiffFormat.term,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the diff to this file")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="operators and kernels listed per direction")] = 10,
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
) -> None:
    """Compare two runs: step time per rank by component, the operators and kernels that changed
    most, findings resolved / new / unchanged, and whether each resolved finding's predicted gain
    was met."""
    from .diff import diff_advised
    from .render.diff import render_diff_html, render_diff_json, render_diff_markdown, render_diff_terminal
    from .render.progress import stages

    notes: list[str] = []
    try:
        _config(config)
        with stages() as st:
            st.stage(f"before: {before.name}")
            a = _advised([before], config=config, engine=engine.value, st=st, notes=notes)
            st.stage(f"after: {after.name}")
            b = _advised([after], config=config, engine=engine.value, st=st, notes=notes)
            st.stage("comparing")
            result = diff_advised(a, b, top=top)
    except HermesError as err:
        _fail(err)
    _warn(notes)
    if fmt is DiffFormat.term:
        if output is not None:
            from rich.console import Console

            with output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=120, no_color=True).print(render_diff_terminal(result), highlight=False)
        else:
            from .render.inspect_table import console_for_output

            console_for_output().print(render_diff_terminal(result), highlight=False)
        return
    text = {DiffFormat.md: render_diff_markdown, DiffFormat.json: render_diff_json,
            DiffFormat.html: render_diff_html}[fmt](result)  # fmt: skip
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)


@app.command()
def annotate(
    paths: Annotated[list[Path], typer.Argument(help="Kineto trace file(s) (.json / .json.gz) or a directory of them")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the annotated trace (.json or .json.gz); a directory "
                                          "when several ranks are given")],  # fmt: skip
    config: Annotated[Path | None, typer.Option("--config", help="YAML of threshold overrides per rule/case id")] = None,
    engine: Annotated[EngineOpt, typer.Option("--engine", help="rules engine")] = EngineOpt.auto,
) -> None:
    """Write the trace back with extra tracks for the Perfetto UI and chrome://tracing: each
    step's critical path, and each finding's evidence windows named by case id."""
    from .annotate import annotate_bundle
    from .render.progress import stages

    notes: list[str] = []
    try:
        _config(config)
        with stages() as st:
            adv = _advised(paths, config=config, engine=engine.value, st=st, notes=notes)
            if adv.run is not None:
                from .errors import UsageError

                raise UsageError("annotate writes a Kineto trace back: give the trace file(s), not a monitor RUN_DIR "
                                 "(its captures are rank<R>.capture<ID>.json.gz inside it)")  # fmt: skip
            st.stage("writing the annotated trace(s)")
            written = annotate_bundle(adv, output)
    except HermesError as err:
        _fail(err)
    _warn(notes)
    from .sanitize import clean

    for w in written:
        typer.echo(f"wrote {clean(w.path)}: {w.original_events:,} original events + {w.added_events:,} added "
                   f"({w.path_segments:,} critical-path segments, {w.evidence_windows:,} evidence windows)")  # fmt: skip


kb_app = typer.Typer(help="Check, test and browse the knowledge base (rules/ and cases/).", no_args_is_help=True,
                     context_settings=CONTEXT)  # fmt: skip
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
    from .checks import check_item
    from .kb.testing import run_examples

    kb = _kb()
    try:
        check_item(kb, item)
    except HermesError as err:
        _fail(err)
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
    """Every rule and case, rules first, each sorted by id: id, status, category, title."""
    from .checks import id_key

    kb = _kb()
    rows = [{"id": e.item.id, "status": e.item.status,
             "category": getattr(e.item, "category", None) or e.item.emit.category,
             "cause": getattr(e.item, "cause", ""), "title": e.item.title, "file": e.path}
            for e in (*kb.rules, *kb.cases)]  # fmt: skip
    rows.sort(key=lambda r: id_key(r["id"]))
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.table import Table
    from rich.text import Text

    from .render.inspect_table import console_for_output

    table = Table(title=f"{len(kb.rules)} rules, {len(kb.cases)} cases", title_justify="left")
    for col in ("id", "status", "category", "cause", "title"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(Text(str(r[c] or "")) for c in ("id", "status", "category", "cause", "title")))
    console_for_output().print(table)


@kb_app.command("show")
def kb_show(item: Annotated[str, typer.Argument(help="rule or case id")]) -> None:
    """The rule or case as loaded (YAML), with its parameters in force."""
    import yaml

    from .checks import check_item

    kb = _kb()
    try:
        check_item(kb, item)
    except HermesError as err:
        _fail(err)
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
    from .kb.explain import explain
    from .render.progress import stages
    from .sanitize import clean

    kb = _kb()
    notes: list[str] = []
    try:
        check_item(kb, item)
        with stages() as st:
            if (run_dir := _run_dir(paths)) is not None:
                from .run_advice import analyze_run_dir

                st.stage(f"analysing the monitor logs of {run_dir.name}")
                ra = analyze_run_dir(run_dir)
                notes += ra.warnings
                facts = ra.facts
            else:
                from .pipeline import analyze_staged

                facts = analyze_staged(_load(paths, st, notes), st)[0]
    except HermesError as err:
        _fail(err)
    _warn(notes)
    typer.echo(clean(explain(kb, item, facts)))


class CoverageFormat(str, Enum):
    table = "table"
    md = "md"
    json = "json"


@kb_app.command("coverage")
def kb_coverage(
    fmt: Annotated[CoverageFormat, typer.Option("--format", "-f")] = CoverageFormat.table,
    shared: Annotated[Path | None, typer.Option("--shared", help="the shared real traces (default: ../shared/data)")] = None,
    no_shared: Annotated[bool, typer.Option("--no-shared", help="leave the real traces out")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="source kinds: real, scenario, example")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="worker processes (default: usable cores, at most 4)")] = None,
    write: Annotated[Path | None, typer.Option("--write", help="with --format md: replace the coverage section of this file")] = None,
) -> None:
    """For every case, where it fires: real traces, recorded scenarios, bundled examples (each analysed once)."""
    import sys

    from .kb.coverage import command

    kb = _kb()
    tty = sys.stderr.isatty()
    try:
        command(kb, fmt=fmt.value, shared=shared, no_shared=no_shared, only=only, jobs=jobs, write=write, echo=typer.echo,
                progress=(lambda j: typer.echo(f"  {j.source.kind} {j.source.name}: {len(j.fired)} case(s)", err=True))
                if tty else None)  # fmt: skip
    except HermesError as err:
        _fail(err)


monitor_app = typer.Typer(help="The always-on training monitor's logs (hermes_kb.monitor).", no_args_is_help=True,
                          context_settings=CONTEXT)  # fmt: skip
app.add_typer(monitor_app, name="monitor")


@monitor_app.command("profile")
def monitor_profile(
    run_dir: Annotated[Path, typer.Argument(help="the running job's monitor RUN_DIR")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="steps to capture")] = 3,
) -> None:
    """Ask every rank of a running job to capture the next STEPS steps with torch.profiler."""
    from .errors import InputNotFoundError, UsageError
    from .monitor.capture import write_request
    from .monitor.logs import status

    if not run_dir.is_dir():
        _fail(InputNotFoundError("no such directory", str(run_dir)))
    rows = status(run_dir)
    if not rows:
        _fail(UsageError("no monitor logs (rank<R>.jsonl) here: nothing would pick up the request; start the job with "
                         "hermes_kb.monitor.Monitor(RUN_DIR) first", str(run_dir)))  # fmt: skip
    done = [r["rank"] for r in rows if r["finished"]]
    if len(done) == len(rows):
        _fail(UsageError(f"the run has finished (every rank, {', '.join(map(str, sorted(done)))}, wrote its end "
                         f"record): nothing would pick up the request", str(run_dir)))  # fmt: skip
    if done:
        _warn([f"rank(s) {', '.join(map(str, sorted(done)))} finished: only the others will capture"])
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
    from rich.text import Text

    from .render.inspect_table import console_for_output
    from .sanitize import clean_line

    table = Table(title=Text(f"monitor: {clean_line(run_dir)}"), title_justify="left")
    for col in ("rank", "steps", "last step", "median step", "data wait", "GC", "fluctuations", "recent", "finished"):
        table.add_column(col)
    for r in rows:
        pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
        table.add_row(str(r["rank"]), str(r["steps"]), str(r["last_step"]),
                      "-" if r["median_step_s"] is None else f"{r['median_step_s'] * 1e3:,.1f} ms",
                      pct(r["data_wait_ratio"]), pct(r["gc_pause_ratio"]), str(r["fluctuations"]),
                      ", ".join(map(str, r["recent_fluctuations"])) or "-", "yes" if r["finished"] else "no")  # fmt: skip
    console_for_output().print(table)


schema_app = typer.Typer(help="JSON Schemas of what hermes reads and writes.", no_args_is_help=True,
                         context_settings=CONTEXT)  # fmt: skip
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


@schema_app.command("diff")
def schema_diff(output: Annotated[Path | None, typer.Option("--output", "-o")] = None) -> None:
    """The JSON Schema of what `hermes diff --format json` prints."""
    from .diff import DiffResult

    _emit_schema(DiffResult.model_json_schema(), output)


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
        from .sanitize import clean

        print(f"hermes: error: {clean(str(err))}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
