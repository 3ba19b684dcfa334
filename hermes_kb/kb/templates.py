"""The explanation templates of cases: what a template may contain, checked when the knowledge
base loads, and the sandbox they render in, which bounds what they can build at render time.

A template is data from a YAML file, so it gets the smallest useful language: output of fields
(``{{ d.wait_us | ms }}``), arithmetic and comparisons, ``if`` and conditional expressions, and a
fixed list of filters. No function or method calls (``range(10**8)``, ``''.join``), no ``**``,
no loops, assignments, macros, imports or blocks, no attribute starting with ``_``, and ``format``
only with a literal format string whose widths are small and written (no ``*``), and no
repetition of constants beyond ``MAX_OUTPUT`` characters. At render time, the sandbox refuses a
string or list repeated, or a ``%`` / ``format`` padding, beyond ``MAX_OUTPUT`` characters
(the operands come from facts, i.e. from the trace), and the whole output is capped.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

MAX_OUTPUT = 20_000  # characters a template may build (the longest shipped explanation is < 1,500)
MAX_WIDTH = 64  # the widest field a printf-style format may ask for

ALLOWED_NODES = (
    nodes.Template, nodes.Output, nodes.TemplateData, nodes.Const, nodes.Name, nodes.Getattr, nodes.Getitem,
    nodes.Slice, nodes.Filter, nodes.Test, nodes.If, nodes.CondExpr, nodes.And, nodes.Or, nodes.Not, nodes.Compare,
    nodes.Operand, nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Neg, nodes.Pos,
    nodes.Concat, nodes.List, nodes.Tuple,
)  # fmt: skip
ALLOWED_FILTERS = {
    "ms", "pct", "mb", "us", "format", "int", "float", "round", "abs", "join", "replace", "upper", "lower",
    "title", "capitalize", "trim", "default", "d", "first", "last", "length", "count", "min", "max", "sum",
    "sort", "unique", "list", "string", "e", "escape",
}  # fmt: skip
ALLOWED_TESTS = {"none", "defined", "undefined", "number", "string", "sequence", "mapping", "true", "false",
                 "integer", "float", "even", "odd", "eq", "ne", "lt", "le", "gt", "ge", "in"}  # fmt: skip
_WIDTH_RE = re.compile(r"%[-+ #0]*(\*|\d*)(?:\.(\*|\d+))?[a-zA-Z%]")
_PARSER = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def _format_ok(fmt: str) -> bool:
    """Widths and precisions written in the format and small (a ``*`` takes them from the
    operands, which come from the trace)."""
    return all("*" not in (w, p) and int(w or 0) <= MAX_WIDTH and int(p or 0) <= MAX_WIDTH
               for w, p in _WIDTH_RE.findall(fmt))  # fmt: skip


def _static_size(n: nodes.Node) -> int | None:
    """Characters (strings) or elements plus their characters (lists) a constant expression
    builds, when the template alone tells; None when it depends on the facts."""
    if isinstance(n, nodes.Const):
        return len(n.value) if isinstance(n.value, str) else None
    if isinstance(n, (nodes.List, nodes.Tuple)):
        return len(n.items) + sum(_static_size(x) or 0 for x in n.items)
    if isinstance(n, nodes.Mul):
        for seq, k in ((n.left, n.right), (n.right, n.left)):
            size = _static_size(seq)
            if size is not None and isinstance(k, nodes.Const) and isinstance(k.value, int):
                return size * max(k.value, 0)
    if isinstance(n, (nodes.Add, nodes.Concat)):
        parts = [n.left, n.right] if isinstance(n, nodes.Add) else list(n.nodes)
        sizes = [_static_size(x) for x in parts]
        return sum(sizes) if all(x is not None for x in sizes) else None
    return None


def check_template(text: str) -> list[str]:
    """What is not allowed in a case's explanation template (empty when it is fine)."""
    try:
        ast = _PARSER.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return [f"template error: {exc.message}"]
    problems: list[str] = []
    for n in ast.find_all(nodes.Node):
        if not isinstance(n, ALLOWED_NODES):
            what = {"Call": "a function or method call", "Pow": "'**'", "For": "a loop", "Assign": "an assignment"}
            problems.append(f"template uses {what.get(type(n).__name__, type(n).__name__)}, which explanations may not")
        elif isinstance(n, nodes.Filter):
            if n.name not in ALLOWED_FILTERS:
                problems.append(f"template uses the filter {n.name!r}, which explanations may not")
            elif n.name == "format":
                fmt = n.node
                if not (isinstance(fmt, nodes.Const) and isinstance(fmt.value, str) and _format_ok(fmt.value)):
                    problems.append(f"'format' needs a literal format string with written widths up to {MAX_WIDTH} (no '*')")
        elif isinstance(n, nodes.Test) and n.name not in ALLOWED_TESTS:
            problems.append(f"template uses the test {n.name!r}, which explanations may not")
        elif isinstance(n, nodes.Getattr) and n.attr.startswith("_"):
            problems.append(f"template reads the attribute {n.attr!r}: names starting with '_' are not allowed")
        elif isinstance(n, nodes.Const) and isinstance(n.value, str) and "%" in n.value and not _format_ok(n.value):
            problems.append(f"template holds a format string with a width above {MAX_WIDTH} or taken from its operands ('*')")
        elif isinstance(n, nodes.Mul) and (_static_size(n) or 0) > MAX_OUTPUT:
            problems.append(f"template repeats a value to more than {MAX_OUTPUT} characters")
        elif isinstance(n, nodes.Const) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool) \
                and abs(n.value) > 1e18:  # fmt: skip
            problems.append("template holds a number above 1e18")
    return sorted(set(problems))


