"""How the ``hermes`` command looks and speaks, set once for every command and group.

- Help in click's own words: ``Usage: hermes advise [OPTIONS] PATHS...`` and ``BEFORE AFTER``
  for the arguments, ``PATH``, ``INTEGER RANGE [x>=1]``, ``[term|md|json|html]`` for the values
  an option takes, nothing for a flag. (typer 0.29 writes ``{paths}...``, ``<list[Path]>``,
  ``<int range>`` and ``<bool>``; older typers already wrote click's words and are left alone.)
- A docstring's paragraphs reflow to the terminal's width: a hard line break inside a paragraph
  is a space (typer keeps them after the first paragraph), and help text is shown as written,
  never read as rich markup (``hermes-kb[dask]`` lost its ``[dask]``).
- A usage error (an unknown option or command, a missing argument, a bad value) is one line,
  ``hermes: error: ...``, like every other hermes error, with click's exit code 2; the value
  check's message in click's words (``'bogus' is not one of 'term', 'md', ...``), not
  pydantic's (``Value error, ...``, ``Input should be a valid integer``).

Wired through ``HermesTyper``: a ``typer.Typer`` whose groups are ``HermesGroup`` and whose
commands are ``HermesCommand``."""

from __future__ import annotations

import sys
from typing import Any, get_args

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

CONTEXT = {"help_option_names": ["-h", "--help"]}

_TYPE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT", bool: "BOOLEAN"}


def reflow(text: str | None) -> str | None:
    """Paragraphs (blank-line separated) on one line each; a paragraph starting with ``\\b``
    (click's "do not rewrap") is kept as written."""
    if not text:
        return text
    paragraphs = text.split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines()).strip()
                       for p in paragraphs)  # fmt: skip


def _plain(text: str | None, markup_mode) -> str | None:
    """Help as written: reflowed, and escaped where typer would read it as rich markup."""
    text = reflow(text)
    if text and markup_mode == "rich":
        from rich.markup import escape

        text = escape(text)
    return text


def _type_name(desc) -> str:
    """Click's name of the values a typer 0.29 option takes (its ``TypeDescriptor``)."""
    if desc.is_choice:
        return "[" + "|".join(dict.fromkeys(str(getattr(c, "value", c)) for c in desc.choices or ())) + "]"
    if desc.is_path:
        return {"file": "FILE", "dir": "DIRECTORY"}.get(desc.path_type, "PATH")
    annotation = desc.annotation
    if desc.is_list or desc.is_tuple:
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        names = [_TYPE_NAMES.get(a) or getattr(a, "__name__", str(a)).upper() for a in args] or ["TEXT"]
        return " ".join(names) if desc.is_tuple else names[0]
    name = _TYPE_NAMES.get(annotation) or getattr(annotation, "__name__", str(annotation)).upper()
    return f"{name} RANGE" if desc.is_ranged else name


class HermesArgument(TyperArgument):
    """An argument shown as click shows it: ``PATHS...`` (its metavar, set by HermesCommand), in
    brackets when optional; no type column (its help says what it is)."""

    def get_usage_pieces(self, ctx) -> list[str]:
        name = self.metavar or (self.name or "").upper()
        return [name if self.required else f"[{name}]"]

    def display_type_rich(self, ctx) -> str | None:  # typer 0.29
        return None

    def display_type(self, ctx) -> str:  # typer 0.29, plain help
        return ""


class HermesOption(TyperOption):
    """An option's values in click's words (``PATH``, ``INTEGER RANGE``, ``[a|b]``); none for a flag."""

    def display_type_rich(self, ctx) -> str | None:  # typer 0.29
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        desc = getattr(self, "type_descriptor", None)
        return None if desc is None else _type_name(desc)


def _click_style(param) -> None:
    if type(param) is TyperArgument:
        param.__class__ = HermesArgument
        if param.metavar is None:
            param.metavar = (param.name or "").upper() + ("..." if param.nargs != 1 else "")
    elif type(param) is TyperOption:
        param.__class__ = HermesOption


