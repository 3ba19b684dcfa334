"""``hermes inspect`` and ``hermes analyze``: what was loaded, and the facts measured on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import HermesError
from .common import Format, fail, load_paths, run_dir_of, warn


def inspect(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s) or a directory of per-rank traces")],
    fmt: Annotated[Format, typer.Option("--format", "-f", case_sensitive=False, help="table or json")] = Format.table,
) -> None:
    """Show what was loaded, per rank: events by kind, steps, time span, device, world size."""
    from .checks import bundle_warnings
    from ..render.progress import stages
    from ..trace.summary import summarize

    notes: list[str] = []
    try:
        with stages() as st:
            bundle = load_paths(paths, st, notes)
            summary = summarize(bundle)
        notes += bundle_warnings(bundle)
    except HermesError as err:
        fail(err)
    warn(notes)
    if fmt is Format.json:
        typer.echo(json.dumps(summary.model_dump(), indent=2))
        return
    from ..render.inspect_table import print_summary

    print_summary(summary)


def analyze(
    paths: Annotated[list[Path], typer.Argument(help="trace file(s), a directory of per-rank traces, or a monitor RUN_DIR")],
    fmt: Annotated[Format, typer.Option("--format", "-f", case_sensitive=False, help="table or json")] = Format.table,
    kind: Annotated[list[str] | None, typer.Option("--kind", "-k", help="only facts of these kinds (hermes schema facts)")] = None,
) -> None:
    """Measure the trace (or the monitor logs of a run) and print the typed facts the analyzers emit."""
    from .checks import bundle_warnings, check_kinds, run_warnings
    from ..render.progress import stages

    notes: list[str] = []
    try:
        check_kinds(kind)
        with stages() as st:
            if (run_dir := run_dir_of(paths)) is not None:
                from ..analysis.run_dir import analyze_run_dir

                st.stage(f"analysing the monitor logs of {run_dir.name}")
                ra = analyze_run_dir(run_dir)
                notes += ra.warnings + run_warnings(ra.run)
                facts = ra.facts
            else:
                from ..analysis.run import analyze_bundle

                bundle = load_paths(paths, st, notes)
                notes += bundle_warnings(bundle)
                st.stage(f"analysing {len(bundle)} rank(s)")
                facts = analyze_bundle(bundle)
    except HermesError as err:
        fail(err)
    warn(notes)
    if kind:
        facts = [f for f in facts if f.kind in set(kind)]
    if fmt is Format.json:
        typer.echo(json.dumps([f.model_dump(mode="json") for f in facts], indent=1))
        return
    from ..render.facts_table import print_facts

    print_facts(facts)


__all__ = ["analyze", "inspect"]