def _size(v: Any) -> int | None:
    """A string's characters; a list's elements plus the characters of its strings (a list of one
    long string repeated is as large as the string repeated, once joined)."""
    if isinstance(v, (str, bytes)):
        return len(v)
    if isinstance(v, (list, tuple)):
        return len(v) + sum(len(x) for x in v if isinstance(x, (str, bytes)))
    return None


def _bounded_mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        size = _size(seq)
        if size is not None and isinstance(n, int) and size * max(n, 0) > MAX_OUTPUT:
            raise SecurityError(f"a template repeated a value to more than {MAX_OUTPUT} characters")
    return operator.mul(a, b)


def _bounded_mod(a: Any, b: Any) -> Any:
    if isinstance(a, str) and not _format_ok(a):
        raise SecurityError(f"a template formatted a field wider than {MAX_WIDTH}")
    out = operator.mod(a, b)
    if _size(out) is not None and len(out) > MAX_OUTPUT:
        raise SecurityError(f"a template built more than {MAX_OUTPUT} characters")
    return out


def _bounded_pow(a: Any, b: Any) -> Any:
    raise SecurityError("'**' is not allowed in templates")


class BoundedSandbox(SandboxedEnvironment):
    """jinja2's sandbox (no attribute access to internals, ranges capped) that also refuses
    repetitions, paddings and output beyond ``MAX_OUTPUT`` characters."""

    intercepted_binops = frozenset(["*", "%", "**"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fmt = self.filters["format"]

        def bounded_format(value: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(value, str) and not _format_ok(value):
                raise SecurityError(f"a template formatted a field wider than {MAX_WIDTH}")
            return fmt(value, *args, **kwargs)

        self.filters["format"] = bounded_format

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            return _bounded_mul(left, right)
        if operator_ == "%":
            return _bounded_mod(left, right)
        if operator_ == "**":
            return _bounded_pow(left, right)
        return super().call_binop(context, operator_, left, right)

    def from_string(self, source: Any, globals: Any = None, template_class: Any = None) -> Any:  # noqa: A002
        template = super().from_string(source, globals, template_class)
        render = template.render

        def bounded_render(*args: Any, **kwargs: Any) -> str:
            out = render(*args, **kwargs)
            if len(out) > MAX_OUTPUT:
                raise SecurityError(f"a template built more than {MAX_OUTPUT} characters")
            return out

        template.render = bounded_render  # type: ignore[method-assign]
        return template