class _Styled:
    """What HermesCommand and HermesGroup share: click-style parameters and plain, reflowed help."""

    def _style(self) -> None:
        mode = getattr(self, "rich_markup_mode", None)
        self.help = _plain(self.help, mode)
        if getattr(self, "short_help", None):
            self.short_help = _plain(self.short_help, mode)
        for param in self.params:
            _click_style(param)
            if getattr(param, "help", None):
                param.help = _plain(param.help, mode)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)  # made on first use: -h / --help, a flag
        if option is not None:
            _click_style(option)
        return option


class HermesCommand(_Styled, TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._style()


def usage_message(err) -> str:
    """A click usage error in one line: click's message (the value check's in click's words, not
    pydantic's), then where the help is."""
    from ..core.sanitize import clean_line

    msg = err.format_message()
    cause = err.__cause__
    if cause is not None and hasattr(cause, "errors") and getattr(err, "message", None) is not None:
        try:
            detail = cause.errors()[0]
        except Exception:  # not pydantic's ValidationError after all
            detail = None
        if detail:
            clicks = _click_words(detail)
            if clicks:
                msg = msg.replace(err.message, clicks, 1) if err.message in msg else msg
    msg = msg.replace("Value error, ", "")  # what pydantic puts before a validator's own message
    msg = msg[:1].lower() + msg[1:]
    ctx = getattr(err, "ctx", None)
    if ctx is not None and ctx.command.get_help_option(ctx) is not None:
        msg = msg.rstrip().removesuffix(".") + f" (see {ctx.command_path} {ctx.help_option_names[0]})"
    return clean_line(msg)


def _click_words(detail: dict) -> str | None:
    kind, given, limits = detail.get("type"), detail.get("input"), detail.get("ctx") or {}
    if kind == "value_error" and "error" in limits:
        return str(limits["error"])
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{given!r} is not a valid integer."
    if kind in ("float_parsing", "float_type"):
        return f"{given!r} is not a valid float."
    if kind in ("bool_parsing", "bool_type"):
        return f"{given!r} is not a valid boolean."
    bounds = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
              "less_than": ("lt", "<")}  # fmt: skip
    if kind in bounds:
        key, op = bounds[kind]
        if key in limits:
            return f"{given} is not in the range x{op}{limits[key]}."
    return None


class HermesGroup(_Styled, TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._style()

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True, **extra: Any):
        """Click's main, with its usage errors as one ``hermes: error:`` line (exit 2)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        exceptions = _click_exceptions()
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except exceptions.ClickException as err:
            if type(err).__name__ == "NoArgsIsHelpError":  # `hermes` alone: the help, exit 2 as click does
                if getattr(self, "rich_markup_mode", None) is None:
                    err.show()
            else:
                typer.echo(f"hermes: error: {usage_message(err)}", err=True)
            sys.exit(err.exit_code)
        except _aborts(exceptions):
            typer.echo("hermes: error: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)  # an Exit's code; a command's None is success


def _aborts(exceptions) -> tuple[type[BaseException], ...]:
    """Click's Abort where this click has one (typer 0.29's own click has none: typer.Abort)."""
    return tuple({getattr(exceptions, "Abort", None), getattr(typer, "Abort", None)} - {None})


def _click_exceptions():
    try:
        from typer._click import exceptions  # typer >= 0.29 carries its own click
    except ImportError:
        from click import exceptions
    return exceptions


class HermesTyper(typer.Typer):
    """A typer.Typer whose group is a HermesGroup and whose commands are HermesCommands."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", HermesGroup)
        kwargs.setdefault("context_settings", CONTEXT)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("cls", HermesCommand)
        return super().command(*args, **kwargs)


__all__ = ["CONTEXT", "HermesCommand", "HermesGroup", "HermesTyper", "reflow", "usage_message"]
