"""The JSON Schemas in docs/ are what the code produces (regenerate with `hermes schema ...`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hermes_kb.facts import FACT_TYPES, facts_json_schema, parse_fact
from hermes_kb.kb.models import Case, Rule
from hermes_kb.advisor.report import Report

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    "name, schema",
    [
        ("facts.schema.json", lambda: facts_json_schema()),
        ("report.schema.json", lambda: Report.model_json_schema()),
        ("rule.schema.json", lambda: Rule.model_json_schema(by_alias=True)),
        ("case.schema.json", lambda: Case.model_json_schema(by_alias=True)),
    ],
)
def test_docs_schema_is_current(name, schema):
    on_disk = json.loads((DOCS / name).read_text(encoding="utf-8"))
    assert on_disk == json.loads(json.dumps(schema())), f"docs/{name} is stale: run hermes schema ... -o docs/{name}"


IDENTIFIERS = ("rank", "step", "stream", "device")  # numbers that name things rather than measure them


def test_every_numeric_fact_field_has_a_unit():
    missing = []
    for kind, cls in FACT_TYPES.items():
        for name, field in cls.model_fields.items():
            ann = str(field.annotation)
            ident = name in IDENTIFIERS or name.endswith(("_rank", "_step", "_id"))
            # whole words: a Literal value such as 'checkpoint' is not an int
            if re.search(r"\b(float|int)\b", ann) and not ident and "list" not in ann and "dict" not in ann:
                extra = field.json_schema_extra or {}
                if "unit" not in extra:
                    missing.append(f"{kind}.{name}")
    assert not missing, missing


def test_facts_round_trip_through_json():
    from hermes_kb.analysis import analyze

    facts = analyze(Path(__file__).resolve().parents[1] / "examples/traces/cpu_dataloader_bound.json.gz")
    for f in facts:
        again = parse_fact(json.loads(f.model_dump_json()))
        assert again == f
