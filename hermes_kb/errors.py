"""Errors a user can cause, each with a one-line message and a documented exit code.

A traceback reaching the user is a bug; everything the user can get wrong (a path, a file,
a YAML rule) is raised as a ``HermesError`` subclass and printed as one line by the CLI.
"""

from __future__ import annotations

# Exit codes of the `hermes` command (also listed in docs/cli.md).
EXIT_OK = 0
EXIT_FINDINGS = 1  # `advise --fail-on`: a finding at or above the severity exists
EXIT_USAGE = 2  # bad command-line usage (typer/click's own code)
EXIT_NOT_FOUND = 3  # a path that does not exist
EXIT_BAD_INPUT = 4  # a file that cannot be read as a trace (or a bad rule/case file)
EXIT_NO_TRACES = 5  # nothing loadable: a directory without traces, or every rank damaged


class HermesError(Exception):
    """A problem with the user's input. ``str(err)`` is the one-line message."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, path: str | None = None, rank: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.rank = rank

    def __str__(self) -> str:
        where = self.path or ""
        if self.rank is not None:
            where = f"{where} (rank {self.rank})" if where else f"rank {self.rank}"
        return f"{where}: {self.message}" if where else self.message

    def __reduce__(self):  # survive pickling across worker processes
        return (self.__class__, (self.message, self.path, self.rank))


class InputNotFoundError(HermesError):
    exit_code = EXIT_NOT_FOUND


class BadTraceError(HermesError):
    exit_code = EXIT_BAD_INPUT


class NoTracesError(HermesError):
    exit_code = EXIT_NO_TRACES
