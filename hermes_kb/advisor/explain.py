"""A case's explanation template rendered on one match's facts (jinja2's sandbox, bounded)."""

from __future__ import annotations

from typing import Any

import jinja2

from ..kb.matches import Match
from ..kb.models import Case
from ..kb.templates import BoundedSandbox


class _Obj(dict):
    """A flat fact as template variables: attribute access, missing fields render empty."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def _ms(v: Any) -> str:
    return f"{float(v) / 1e3:,.1f} ms" if isinstance(v, (int, float)) else "?"


def _pct(v: Any) -> str:
    return f"{float(v):.0%}" if isinstance(v, (int, float)) else "?"


def _mb(v: Any) -> str:
    return f"{float(v) / 1e6:,.1f} MB" if isinstance(v, (int, float)) else "?"


# jinja2's sandbox that also bounds repetition, padding and output size (kb/templates.py, issue 18)
_ENV = BoundedSandbox(undefined=jinja2.ChainableUndefined, autoescape=False)
_ENV.filters.update(ms=_ms, pct=_pct, mb=_mb, us=lambda v: f"{float(v):,.1f} µs" if isinstance(v, (int, float)) else "?")


def explain(case: Case, m: Match, originals: dict | None = None) -> str:
    def fields(flat: dict) -> _Obj:
        # the engines see scalars only; the template also gets the fact's lists (e.g. spike steps)
        orig = (originals or {}).get(flat.get("_id"))
        full = orig.model_dump(exclude={"evidence"}) if orig is not None else {}
        return _Obj({**{k: v for k, v in full.items() if isinstance(v, list)}, **flat})

    try:
        return _ENV.from_string(case.explanation).render(**{k: fields(v) for k, v in m.bindings.items()}).strip()
    except jinja2.TemplateError as exc:
        return f"{case.title} ({exc})"


__all__ = ["explain"]
