"""Issue 18, items 1 and 6 (and issue 19's escaping): no name from a trace can break out of the
Markdown report into HTML, reach a terminal as a control sequence, or run in the HTML report."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from markdown_it import MarkdownIt
from rich.console import Console

import hermes_kb
from conftest import EXAMPLE
from hostile import ALL, HTML_PAYLOADS, MD_PAYLOADS, TERM_PAYLOADS, hostile_report, hostile_trace
from hermes_kb.render.details import with_details
from hermes_kb.render.html import render_html
from hermes_kb.render.report import render_json, render_markdown, render_terminal, render_terminal_markup
from hermes_kb.core.sanitize import clean, clean_line, json_terminal_safe

# what a terminal would act on: C0 controls but newline and tab, DEL, C1, bidi overrides
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def report():
    return hermes_kb.advise(EXAMPLE)


@pytest.fixture(scope="module")
def hostile(report):
    return hostile_report(report)


def test_clean_makes_every_control_visible():
    for p in TERM_PAYLOADS:
        assert not CONTROL.search(clean(p)), repr(clean(p))
    assert clean("a\x1bb") == "a\\x1bb"
    assert clean("bidi\u202e") == "bidi\\u202e"
    assert clean("two\nlines\tok") == "two\nlines\tok"
    assert clean_line("two\nlines\tok") == "two lines ok"


def test_json_output_keeps_values_but_no_raw_c1():
    text = json_terminal_safe(json.dumps({"n": "a\x9b31m\u202eb\x1b"}, ensure_ascii=False))
    assert not CONTROL.search(text)
    assert json.loads(text) == {"n": "a\x9b31m\u202eb\x1b"}


def _html_of_markdown(md: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).render(md)  # raw HTML enabled: the dangerous setting


def test_markdown_no_trace_text_becomes_html(hostile):
    md = render_markdown(hostile)
    html = _html_of_markdown(md)
    # no tag a payload could open survives: every '<' of a name comes out as &lt;
    for tag in ("<img", "<script", "<svg", "</title", "</code></pre><script"):
        assert tag not in html, tag
    assert "onerror=" not in re.sub(r"&lt;[^<]*", "", html)  # only inside escaped text
    assert "javascript:" not in re.findall(r'href="([^"]*)"', html).__str__()


def test_markdown_code_spans_cannot_be_closed_by_trace_text(hostile):
    md = render_markdown(hostile)
    evidence = [line for line in md.splitlines() if line.startswith("- `") and "events:" in line]
    assert evidence
    for line in evidence:
        # every code span on the line is balanced: an even number of backticks, and each span's
        # content has none (a backtick or a blank line in a name would end the span early)
        assert line.count("`") % 2 == 0
    for p in MD_PAYLOADS:
        assert p not in md
    # the snippet's fence is longer than any run of backticks inside it
    fences = re.findall(r"^(`{3,})python$", md, re.M)
    assert fences and all(len(f) >= 4 for f in fences)
    html = _html_of_markdown(md)
    assert html.count("<pre><code") == len(fences)


def test_markdown_of_a_hostile_trace_end_to_end(tmp_path):
    trace = hostile_trace(EXAMPLE, tmp_path / "hostile.json.gz")
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(trace), "--format", "md"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    html = _html_of_markdown(out.stdout)
    assert "<img" not in html and "<script" not in html and "<svg" not in html
    assert not CONTROL.search(out.stdout) and not CONTROL.search(out.stderr)


def test_terminal_report_has_no_control_characters(hostile):
    markup = render_terminal_markup(hostile)
    assert not CONTROL.search(markup)
    buf = io.StringIO()
    Console(file=buf, width=100, force_terminal=True, color_system=None).print(render_terminal(hostile))
    text = buf.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\x9b" not in text
    assert "\\x1b]52;c;" in text  # shown, visibly escaped


@pytest.mark.parametrize("command", [["advise"], ["inspect"], ["analyze"], ["advise", "--format", "json"],
                                     ["analyze", "--format", "json"], ["inspect", "--format", "json"]])  # fmt: skip
def test_cli_output_of_a_hostile_trace_has_no_control_characters(tmp_path, command):
    trace = hostile_trace(EXAMPLE, tmp_path / ("name\x1b]0;pwned\x07.json.gz"))
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", *command, str(trace)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not CONTROL.search(out.stdout), CONTROL.findall(out.stdout)[:5]
    assert not CONTROL.search(out.stderr)
    if "json" in command:
        json.loads(out.stdout)


def test_error_messages_are_cleaned(tmp_path):
    bad = tmp_path / "bad\x1b[2J.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(bad)], capture_output=True, text=True)
    assert out.returncode == 4 and "\x1b" not in out.stderr and "\\x1b[2J" in out.stderr


def test_json_report_keeps_the_names_as_recorded(hostile):
    data = json.loads(render_json(hostile))
    assert data["summary"][0]["device"] == hostile.summary[0].device  # exact, not cleaned


def test_html_escapes_everything(hostile):
    page = render_html(with_details(hostile, []))
    assert "<script" not in page and "onerror=\"" not in page and "<img" not in page
    assert "&lt;script&gt;" in page
    for p in HTML_PAYLOADS:
        assert p not in page
    assert not CONTROL.search(page)
    # the only tags are ours: no attribute value opened by a name
    assert "onload=" not in re.sub(r"&[^;]+;", "", re.sub(r">[^<]*<", "><", page)).replace("onload=&", "")


def test_every_payload_is_represented(hostile):
    page = render_html(with_details(hostile, []))
    md = render_markdown(hostile)
    for p in ALL:
        first_word = re.match(r"[A-Za-z]+", clean_line(p).lstrip("`\"'<>/ "))
        if first_word:
            assert first_word.group(0) in page
            assert first_word.group(0) in md


@pytest.mark.parametrize("name", ["see https://evil.example/x", "www.evil.example", "root@evil.example",
                                  "~~struck~~", "mailto:root@evil.example"])
def test_markdown_names_never_become_links_or_strikethrough(name):
    """A name that GFM would autolink or strike through (issue 37) is escaped so that it reads
    the same and renders as plain text; the escapes sit on the characters autolinks start from."""
    from hermes_kb.render.report import _md

    e = _md(name)
    assert not re.search(r"(?i)(?:https?|mailto):|www\.|[^\\]@|^@|(?<!\\)~", e), e
    html = MarkdownIt("commonmark").enable("strikethrough").render(e)
    assert "<a " not in html and "<s>" not in html and "<del>" not in html
    assert re.sub(r"<[^>]+>", "", html).strip() == name


def test_a_file_name_that_is_not_utf8_is_shown_escaped_in_every_format(tmp_path):
    # issue 36, item 5: a trace named with a byte that is not UTF-8 crashed the HTML writer and
    # made the JSON output invalid UTF-8
    import json
    import os
    import shutil
    import subprocess
    import sys

    from conftest import EXAMPLE

    d = os.fsencode(tmp_path / "runs")
    os.makedirs(d)
    shutil.copy(EXAMPLE, os.path.join(d, b"tr\xffce.json.gz"))
    for fmt in ("json", "html", "md", "term"):
        out = tmp_path / f"r.{fmt}"
        r = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", os.fsdecode(d), "--format", fmt, "-o", str(out)],
                           capture_output=True, text=True, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        text = out.read_bytes().decode("utf-8")  # valid UTF-8 throughout
        if fmt == "json":
            assert json.loads(text)["inputs"]["sources"][0].endswith("tr\udcffce.json.gz")  # the same value, escaped
        elif fmt == "html":  # the page names its inputs; the text reports only count them
            assert "tr\\xffce.json.gz" in text
