"""``hermes mcp`` (issue 35) driven by the MCP SDK's own in-process client: the tools listed,
each called on the bundled example and on real traces of ../shared/data (HERMES_SHARED_DATA
overrides where they are), their numbers compared with what ``hermes advise --format json``,
``hermes analyze --format json``, ``hermes kb explain``, ``hermes diff --format json`` and
``hermes monitor status --format json`` print on the same input; paths outside the roots,
links leaving them and FIFOs refused; the time limit; paging; the resources."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("mcp")

from conftest import SHARED
from mcp import Client

from hermes_kb.assist.server import build_server
from hermes_kb.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/traces/cpu_dataloader_bound.json.gz"
RUN = ROOT / "tests/data/monitor_runs/two_ranks"
DATA = SHARED if SHARED.is_dir() else Path(os.environ.get("HERMES_SHARED_DATA", "/nonexistent"))
BIG = 10**8  # no paging where whole answers are compared


@pytest.fixture
def real() -> Path:
    if not DATA.is_dir():
        pytest.skip("../shared/data is absent (outside the project's CI; HERMES_SHARED_DATA names another place)")
    return DATA.resolve()  # the server reads the resolved path (what it checked), and names that in the report


def roots(*extra: Path) -> list[str]:
    return [str(ROOT / "examples"), str(ROOT / "tests/data"), *(str(p) for p in extra)]


def calls(server, *requests: tuple[str, dict]) -> list:
    async def go():
        async with Client(server) as c:
            return [await c.call_tool(name, args) for name, args in requests]

    return asyncio.run(go())


def call(server, name: str, args: dict) -> dict:
    (r,) = calls(server, (name, args))
    assert not r.is_error, r.content[0].text
    return json.loads(r.content[0].text)


def error(server, name: str, args: dict) -> str:
    (r,) = calls(server, (name, args))
    assert r.is_error, r.content[0].text[:300]
    return r.content[0].text


def cli_json(*args: str):
    r = CliRunner().invoke(app, list(args), prog_name="hermes")
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def strip(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in i.items() if k != "provenance"} for i in items]


def test_the_tools_are_listed_with_their_arguments():
    async def go():
        async with Client(build_server(roots())) as c:
            return await c.list_tools()

    tools = {t.name: t for t in asyncio.run(go()).tools}
    assert set(tools) == {"advise", "breakdown", "facts", "explain", "whatif", "diff", "kb_search", "monitor_status"}
    assert {"path", "target", "pattern", "fraction", "rank"} <= set(tools["whatif"].input_schema["properties"])
    assert {"kinds", "rank", "step", "offset"} <= set(tools["facts"].input_schema["properties"])


def _same_report(got: dict, want: dict) -> None:
    assert strip(got["findings"]) == want["findings"]
    rep = got["report"]
    for key in ("summary", "combined", "unexplained", "inputs", "kb"):
        assert rep[key] == want[key], key
    for f in got["findings"]:
        assert f["provenance"] and all("fact" in p for p in f["provenance"])


def test_advise_gives_the_numbers_of_advise_json_on_the_example():
    got = call(build_server(roots(), max_bytes=BIG), "advise", {"path": str(EXAMPLE), "fmt": "json"})
    _same_report(got, cli_json("advise", "--format", "json", str(EXAMPLE)))
    assert got["findings"], "the example is data-loader bound: a finding is expected"


def test_advise_on_real_traces(real):
    trace = real / "kineto_2021/resnet50_num_workers_4.pt.trace.json.gz"
    dlrm = real / "param/dlrm_kineto_8rank"
    server = build_server(roots(real), max_bytes=BIG)
    _same_report(call(server, "advise", {"path": str(trace), "fmt": "json"}), cli_json("advise", "--format", "json", str(trace)))
    # eight rank files: streamed rank by rank, as the CLI does
    _same_report(call(server, "advise", {"path": str(dlrm), "fmt": "json"}), cli_json("advise", "--format", "json", str(dlrm)))
    brief = call(server, "advise", {"path": str(trace)})  # the default, brief format, keeps the numbers
    want = cli_json("advise", "--format", "json", str(trace))["findings"]
    assert [(f["case_id"], f["expected_speedup"]) for f in brief["findings"]] == \
        [(f["case_id"], f["expected_speedup"]) for f in want]  # fmt: skip


def test_facts_and_breakdown_are_analyze_json(real):
    trace = real / "kineto_2021/resnet50_num_workers_4.pt.trace.json.gz"
    server = build_server(roots(real), max_bytes=BIG)
    want = cli_json("analyze", "--format", "json", str(trace))
    got = call(server, "facts", {"path": str(trace)})
    assert strip(got["items"]) == want
    p = got["items"][0]["provenance"]
    assert {"fact", "rank", "step", "evidence_window_us"} <= set(p)
    steps = call(server, "facts", {"path": str(trace), "kinds": ["step_time"], "step": want[0].get("step")})
    assert all(f["kind"] == "step_time" for f in steps["items"])
    bd = call(server, "breakdown", {"path": str(trace)})
    assert strip(bd["items"]) == [f for f in want if f["kind"] in ("step_breakdown", "program_phases") and f["step"] is None]


def test_facts_on_the_example_and_a_run_dir():
    server = build_server(roots(), max_bytes=BIG)
    assert strip(call(server, "facts", {"path": str(EXAMPLE)})["items"]) == cli_json("analyze", "--format", "json", str(EXAMPLE))
    assert strip(call(server, "facts", {"path": str(RUN)})["items"]) == cli_json("analyze", "--format", "json", str(RUN))


def test_whatif_replays_as_analyze_does():
    server = build_server(roots(), max_bytes=BIG)
    facts = cli_json("analyze", "--format", "json", "--kind", "whatif", str(EXAMPLE))
    dl = next(f for f in facts if f["target"] == "dataloader")
    assert dl["replayed"]
    whole = call(server, "whatif", {"path": str(EXAMPLE), "target": "dataloader", "fraction": 1.0})
    assert whole["removed_us"] == pytest.approx(dl["removed_all_us"], rel=1e-9, abs=1e-6)
    assert whole["replay_base_us"] == dl["replay_base_us"]
    assert whole["replayed_span_us"] == pytest.approx(dl["replay_base_us"] - dl["removed_all_us"])
    assert whole["provenance"]["fact"] == "whatif" and whole["provenance"]["evidence_window_us"]
    part = call(server, "whatif", {"path": str(EXAMPLE), "target": "dataloader", "fraction": 0.4})
    assert 0 < part["removed_us"] < whole["removed_us"]
    by_name = call(server, "whatif", {"path": str(EXAMPLE), "pattern": r"DataLoader", "fraction": 1.0})
    assert by_name["removed_us"] > 0 and any("DataLoader" in e for e in by_name["events"])
    assert by_name["provenance"]["evidence_window_us"]
    assert "no what-if set" in error(server, "whatif", {"path": str(EXAMPLE), "target": "no_such_set"})


def test_whatif_on_a_real_rank(real):
    dlrm = real / "param/dlrm_kineto_8rank"
    server = build_server(roots(real), max_bytes=BIG)
    facts = [f for f in cli_json("analyze", "--format", "json", "--kind", "whatif", str(dlrm)) if f["rank"] == 1]
    done = [f for f in facts if f["replayed"]]
    assert done
    f = done[0]
    got = call(server, "whatif", {"path": str(dlrm), "rank": 1, "target": f["target"], "fraction": 1.0})
    assert got["removed_us"] == pytest.approx(f["removed_all_us"], rel=1e-9, abs=1e-6)


def test_explain_is_kb_explain():
    server = build_server(roots())
    got = call(server, "explain", {"case_id": "C-IO-001", "path": str(EXAMPLE)})
    r = CliRunner().invoke(app, ["kb", "explain", "C-IO-001", str(EXAMPLE)], prog_name="hermes")
    assert got["text"] == r.stdout.rstrip("\n").splitlines()
    assert got["conditions"] and all({"condition", "held", "seen"} <= set(c) for c in got["conditions"])
    assert got["fires"] is True and "FIRES" in got["verdict"]  # the example is C-IO-001's own trace
    assert call(server, "explain", {"case_id": "C-IO-003", "path": str(EXAMPLE)})["fires"] is False


def test_diff_is_diff_json(real):
    a = real / "kineto_2021/resnet50_num_workers_0.pt.trace.json.gz"
    b = real / "kineto_2021/resnet50_num_workers_4.pt.trace.json.gz"
    got = call(build_server(roots(real), max_bytes=BIG), "diff", {"before": str(a), "after": str(b)})
    want = cli_json("diff", "--format", "json", str(a), str(b))
    assert got["items"] == want["ranks"]
    assert got["provenance"]["fact"] == "step_breakdown"
    assert {k: v for k, v in got.items() if k not in ("items", "page", "provenance")} == {k: v for k, v in want.items() if k != "ranks"}


def test_kb_search_and_monitor_status():
    server = build_server(roots())
    hits = call(server, "kb_search", {"text": "num_workers", "category": "io"})["items"]
    assert "C-IO-001" in [h["case_id"] for h in hits] and all(h["category"] == "io" for h in hits)
    assert hits[0]["fixes"]
    got = call(server, "monitor_status", {"run_dir": str(RUN)})
    want = cli_json("monitor", "status", "--format", "json", str(RUN))
    assert [{k: r[k] for k in want[0]} for r in got["items"]] == want
    assert all("triggers" in r and "capture_files" in r for r in got["items"])


def test_paths_outside_the_roots_links_and_fifos_are_refused(tmp_path):
    inside = tmp_path / "root"
    inside.mkdir()
    (inside / "out").symlink_to("/etc/passwd")
    os.mkfifo(inside / "pipe")
    sub = inside / "dir"
    sub.mkdir()
    (sub / "t.json").symlink_to("/etc/hostname")
    server = build_server([str(inside)])
    assert "outside the server's roots" in error(server, "advise", {"path": str(EXAMPLE)})
    assert "outside the server's roots" in error(server, "facts", {"path": "/etc/passwd"})
    assert "outside the server's roots" in error(server, "advise", {"path": str(inside / ".." / "x")})
    assert "leaves the server's roots" in error(server, "advise", {"path": str(inside / "out")})
    assert "FIFO" in error(server, "advise", {"path": str(inside / "pipe")})
    assert "outside the roots" in error(server, "facts", {"path": str(sub)})
    assert "outside the server's roots" in error(server, "diff", {"before": str(EXAMPLE), "after": str(EXAMPLE)})
    assert "outside the server's roots" in error(server, "monitor_status", {"run_dir": "/tmp"})


def test_the_time_limit_abandons_the_work():
    msg = error(build_server(roots(), timeout_s=0.05), "advise", {"path": str(EXAMPLE)})
    assert "time limit" in msg


def test_long_answers_are_paged():
    whole = call(build_server(roots(), max_bytes=BIG), "facts", {"path": str(EXAMPLE)})["items"]
    server = build_server(roots(), max_bytes=8000)
    items, offset, pages = [], 0, 0
    while offset is not None:
        got = call(server, "facts", {"path": str(EXAMPLE), "offset": offset})
        assert got["page"]["total"] == len(whole)
        items += got["items"]
        offset = got["page"]["next_offset"]
        pages += 1
    assert pages > 1 and items == whole


def test_resources():
    server = build_server(roots(), max_bytes=BIG)

    async def go():
        async with Client(server) as c:
            listed = [str(r.uri) for r in (await c.list_resources()).resources]
            templates = [t.uri_template for t in (await c.list_resource_templates()).resource_templates]
            rel = EXAMPLE.relative_to(ROOT / "examples")
            js = (await c.read_resource(f"hermes://report/json/{rel}")).contents[0].text
            md = (await c.read_resource(f"hermes://report/md/{rel}")).contents[0].text
            case = (await c.read_resource("hermes://case/C-IO-001")).contents[0].text
            schema = (await c.read_resource("hermes://schema/report")).contents[0].text
            return listed, templates, js, md, case, schema

    listed, templates, js, md, case, schema = asyncio.run(go())
    assert "hermes://schema/facts" in listed and "hermes://case/{case_id}" in templates
    assert json.loads(js)["findings"] == cli_json("advise", "--format", "json", str(EXAMPLE))["findings"]
    assert md.startswith("# hermes report")
    assert case.startswith("id: C-IO-001") or "C-IO-001" in case.splitlines()[0]
    assert json.loads(schema)["title"] == "Report"


def test_hermes_mcp_without_the_extra_names_the_install(monkeypatch):
    import importlib.util

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real_find(name, *a))
    r = CliRunner().invoke(app, ["mcp", "--root", str(ROOT)], prog_name="hermes")
    assert r.exit_code == 7
    assert "pip install 'hermes-kb[mcp]'" in r.stderr


def test_a_root_reached_through_a_link_and_relative_paths(tmp_path):
    from hermes_kb.assist.safety import RefusedPath, Roots

    real = tmp_path / "data"
    real.mkdir()
    (real / "t.json").write_text("{}")
    (tmp_path / "alias").symlink_to(real)
    roots = Roots([str(tmp_path / "alias")])
    assert roots.check(str(tmp_path / "alias" / "t.json")) == str((real / "t.json").resolve())
    assert roots.check(str(real / "t.json")) == str((real / "t.json").resolve())  # the resolved root too
    assert roots.check("t.json") == str((real / "t.json").resolve())  # relative: under a root
    with pytest.raises(RefusedPath, match="outside"):
        roots.check("../alias/../../etc/passwd")


def test_a_page_fits_the_limit_as_sent():
    (r,) = calls(build_server(roots(), max_bytes=5000), ("kb_search", {"text": "loader"}))
    got = json.loads(r.content[0].text)
    assert got["page"]["next_offset"] is not None and len(r.content[0].text.encode()) <= 5000


def test_over_stdio_as_an_assistant_starts_it():
    """``hermes mcp`` as a subprocess: nothing but the protocol on its stdout (the workers' output goes to stderr)."""
    import sys

    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "hermes_kb", "mcp", "--root", str(ROOT / "examples")])

    async def go():
        async with Client(params) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            return names, await c.call_tool("whatif", {"path": "traces/cpu_dataloader_bound.json.gz", "target": "dataloader",
                                                       "fraction": 1.0})  # fmt: skip

    names, r = asyncio.run(go())
    assert "whatif" in names and not r.is_error, r.content[0].text
    assert json.loads(r.content[0].text)["removed_us"] > 0
