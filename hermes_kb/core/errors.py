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
EXIT_CONFIG = 6  # the user's --config file is unreadable or wrong (names the file)
EXIT_ENVIRONMENT = 7  # the machine cannot do what was asked: an extra not installed, a scheduler not reachable


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


class UsageError(HermesError):
    """A command line that names something that does not exist (a fact kind, a case id, a rank):
    the message names what does exist."""

    exit_code = EXIT_USAGE


class ConfigError(HermesError):
    """The user's ``--config`` file (threshold overrides) cannot be used; ``path`` is that file."""

    exit_code = EXIT_CONFIG


# The largest rank number hermes accepts from a file (distributedInfo, profiler_info, a file
# name): far above any real job, far below what breaks an int64 column or a dict of ranks.
MAX_RANK = 1 << 24


def as_rank(value: object) -> int | None:
    """A rank number from a file: a non-negative int (or a string of digits) up to MAX_RANK;
    anything else (1e30, -1, true, "3.5") is not a rank."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 9:  # "²".isdigit() is True
            return None
        value = int(text)
    if isinstance(value, int) and 0 <= value <= MAX_RANK:
        return value
    return None
