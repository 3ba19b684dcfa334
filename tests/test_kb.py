"""The knowledge base: loading and checking, both engines agreeing on every example, probes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermes_kb.kb.conditions import Expr, Leaf, compare, evaluate, normalize
from hermes_kb.facts.flat import sanitize_number
from hermes_kb.kb.engine import durable_available, infer
from hermes_kb.kb.matches import prepare, python_matches
from hermes_kb.kb.loader import KbError, load_kb
from hermes_kb.kb.testing import run_examples

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_kb_loads_and_every_example_passes_on_both_engines():
    kb = load_kb()
    assert len(kb.rules) >= 8 and len(kb.cases) >= 1
    report = run_examples(kb)
    assert report.results, "no examples ran"
    engines = set(report.results[0].fired)
    assert engines == ({"python", "durable"} if durable_available() else {"python"})
    bad = [(r.item_id, r.name, r.fired, r.agree) for r in report.failures]
    assert not bad
    # every rule and case contributed its examples, and thresholds were probed
    assert {r.item_id for r in report.results} == {e.item.id for e in (*kb.rules, *kb.cases)}
    assert any(r.name.startswith("probe:") for r in report.results)


@pytest.mark.skipif(not durable_available(), reason="durable-rules not importable here")
def test_durable_and_python_agree_on_real_facts():
    from hermes_kb.analysis import analyze

    kb = load_kb()
    facts = analyze(ROOT / "examples/traces/cpu_dataloader_bound.json.gz")
    a = infer(kb, facts, "python")
    b = infer(kb, facts, "durable")
    assert [m.key() for m in a.bottlenecks] == [m.key() for m in b.bottlenecks]
    assert [m.key() for m in a.cases] == [m.key() for m in b.cases]
    assert a.cases, "the example's data-loader case must fire"


@pytest.mark.skipif(not durable_available(), reason="durable-rules not importable here")
def test_durable_holds_only_the_kinds_its_patterns_name(monkeypatch):
    """Facts of a kind no pattern names are not asserted (they match nothing): the same matches
    as the Python evaluator, which sees every fact, with fewer facts in the engine."""
    from hermes_kb.analysis import analyze
    from hermes_kb.kb import durable_engine
    from hermes_kb.kb.conditions import compile_patterns

    kb = load_kb()
    facts = analyze(ROOT / "examples/traces/cpu_dataloader_bound.json.gz")
    host = durable_engine._host()
    seen: list[str] = []
    real = host.assert_fact
    monkeypatch.setattr(host, "assert_fact", lambda name, msg: seen.append(msg["kind"]) or real(name, msg))
    b = infer(kb, facts, "durable")
    a = infer(kb, facts, "python")
    assert [m.key() for m in a.cases] == [m.key() for m in b.cases] and a.cases
    named = {p.kind for e in (*kb.active_rules(), *kb.active_cases())
             for p in compile_patterns(getattr(e.item, "when", None) or getattr(e.item, "conditions", None))}
    assert seen and set(seen) <= named
    assert "whatif" not in seen and len(seen) < 2 * len(facts)  # every fact twice (rules, then cases) before


def _write(tmp: Path, rel: str, text: str) -> Path:
    """A KB file, named for the id it holds as the loader requires (rules/a.yaml holding R-TST-001
    is written as rules/R-TST-001-a.yaml)."""
    p = named_like_the_loader_wants(tmp / rel, textwrap.dedent(text))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return p


def named_like_the_loader_wants(p: Path, text: str) -> Path:
    m = re.search(r"^id:\s*(\S+)", text, re.M)
    if m and p.suffix == ".yaml" and p.parent.name != "." and not p.stem.startswith(m.group(1)):
        return p.with_name(f"{m.group(1)}-{p.name}")
    return p


RULE = """\
id: R-TST-001
title: t
status: experimental
description: d
parameters:
  th: {default: 0.5, description: x}
when:
  - fact: dataloader_wait
    as: d
    where:
      - {field: data_share_ratio, op: ">=", param: th}
emit:
  category: io
  component: data_loader
  share: {binding: d, field: data_share_ratio}
examples:
  fire: [{facts: [{kind: dataloader_wait, rank: 0, data_share_ratio: 0.9}]}]
  no_fire: [{facts: [{kind: dataloader_wait, rank: 0, data_share_ratio: 0.1}]}]
