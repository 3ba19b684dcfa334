"""``hermes mcp``: serve the advisor, the facts, the knowledge base and the what-if replay to an
AI assistant over the Model Context Protocol (stdio; docs/agents.md). Needs the ``mcp`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import EXIT_ENVIRONMENT, HermesError
from .common import fail


def mcp(
    root: Annotated[list[Path], typer.Option("--root", help="a directory the tools may read under (repeatable); "
                                             "every other path is refused")],
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="seconds one tool call may run before it is "
                                           "abandoned")] = 300.0,
    max_bytes: Annotated[int, typer.Option("--max-bytes", min=4096, help="largest answer in bytes; longer ones are "
                                           "paged (offset)")] = 200_000,
) -> None:
    """Serve hermes to an AI assistant: a Model Context Protocol server over stdio (docs/agents.md).

    Tools: advise, breakdown, facts, explain, whatif, diff, kb_search, monitor_status; resources: a report
    as JSON and Markdown, a case's YAML, the JSON Schemas. Reads only under the --root directories."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        typer.echo("hermes: error: hermes mcp needs the MCP SDK: pip install 'hermes-kb[mcp]'", err=True)
        raise typer.Exit(EXIT_ENVIRONMENT)
    from ..assist.server import serve

    try:
        serve([str(r) for r in root], timeout_s=timeout, max_bytes=max_bytes)
    except HermesError as err:
        fail(err)


__all__ = ["mcp"]
