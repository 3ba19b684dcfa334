"""The CLI's rough edges (issue 36, item 6): help in click's words (``PATHS...``, ``BEFORE AFTER``,
``PATH``, ``INTEGER RANGE [x>=1]``, nothing for a flag), paragraphs that reflow, choice errors
without pydantic's "Value error,", and usage errors as one ``hermes: error:`` line, exit 2.
Every command and subcommand is walked, so a new one is checked too."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from hermes_kb.cli.app import app

ROOT_CMD = typer.main.get_command(app)
WIDE = {"COLUMNS": "220", "TERMINAL_WIDTH": "220"}


def _walk(cmd, path=()):
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(ROOT_CMD))
LEAVES = [(p, c) for p, c in COMMANDS if not getattr(c, "commands", None)]


def run(*args: str):
    return CliRunner().invoke(app, list(args), prog_name="hermes", env=WIDE)


def _help(path) -> str:
    r = run(*path, "--help")
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "hermes")
def test_help_in_clicks_words(path):
    out = _help(path)
    assert not re.search(r"<(bool|int|float|str|path|file|dir|list\[|int range)", out), out  # typer 0.29's own labels
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert "{" not in usage and "<" not in usage, usage
    for line in out.splitlines():  # a flag (--help, --record, --version, ...) shows no value
        if re.search(r"│ +(--help|--record|--version|--ledger|--no-shared) ", line):
            assert re.search(r"(--help +-h|--record|--version|--ledger|--no-shared) {4,}\S", line), line


@pytest.mark.parametrize(("path", "usage"), [
    (("advise",), "Usage: hermes advise [OPTIONS] PATHS..."),
    (("diff",), "Usage: hermes diff [OPTIONS] BEFORE AFTER"),
    (("annotate",), "Usage: hermes annotate [OPTIONS] PATHS..."),
    (("kb", "test"), "Usage: hermes kb test [OPTIONS] [ITEM]"),
    (("kb", "explain"), "Usage: hermes kb explain [OPTIONS] ITEM PATHS..."),
    (("monitor", "profile"), "Usage: hermes monitor profile [OPTIONS] RUN_DIR"),
    ((), "Usage: hermes [OPTIONS] COMMAND [ARGS]..."),
])  # fmt: skip
def test_usage_lines(path, usage):
    assert usage in _help(path)


def test_option_values_are_named_as_click_names_them():
    out = _help(("advise",))
    assert re.search(r"--top +INTEGER RANGE \[x>=1\]", out)
    assert re.search(r"--output +-o +PATH ", out)
    assert re.search(r"--format +-f +\[term\|md\|json\|html\|markdown\]", out)
    assert re.search(r"--dask +TEXT ", out)
    assert "hermes-kb[dask]" in out  # help text is shown as written, not read as rich markup
    assert re.search(r"\* +PATHS\.\.\. +trace file", out)
    assert re.search(r"--kind +-k +TEXT ", _help(("analyze",)))


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "hermes")
def test_docstring_paragraphs_reflow(path):
    cmd = dict(COMMANDS)[path]
    for paragraph in (cmd.help or "").split("\n\n"):
        assert "\n" not in paragraph, paragraph  # a hard break inside a paragraph would show as one


def test_diff_and_annotate_descriptions_read_as_paragraphs():
    assert "the findings resolved, new or unchanged" in _help(("diff",))
    assert "each finding's evidence windows, named by case id" in _help(("annotate",))


def _choice_options():
    """(command path, option name, required arguments) for every option taking a fixed set of names."""
    for path, cmd in LEAVES:
        args = [p for p in cmd.params if p.param_type_name == "argument" and p.required]
        for p in cmd.params:
            desc = getattr(p, "type_descriptor", None)
            is_choice = desc.is_choice if desc is not None else bool(getattr(getattr(p, "type", None), "choices", None))
            if p.param_type_name == "option" and is_choice:
                yield path, p.opts[0], ["x"] * len(args)


CHOICES = list(_choice_options())


def test_every_enum_option_is_found():
    names = {(" ".join(p), o) for p, o, _ in CHOICES}
    assert {("advise", "--format"), ("advise", "--fail-on"), ("advise", "--engine"), ("diff", "--format"),
            ("inspect", "--format"), ("kb list", "--format"), ("kb coverage", "--format"),
            ("monitor status", "--format")} <= names  # fmt: skip
    assert len(CHOICES) >= 12


@pytest.mark.parametrize(("path", "opt", "args"), CHOICES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v))
def test_choice_errors_in_clicks_words(path, opt, args):
    r = run(*path, *args, opt, "bogus")
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("hermes: error: invalid value for '" + opt + "'"), line
    assert re.search(r": 'bogus' is not one of '[a-z]+', '[a-z]+'", line) and "Value error" not in line, line


@pytest.mark.parametrize(("args", "words"), [
    (["advise"], ["missing argument 'PATHS...'", "hermes advise -h"]),
    (["diff", "a"], ["missing argument 'AFTER'"]),
    (["advise", "x", "--bogus"], ["no such option: --bogus"]),
    (["advise", "x", "--top", "0"], ["'--top'", "0 is not in the range x>=1"]),
    (["advise", "x", "--top", "abc"], ["'--top'", "'abc' is not a valid integer"]),
    (["monitor", "profile", "r", "--steps", "-1"], ["'--steps'", "-1 is not in the range x>=1"]),
    (["advse"], ["no such command 'advse'", "Did you mean 'advise'?"]),
    (["kb", "bogus"], ["no such command 'bogus'", "hermes kb -h"]),
    (["advise", "x", "--format"], ["'--format' requires an argument"]),
])  # fmt: skip
def test_usage_errors_are_one_line(args, words):
    r = run(*args)
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()  # no box, no separate usage line
    assert line.startswith("hermes: error: "), line
    for w in words:
        assert w in line, line
    assert "Input should be" not in line and "╭" not in r.output


def test_one_line_usage_errors_from_the_installed_command():
    """Through main() (the `hermes` script and python -m): the same line, exit 2; no args is help."""
    r = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", "x", "--format", "bogus"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr == ("hermes: error: invalid value for '--format' / '-f': 'bogus' is not one of 'term', 'md', "
                        "'json', 'html', 'markdown' (see hermes advise -h)\n")  # fmt: skip
    bare = subprocess.run([sys.executable, "-m", "hermes_kb.cli"], capture_output=True, text=True)
    assert bare.returncode == 2 and "Usage: hermes [OPTIONS] COMMAND" in bare.stdout and not bare.stderr


def test_the_usage_errors_docs_cli_md_shows_are_what_hermes_prints():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs/cli.md").read_text()
    shown = [x for x in doc.splitlines() if x.startswith("hermes: error:") and "(see hermes" in x]
    given = {"--format": ["advise", "x", "--format", "bogus"], "--top": ["advise", "x", "--top", "0"],
             "AFTER": ["diff", "a"], "--bogus": ["advise", "x", "--bogus"]}  # fmt: skip
    assert len(shown) == len(given)
    for line in shown:
        (args,) = [a for key, a in given.items() if f"'{key}'" in line or f": {key} " in line]
        assert run(*args).stderr.strip() == line


@pytest.mark.parametrize("args", [["--help"], ["advise", "--help"], ["kb", "list"]])
def test_output_into_a_closed_pipe_is_no_traceback(args):
    """`hermes advise --help | head -1`: the reader goes away; hermes stops quietly (as click does)."""
    p = subprocess.Popen([sys.executable, "-m", "hermes_kb.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, bufsize=0)  # fmt: skip
    p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and "Error" not in err, err
