"""``hermes monitor ...``: ask a running job for a capture, and the status of its logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .style import HermesTyper
from .common import Format, fail, warn


monitor_app = HermesTyper(help="The always-on training monitor's logs (hermes_kb.monitor).", no_args_is_help=True)


@monitor_app.command("profile")
def monitor_profile(
    run_dir: Annotated[Path, typer.Argument(help="the running job's monitor RUN_DIR")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="steps to capture")] = 3,
) -> None:
    """Ask every rank of a running job to capture the next STEPS steps with torch.profiler."""
    from ..core.errors import InputNotFoundError, UsageError
    from ..monitor.capture import max_capture_steps, write_request
    from ..monitor.logs import status

    cap = max_capture_steps()
    if steps > cap:  # a capture holds every event in the training process until it ends
        fail(UsageError(f"--steps {steps} is over the {cap}-step cap on a capture (it holds the profiler's events in "
                        "the training process until it ends); set HERMES_MAX_CAPTURE_STEPS, in the job's "
                        "environment too, to raise it"))  # fmt: skip
    if not run_dir.is_dir():
        fail(InputNotFoundError("no such directory", str(run_dir)))
    rows = status(run_dir)
    if not rows:
        fail(UsageError("no monitor logs (rank<R>.jsonl) here: nothing would pick up the request; start the job with "
                         "hermes_kb.monitor.Monitor(RUN_DIR) first", str(run_dir)))  # fmt: skip
    done = [r["rank"] for r in rows if r["finished"]]
    if len(done) == len(rows):
        fail(UsageError(f"the run has finished (every rank, {', '.join(map(str, sorted(done)))}, wrote its end "
                         f"record): nothing would pick up the request", str(run_dir)))  # fmt: skip
    if done:
        warn([f"rank(s) {', '.join(map(str, sorted(done)))} finished: only the others will capture"])
    req = write_request(run_dir, steps)
    typer.echo(f"requested capture {req['id']} of {steps} step(s); each rank writes rank<R>.capture{req['id']}.json.gz")


@monitor_app.command("status")
def monitor_status(
    run_dir: Annotated[Path, typer.Argument(help="the monitor's RUN_DIR (rank<R>.jsonl files)")],
    fmt: Annotated[Format, typer.Option("--format", "-f", case_sensitive=False)] = Format.table,
) -> None:
    """Ranks, last step, median step time, data wait and GC shares, recent fluctuations."""
    from ..core.errors import InputNotFoundError, NoTracesError
    from ..monitor.logs import status

    if not run_dir.is_dir():
        fail(InputNotFoundError("no such directory", str(run_dir)))
    rows = status(run_dir)
    if not rows:
        fail(NoTracesError("no monitor logs (rank<R>.jsonl)", str(run_dir)))
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.table import Table
    from rich.text import Text

    from ..render.inspect_table import console_for_output
    from ..core.sanitize import clean_line

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


__all__ = ["monitor_app"]
