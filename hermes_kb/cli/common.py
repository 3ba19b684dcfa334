"""What every command shares: the option enums, the one-line error and warning, loading the
inputs with progress, the --config check, and advising PATHS of any kind with the input checks.

Every string that came from a trace is cleaned of control characters before it reaches the
terminal (core/sanitize.py); usage mistakes exit 2 and name what exists; config mistakes exit 6
and name the user's file (docs/cli.md lists every exit code)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from ..core.errors import HermesError


from .style import CONTEXT  # -h as well as --help, everywhere


class Format(str, Enum):
    table = "table"
    json = "json"


class EngineOpt(str, Enum):
    auto = "auto"
    durable = "durable"
    python = "python"


def fail(err: HermesError) -> None:
    from ..core.sanitize import clean_line

    # one line whatever the names in it hold: a newline in a file name must not forge a line
    typer.echo(f"hermes: error: {clean_line(str(err))}", err=True)
    raise typer.Exit(err.exit_code)


def check_output(output: Path | None, *, directory_ok: bool = False) -> None:
    """Refuse an output path that cannot be written before any analysis runs: one line, exit 2."""
    import os

    from ..core.errors import UsageError

    if output is None:
        return
    if output.is_dir() and not directory_ok:
        raise UsageError(f"{output}: is a directory; -o takes a file name")
    parent = output if (directory_ok and output.is_dir()) else output.parent
    if not parent.is_dir():
        raise UsageError(f"{output}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{output}: its directory {parent} is not writable")


def warn(notes: list[str]) -> None:
    from ..core.sanitize import clean_line

    for note in notes:
        typer.echo(f"hermes: warning: {clean_line(note)}", err=True)


def load_paths(paths: list[Path], st, notes: list[str]):
    """Load traces with progress; the loader's warnings go to ``notes`` (printed once the
    progress display is gone)."""
    from ..trace import load

    st.reading([str(p) for p in paths])
    bundle = load([str(p) for p in paths], progress=st.loaded if st.live else None)
    notes.extend(f"skipped {problem.message}" for problem in bundle.problems)
    notes.extend(bundle.warnings)
    return bundle


def run_dir_of(paths: list[Path]) -> Path | None:
    """A monitor RUN_DIR given alone (rank<R>.jsonl logs): read as a run, not as traces."""
    from ..analysis.run_dir import as_run_dir

    return as_run_dir(paths)


def run_dir_ranks(run_dir: Path) -> list[int]:
    from ..monitor.reader import LOG_RE

    return sorted(int(m.group(1)) for c in run_dir.iterdir() if (m := LOG_RE.match(c.name)))


def check_config(config: Path | None):
    """Check the user's --config against the knowledge base (ConfigError / UsageError)."""
    if config is None:
        return
    from ..advisor.knowledge import knowledge_base
    from .checks import read_config

    read_config(config, knowledge_base())


def streams(paths: list[Path], scale: dict | None) -> bool:
    """Rank by rank (docs/scale.md): several rank files, or any of --workers/--sample/--dask."""
    if scale is None:
        return False
    if any(v is not None for v in scale.values()):
        return True
    from ..trace import discover

    return len(discover([str(p) for p in paths])) > 1


def advised(paths: list[Path], *, config, engine: str, top=None, rank=None, st=None, notes: list[str],
             scale: dict | None = None):  # fmt: skip
    """Load and advise PATHS (traces or a RUN_DIR) through the pipeline, with the input checks.
    ``scale`` (advise only): workers, sample and dask; several rank files are then streamed."""
    from .checks import bundle_warnings, check_rank, run_warnings
    from ..advisor.run import advise_bundle_full, advise_run_dir_full, advise_streamed

    if (run_dir := run_dir_of(paths)) is not None:
        check_rank(rank, run_dir_ranks(run_dir), str(run_dir))
        adv = advise_run_dir_full(run_dir, config=config, engine=engine, top=top, rank=rank, stage=st.stage)
        extra = run_warnings(adv.run)
        notes += adv.report.warnings
    elif streams(paths, scale):
        st.reading([str(p) for p in paths])
        adv = advise_streamed(paths, config=config, engine=engine, top=top, rank=rank, stage=st.stage, live=st.live,
                              **scale)  # fmt: skip
        bundle = adv.bundle
        notes.extend(f"skipped {problem.message}" for problem in bundle.problems)
        notes.extend(bundle.warnings)
        check_rank(rank, bundle.rank_ids, ", ".join(str(p) for p in paths))
        extra = bundle_warnings(bundle)
    else:
        bundle = load_paths(paths, st, notes)
        check_rank(rank, bundle.rank_ids, ", ".join(str(p) for p in paths))
        extra = bundle_warnings(bundle)
        adv = advise_bundle_full(bundle, config=config, engine=engine, top=top, rank=rank, stage=st.stage)
    notes += extra
    adv.report.warnings += extra
    return adv


__all__ = ["CONTEXT", "EngineOpt", "Format", "advised", "check_config", "fail", "load_paths", "run_dir_of", "run_dir_ranks", "streams", "warn"]
