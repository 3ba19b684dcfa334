"""The checked knowledge base kept on disk as JSON (hermes_kb/kb/cache.py): read back only while
nothing it depended on changed, never trusted when damaged, never written for a broken KB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hermes_kb.kb import loader
from hermes_kb.kb.loader import KbError, kb_dirs, load_kb


@pytest.fixture
def kb_copy(tmp_path, monkeypatch):
    """A private cache directory and a private copy of rules/ and cases/."""
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HERMES_KB_CACHE", raising=False)
    rules, cases = kb_dirs()
    shutil.copytree(rules, tmp_path / "rules")
    shutil.copytree(cases, tmp_path / "cases")
    return tmp_path / "rules", tmp_path / "cases"


@pytest.fixture
def full_loads(monkeypatch):
    """How many times the files were parsed and checked (not served from the cache)."""
    calls = []
    real = loader._load_files

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(loader, "_load_files", counted)
    return calls


def _dump(kb):
    return [(e.path, e.item.model_dump(by_alias=True)) for e in (*kb.rules, *kb.cases)], kb.params


def _cache_files(tmp_path):
    return sorted((tmp_path / "cache").glob("kb-*.json"))


def test_second_load_comes_from_the_cache_and_equals_the_checked_one(kb_copy, full_loads, tmp_path):
    first = load_kb(*kb_copy)
    assert len(full_loads) == 1 and len(_cache_files(tmp_path)) == 1
    second = load_kb(*kb_copy)
    assert len(full_loads) == 1  # not parsed or checked again
    assert _dump(second) == _dump(first)
    assert len(second.rules) == len(first.rules) > 0 and len(second.cases) == len(first.cases) > 100


def test_overrides_apply_on_a_cached_kb_and_are_still_checked(kb_copy, full_loads):
    load_kb(*kb_copy)
    kb = load_kb(*kb_copy, overrides={"C-IO-001": {"min_processing": 0.5}})
    assert len(full_loads) == 1
    assert kb.params["C-IO-001"]["min_processing"] == 0.5
    with pytest.raises(Exception, match="C-IO-001.no_such_param: unknown parameter"):
        load_kb(*kb_copy, overrides={"C-IO-001": {"no_such_param": 1}})
    with pytest.raises(Exception, match="C-NOPE-001: no rule or case has this id"):
        load_kb(*kb_copy, overrides={"C-NOPE-001": {"x": 1}})


def test_an_edited_file_is_parsed_and_checked_again(kb_copy, full_loads, tmp_path):
    load_kb(*kb_copy)
    f = next(kb_copy[1].glob("io/C-IO-001-*.yaml"))
    text = f.read_text()
    f.write_text(text.replace("title:", "title: EDITED", 1))
    kb = load_kb(*kb_copy)
    assert len(full_loads) == 2
    assert kb.by_id("C-IO-001").item.title.startswith("EDITED")
    f.write_text(text.replace("id: C-IO-001", "id: C-IO-001\nno_such_key: 1", 1))  # now invalid
    with pytest.raises(KbError, match="no_such_key"):
        load_kb(*kb_copy)


def test_a_removed_or_added_file_changes_the_fingerprint(kb_copy, full_loads):
    load_kb(*kb_copy)
    victim = next(kb_copy[1].glob("io/C-IO-002-*.yaml"))
    victim.unlink()
    kb = load_kb(*kb_copy)
    assert len(full_loads) == 2 and kb.by_id("C-IO-002") is None


def test_a_broken_kb_is_never_cached(kb_copy, tmp_path):
    f = next(kb_copy[0].glob("R-COMM-001*.yaml"))
    f.write_text(f.read_text() + "\n  bad: [\n")
    for _ in range(2):
        with pytest.raises(KbError):
            load_kb(*kb_copy)
    assert _cache_files(tmp_path) == []


@pytest.mark.parametrize("damage", ["garbage", "other_fingerprint", "invalid_item", "foreign_name", "not_a_list"])
def test_a_damaged_cache_file_is_ignored(kb_copy, full_loads, tmp_path, damage):
    want = _dump(load_kb(*kb_copy))
    (path,) = _cache_files(tmp_path)
    doc = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\x00{not json")
    else:
        if damage == "other_fingerprint":
            doc["fingerprint"] = "0" * 64
        elif damage == "invalid_item":
            doc["items"][3]["data"]["status"] = {"not": "a status"}
        elif damage == "foreign_name":
            doc["items"][0]["name"] = "../../elsewhere.yaml"
        else:
            doc["items"] = {"a": 1}
        path.write_text(json.dumps(doc))
    assert _dump(load_kb(*kb_copy)) == want
    assert len(full_loads) == 2  # parsed and checked again, and the cache rewritten
    assert _dump(load_kb(*kb_copy)) == want and len(full_loads) == 2


def test_non_string_keys_survive_the_cache(kb_copy, full_loads):
    """C-PAR-006's examples map stage numbers (ints) to times: JSON alone would make them strings."""
    first = load_kb(*kb_copy).by_id("C-PAR-006").item.examples.model_dump()
    again = load_kb(*kb_copy).by_id("C-PAR-006").item.examples.model_dump()
    assert len(full_loads) == 1 and again == first
    stages = first["fire"][0]["facts"][0]["per_stage_compute_us"]
    assert set(stages) == {0, 1}


def test_cache_off_and_unwritable_directory(kb_copy, full_loads, tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_KB_CACHE", "off")
    load_kb(*kb_copy)
    load_kb(*kb_copy)
    assert len(full_loads) == 2 and not (tmp_path / "cache").exists()
    monkeypatch.delenv("HERMES_KB_CACHE")
    (tmp_path / "blocked").write_text("a file where the directory would be")
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path / "blocked" / "cache"))
    load_kb(*kb_copy)  # no error: the cache is only an optimisation
    assert len(full_loads) == 3


def test_kb_list_from_the_cache_equals_the_checked_list_and_builds_no_model(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HERMES_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HERMES_KB_CACHE", None)

    def kb_list(*extra, off=False, importtime=False):
        e = {**env, **({"HERMES_KB_CACHE": "off"} if off else {})}
        cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "hermes_kb", "kb", "list", *extra]
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, check=True)
        return r.stdout, r.stderr

    checked_json, _ = kb_list("--format", "json", off=True)
    kb_list()  # the first command checks the KB and writes the cache
    cached_json, imports = kb_list("--format", "json", importtime=True)
    assert json.loads(cached_json) == json.loads(checked_json) and len(json.loads(cached_json)) > 150
    assert "hermes_kb.kb.models" not in imports and "hermes_kb.facts" not in imports  # rows straight from the cache
    assert kb_list()[0] == kb_list(off=True)[0]