"""


def test_errors_name_file_line_column_and_key(tmp_path):
    bad = RULE.replace("data_share_ratio, op", "no_such_field, op").replace('op: ">="', 'op: "~="', 0)
    _write(tmp_path, "rules/a.yaml", bad)
    _write(tmp_path, "rules/b.yaml", RULE.replace("fact: dataloader_wait", "fact: not_a_fact").replace("R-TST-001", "R-TST-002"))
    _write(tmp_path, "rules/c.yaml", RULE.replace("title: t", "title: [unclosed").replace("R-TST-001", "R-TST-003"))
    _write(tmp_path, "rules/d.yaml", RULE)  # duplicate id of a.yaml? a.yaml fails first; d is R-TST-001 valid
    (tmp_path / "cases").mkdir()
    with pytest.raises(KbError) as info:
        load_kb(tmp_path / "rules", tmp_path / "cases")
    problems = info.value.problems
    text = "\n".join(problems)
    assert any("a.yaml:11:" in p and "no field 'no_such_field'" in p for p in problems), text
    assert any("b.yaml:8:5: when.0.fact: unknown fact kind 'not_a_fact'" in p for p in problems), text
    assert any("c.yaml:3:7:" in p and "invalid YAML" in p for p in problems), text
    assert any("d.yaml:1:1: id: duplicate id 'R-TST-001'" in p for p in problems), text


def test_undeclared_parameter(tmp_path):
    _write(tmp_path, "rules/e.yaml", RULE.replace('op: ">=", param: th', 'op: ">=", param: nope'))
    (tmp_path / "cases").mkdir()
    with pytest.raises(KbError) as info:
        load_kb(tmp_path / "rules", tmp_path / "cases")
    assert any("e.yaml:11:" in p and "parameter 'nope' is not declared" in p for p in info.value.problems)


def test_schema_error_points_at_the_key(tmp_path):
    path = _write(tmp_path, "rules/a.yaml", RULE.replace('op: ">="', 'op: "=>"'))
    (tmp_path / "cases").mkdir()
    with pytest.raises(KbError) as info:
        load_kb(tmp_path / "rules", tmp_path / "cases")
    p = info.value.problems[0]
    assert p.startswith(f"{path}:11:") and "op" in p


def test_yaml_is_loaded_safely(tmp_path):
    _write(tmp_path, "rules/a.yaml", "!!python/object/apply:os.system ['echo pwned']\n")
    (tmp_path / "cases").mkdir()
    with pytest.raises(KbError) as info:
        load_kb(tmp_path / "rules", tmp_path / "cases")
    assert "invalid YAML" in info.value.problems[0]


def test_duplicate_ids_are_an_error(tmp_path):
    _write(tmp_path, "rules/a.yaml", RULE)
    _write(tmp_path, "rules/b.yaml", RULE)
    (tmp_path / "cases").mkdir()
    with pytest.raises(KbError) as info:
        load_kb(tmp_path / "rules", tmp_path / "cases")
    assert any("duplicate id 'R-TST-001'" in p and "b.yaml:1:" in p for p in info.value.problems)


def test_overrides_change_thresholds(tmp_path):
    _write(tmp_path, "rules/a.yaml", RULE)
    (tmp_path / "cases").mkdir()
    facts = [{"kind": "dataloader_wait", "rank": 0, "data_share_ratio": 0.3}]
    kb = load_kb(tmp_path / "rules", tmp_path / "cases")
    assert not python_matches(kb.rules, prepare(facts), kb, "when")
    kb2 = load_kb(tmp_path / "rules", tmp_path / "cases", overrides={"R-TST-001": {"th": 0.2}})
    assert len(python_matches(kb2.rules, prepare(facts), kb2, "when")) == 1


def test_condition_semantics():
    # missing fields compare false, and not() is pushed to the leaves (so it stays false)
    e = normalize(Expr.model_validate({"not": {"field": "x", "op": ">", "value": 3}}))
    assert evaluate(e, {"x": 2}, {}, {}) is True
    assert evaluate(e, {}, {}, {}) is False
    assert compare("ncclKernel_AllReduce", "matches", "nccl.*") and not compare("xnccl", "matches", "nccl")
    assert compare(3, "in", [1, 3]) and compare(None, "missing", None) and not compare(0, "missing", None)
    any_ = normalize(Expr.model_validate({"any": [{"field": "a", "op": "==", "value": 1}, {"field": "b", "op": "exists"}]}))
    assert evaluate(any_, {"b": 0}, {}, {}) and not evaluate(any_, {"a": 2}, {}, {})
    with pytest.raises(ValueError):
        Leaf(field="x", op=">", value=1, param="p")


def test_numbers_are_sanitised_for_the_engine():
    assert sanitize_number(float("nan")) is None and sanitize_number(float("inf")) is None
    assert sanitize_number(1e-5) == 0.0 and sanitize_number(2.5e16) == 25_000_000_000_000_000
    assert isinstance(sanitize_number(2.5e16), int) and sanitize_number(0.25) == 0.25
    assert sanitize_number(2**70) == 2**63 - 1


def test_kb_cli_commands():
    run = lambda *a: subprocess.run([sys.executable, "-m", "hermes_kb.cli", "kb", *a], capture_output=True, text=True)  # noqa: E731
    v = run("validate")
    assert v.returncode == 0 and v.stdout.startswith("ok:")
    t = run("test")
    assert t.returncode == 0 and " passed, 0 failed" in t.stdout
    lst = json.loads(run("list", "--format", "json").stdout)
    assert any(r["id"] == "C-IO-001" for r in lst)
    show = run("show", "C-IO-001")
    assert "slow_data_processing" in show.stdout
    ex = run("explain", "C-IO-001", str(ROOT / "examples/traces/cpu_dataloader_bound.json.gz"))
    assert ex.returncode == 0 and "C-IO-001 FIRES" in ex.stdout and "iterator == 'single_process': 6/6 pass" in ex.stdout
    missing = run("show", "C-NOPE-999")
    assert missing.returncode != 0 and "no rule or case" in missing.stderr


@pytest.mark.skipif(not durable_available(), reason="durable-rules not importable here")
def test_rank_local_items_run_a_group_of_ranks_at_a_time(monkeypatch, shared):
    """On a large job the rules and cases whose bindings all join on rank see a group of ranks at
    a time: the same matches as one run over every fact, and as the Python evaluator."""
    from hermes_kb.analysis import analyze
    from hermes_kb.kb import durable_engine, matches

    kb = load_kb()
    facts = analyze(shared / "param/dlrm_kineto_8rank", max_workers=1)
    whole = infer(kb, facts, "durable")
    groups: list[int] = []
    real = durable_engine._fire

    def counted(host, name, group, sid):
        groups.append(len(group))
        return real(host, name, group, sid)

    monkeypatch.setattr(durable_engine, "PARTITION_MIN_FACTS", 10)
    monkeypatch.setattr(matches, "PARTITION_RANKS", 3)
    monkeypatch.setattr(durable_engine, "_fire", counted)
    parted = infer(kb, facts, "durable")
    python = infer(kb, facts, "python")
    assert len(groups) >= 2 * (1 + 3)  # rules and cases: all facts once, then groups of 3, 3, 2 ranks (+ rankless)
    for m in ("bottlenecks", "cases"):
        assert [x.key() for x in getattr(parted, m)] == [x.key() for x in getattr(whole, m)] == [x.key() for x in getattr(python, m)]
    assert parted.cases


def test_a_file_not_named_for_its_id_is_refused(tmp_path):
    """A rule or case is found from its id in one step (issue 31): the loader refuses a file whose
    name does not start with the id it holds, naming the file and what the name should be."""
    rules, cases = tmp_path / "rules", tmp_path / "cases"
    rules.mkdir()
    cases.mkdir()
    (rules / "communication.yaml").write_text(textwrap.dedent(RULE))
    with pytest.raises(KbError) as err:
        load_kb(rules, cases)
    msg = str(err.value)
    assert "communication.yaml:" in msg and "must start with the id: R-TST-001-<short-title>.yaml" in msg
    (rules / "communication.yaml").rename(rules / "R-TST-001-communication.yaml")
    kb = load_kb(rules, cases)
    assert [e.item.id for e in kb.rules] == ["R-TST-001"]


def test_every_shipped_item_is_found_from_its_id():
    from hermes_kb.kb.loader import find_item_file

    kb = load_kb()
    for e in (*kb.rules, *kb.cases):
        assert find_item_file(e.item.id) == Path(e.path).resolve() or str(find_item_file(e.item.id)) == e.path, e.item.id
