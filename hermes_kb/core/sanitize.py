"""Text that came from a trace, made safe to show.

Names in a trace (devices, operators, annotations, files, process names) are written by whoever
produced the trace. Before any of it reaches a terminal, a Markdown file or an HTML page:

* control characters are replaced by a visible escape (``ESC`` becomes the four characters
  ``\\x1b``), so no escape sequence (colours, cursor moves, title changes, OSC 52 clipboard
  writes, OSC 8 links), carriage return, backspace or bell reaches a terminal, and the tampering
  stays visible. Replaced: C0 controls except newline and tab, DEL, C1 controls (U+0080-U+009F,
  which some terminals read as 8-bit escapes), the line and paragraph separators, and the
  bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069, U+200E/F, U+061C) that
  can make text read differently from what it is ("trojan source").
* single-line fields (names, scopes, values) have newline and tab replaced as well.

Each output format then escapes for its own syntax (rich markup, Markdown, HTML): see
hermes_kb/render/.
"""

from __future__ import annotations

import re
from typing import Any

# ... and lone surrogates: a file name whose bytes are not UTF-8 reaches Python as U+DC80-U+DCFF
# (surrogateescape), which no UTF-8 output can hold
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[{_CONTROL}]")
_UNSAFE_LINE = re.compile(f"[{_CONTROL}\n\t]")
# fields of the report that are prose (several lines are legitimate there); everything else is a
# name, a scope or a value and is kept on one line
PROSE_FIELDS = frozenset({"explanation", "how_to", "snippet", "assumption", "note", "summary", "why_not"})


def _visible(m: re.Match) -> str:
    c = m.group(0)
    if c == "\n" or c == "\t":
        return " "
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # the byte surrogateescape stood in for
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def clean(text: Any, *, multiline: bool = True) -> str:
    """``text`` as a string with every control character replaced by a visible escape
    (newline and tab kept when ``multiline``, else replaced by a space)."""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE if multiline else _UNSAFE_LINE).sub(_visible, s)


def clean_line(text: Any) -> str:
    return clean(text, multiline=False)


def clean_data(obj: Any, key: str | None = None) -> Any:
    """A copy of JSON-like data (dicts, lists, strings, numbers) with every string cleaned; dict
    keys too. Strings under a key in PROSE_FIELDS keep their newlines."""
    if isinstance(obj, str):
        return clean(obj, multiline=key in PROSE_FIELDS)
    if isinstance(obj, dict):
        return {(clean_line(k) if isinstance(k, str) else k): clean_data(v, k if isinstance(k, str) else key)
                for k, v in obj.items()}  # fmt: skip
    if isinstance(obj, (list, tuple)):
        return type(obj)(clean_data(v, key) for v in obj)
    return obj


def clean_model(model):
    """A pydantic model with every string in it cleaned (a new instance; the input is untouched)."""
    return type(model).model_validate(clean_data(model.model_dump(mode="python")))


_C1 = re.compile("[\x7f-\x9f\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def json_terminal_safe(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) with the characters json leaves raw
    but a terminal may act on (DEL, C1 controls, bidi overrides) written as \\uXXXX escapes: the
    same JSON value, safe to print, and lone surrogates (a file name whose bytes are not UTF-8) as
    escapes too, so the text encodes as UTF-8. (json already escapes C0 controls.)"""
    return _C1.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


__all__ = ["PROSE_FIELDS", "clean", "clean_data", "clean_line", "clean_model", "json_terminal_safe"]
