"""``hermes mcp``: the Model Context Protocol server over stdio (docs/agents.md), on the official
``mcp`` SDK, 2.x (the ``hermes-kb[mcp]`` extra), imported here only.

Tools: advise, breakdown, facts, explain, whatif, diff, kb_search, monitor_status. Resources: a
report as JSON and Markdown, a case's YAML, the JSON Schemas. Every path an assistant names is
checked against the roots first (``safety.Roots``); every tool's work runs in a child process
with the server's time limit (``limits.run_limited``); an answer over the size limit is paged
(``offset``); no tool writes a file."""

from __future__ import annotations

import json
from typing import Any

from ..core.errors import EXIT_ENVIRONMENT, HermesError
from .limits import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, Answers, paged, run_limited, size_of
from .safety import Roots

CATEGORIES = ("parallel", "io", "cpu", "computation", "communication")
SCHEMAS = ("report", "facts", "diff", "rule", "case")
RESOURCE_FACTOR = 8  # a resource is not paged: it may be this many times the tools' size limit

INSTRUCTIONS = (
    "hermes explains why deep-learning training is slow from PyTorch / Ascend profiler traces (Kineto "
    ".json/.json.gz, torch_npu directories, a directory of per-rank traces, or a hermes monitor RUN_DIR). Start "
    "with advise (ranked findings with expected speedups); breakdown says which component holds the step; facts "
    "gives the measurements; explain says why a case did or did not fire; whatif replays the rank's dependency "
    "graph with a set of events shortened, so quote its removed_us instead of estimating a gain. Every number "
    "carries its provenance (fact kind, rank, step, evidence window in µs from the trace's origin). Paths must be "
    "under the server's roots; long answers are paged: call again with page.next_offset as offset."
)


class NoSdk(HermesError):
    """The ``mcp`` SDK is missing, or older than the 2.x API the server is written for."""

    exit_code = EXIT_ENVIRONMENT


def sdk():
    """The SDK's server class and its tool / resource error types (mcp 2.x: MCPServer)."""
    try:
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    except ImportError:
        raise NoSdk("hermes mcp needs the MCP SDK 2.x: pip install 'hermes-kb[mcp]'") from None
    return Server, ToolError, ResourceError


class Hermes:
    """The tools' shared machinery: the roots, the limits, the answers kept for paging."""

    def __init__(self, roots: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES):
        self.roots = Roots(roots)
        self.timeout_s = float(timeout_s)
        self.max_bytes = int(max_bytes)
        self.answers = Answers()

    def paths(self, paths: str | list[str]) -> list[str]:
        items = [paths] if isinstance(paths, str) else list(paths)
        if not items:
            raise HermesError("no path given")
        return [self.roots.check(p) for p in items]

    def answer(self, name: str, kwargs: dict, paths: list[str]) -> Any:
        key = Answers.key(name, kwargs, paths)
        got = self.answers.get(key)
        if got is None:
            got = run_limited(name, kwargs, self.timeout_s)
            self.answers.put(key, got)
        return got

    async def call(self, name: str, kwargs: dict, paths: list[str], *, items: str | None = "items", offset: int = 0):
        """Run a tool's work off the event loop, then page it."""
        import anyio

        got = await anyio.to_thread.run_sync(lambda: self.answer(name, kwargs, paths))
        if items is None:
            if size_of(got) > self.max_bytes:
                raise HermesError(f"the answer is {size_of(got)} bytes, over the server's limit of {self.max_bytes}")
            return got
        return paged(got, items, offset, self.max_bytes)


def build_server(roots: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES):
    """The MCP server, its tools and resources registered (not started: ``.run()`` serves stdio)."""
    from ..core.version import __version__

    Server, ToolError, ResourceError = sdk()
    h = Hermes(roots, timeout_s=timeout_s, max_bytes=max_bytes)
    server = Server("hermes", instructions=INSTRUCTIONS, version=__version__)
    server.hermes = h  # type: ignore[attr-defined]

    def guarded(fn):
        """A tool whose hermes errors (refused path, time limit, bad input) reach the assistant as one line."""
        import functools

        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except HermesError as exc:
                from ..core.sanitize import clean_line

                raise ToolError(clean_line(str(exc))) from None

        return wrapper

    register_tools(server, h, guarded)
    register_resources(server, h, ResourceError)
    return server


def register_tools(server, h: Hermes, guarded) -> None:
    @server.tool(description="Diagnose a trace (file, directory of per-rank traces, or monitor RUN_DIR): the report's "
                 "summary (per-rank step time, component and phase breakdown) and the findings ranked by expected "
                 "speedup, each with its evidence, gain and provenance. fmt: brief (default), json (every field of "
                 "`hermes advise --format json`) or markdown. Paged by findings (offset).")  # fmt: skip
    @guarded
    async def advise(path: str | list[str], fmt: str = "brief", top: int | None = None, rank: int | None = None,
                     offset: int = 0) -> dict[str, Any]:  # fmt: skip
        if fmt not in ("brief", "json", "markdown"):
            raise HermesError(f"fmt {fmt!r}: brief, json or markdown")
        paths = h.paths(path)
        kw = {"paths": paths, "fmt": fmt, "top": top, "rank": rank}
        return await h.call("advise", kw, paths, items=None if fmt == "markdown" else "findings", offset=offset)

    @server.tool(description="The step breakdown per rank: the exclusive components (compute, communication, "
                 "host_launch, host_dispatch, host_python, data, idle; µs per step and shares) and the program "
                 "phases (data, forward, backward, optimizer, communication, user code), as step_breakdown and "
                 "program_phases facts with provenance; per_step adds each step's. Paged.")  # fmt: skip
    @guarded
    async def breakdown(path: str | list[str], rank: int | None = None, per_step: bool = False,
                        offset: int = 0) -> dict[str, Any]:  # fmt: skip
        paths = h.paths(path)
        return await h.call("breakdown", {"paths": paths, "rank": rank, "per_step": per_step}, paths, offset=offset)

    @server.tool(description="The typed facts `hermes analyze --format json` measures, filtered by kinds (e.g. "
                 "['step_time','whatif']; the kinds present are listed in kinds_in_input), rank and step "
                 "(aggregate_only: the facts over all analysed steps). Each carries provenance. Paged (offset).")  # fmt: skip
    @guarded
    async def facts(path: str | list[str], kinds: list[str] | None = None, rank: int | None = None,
                    step: int | None = None, aggregate_only: bool = False, offset: int = 0) -> dict[str, Any]:  # fmt: skip
        paths = h.paths(path)
        kw = {"paths": paths, "kinds": sorted(kinds or []), "rank": rank, "step": step, "aggregate_only": aggregate_only}
        return await h.call("facts", kw, paths, offset=offset)

    @server.tool(description="Why a case (C-...) or rule (R-...) did or did not fire on this input: each condition, "
                 "whether it held, how many facts passed it and the values seen (`hermes kb explain`).")  # fmt: skip
    @guarded
    async def explain(case_id: str, path: str | list[str]) -> dict[str, Any]:
        paths = h.paths(path)
        return await h.call("explain", {"case_id": case_id, "paths": paths}, paths, items=None)

    @server.tool(description="Replay one rank's dependency graph with a named what-if set (target, e.g. dataloader, "
                 "host_gaps, fusable, communication; sets_on_rank lists them) or every event whose name matches a "
                 "regular expression (pattern) shortened by fraction (0.4: 40% shorter; 1: gone): the analysed span "
                 "before (replay_base_us) and after (replayed_span_us), removed_us and the speedup. Quote these "
                 "instead of estimating a gain.")  # fmt: skip
    @guarded
    async def whatif(path: str | list[str], rank: int | None = None, target: str | None = None,
                     pattern: str | None = None, fraction: float = 0.5) -> dict[str, Any]:  # fmt: skip
        paths = h.paths(path)
        kw = {"paths": paths, "rank": rank, "target": target, "pattern": pattern, "fraction": fraction}
        return await h.call("whatif", kw, paths, items=None)

    @server.tool(description="Compare two runs (before and after a change): step time by component per rank, the "
                 "operators and kernels that changed most, findings resolved / new, and whether each resolved "
                 "finding's predicted speedup was met (`hermes diff --format json`). Paged by rank.")  # fmt: skip
    @guarded
    async def diff(before: str | list[str], after: str | list[str], top: int = 10, offset: int = 0) -> dict[str, Any]:
        a, b = h.paths(before), h.paths(after)
        return await h.call("diff", {"before": a, "after": b, "top": top}, a + b, offset=offset)

    @server.tool(description="Search the knowledge base: cases whose id, title, cause, explanation or fixes contain "
                 "every word of text, optionally in one category (parallel, io, cpu, computation, communication), "
                 "with their causes and fixes; the full YAML is the resource hermes://case/{id}. Paged.")  # fmt: skip
    @guarded
    async def kb_search(text: str | None = None, category: str | None = None, offset: int = 0) -> dict[str, Any]:
        if category is not None and category not in CATEGORIES:
            raise HermesError(f"category {category!r}: one of {', '.join(CATEGORIES)}")
        return await h.call("kb_search", {"text": text, "category": category}, [], offset=offset)

    @server.tool(description="A hermes monitor RUN_DIR (rank<R>.jsonl logs): per rank the steps, last step, median "
                 "step time, data-wait and GC shares, the fluctuation steps that trigger captures, the capture "
                 "records and files (`hermes monitor status`). Paged by rank.")  # fmt: skip
    @guarded
    async def monitor_status(run_dir: str, offset: int = 0) -> dict[str, Any]:
        (path,) = h.paths(run_dir)
        return await h.call("monitor_status", {"run_dir": path}, [path], offset=offset)


def register_resources(server, h: Hermes, ResourceError) -> None:
    limit = h.max_bytes * RESOURCE_FACTOR

    async def text_of(name: str, kwargs: dict, paths: list[str]) -> Any:
        import anyio

        try:
            return await anyio.to_thread.run_sync(lambda: h.answer(name, kwargs, paths))
        except HermesError as exc:
            from ..core.sanitize import clean_line

            raise ResourceError(clean_line(str(exc))) from None

    def bounded(text: str) -> str:
        if len(text.encode()) > limit:
            raise ResourceError(f"{len(text.encode())} bytes, over the server's resource limit of {limit}: use the "
                                "advise tool, which pages")  # fmt: skip
        return text

    def checked(path: str) -> list[str]:
        try:
            return h.paths(path)
        except HermesError as exc:
            raise ResourceError(str(exc)) from None

    @server.resource("hermes://report/json/{+path}", mime_type="application/json",
                     description="The report of `hermes advise --format json` for a path relative to a root")  # fmt: skip
    async def report_json(path: str) -> str:
        paths = checked(path)
        got = await text_of("advise", {"paths": paths, "fmt": "json", "top": None, "rank": None}, paths)
        report = dict(got["report"], findings=[{k: v for k, v in f.items() if k != "provenance"}
                                               for f in got["findings"]])  # fmt: skip
        return bounded(json.dumps(report, indent=1, ensure_ascii=False))

    @server.resource("hermes://report/md/{+path}", mime_type="text/markdown",
                     description="The report as Markdown (`hermes advise --format md`) for a path relative to a root")  # fmt: skip
    async def report_md(path: str) -> str:
        paths = checked(path)
        got = await text_of("advise", {"paths": paths, "fmt": "markdown", "top": None, "rank": None}, paths)
        return bounded(got["markdown"])

    @server.resource("hermes://case/{case_id}", mime_type="application/yaml", description="A case's (or rule's) YAML")
    async def case_yaml(case_id: str) -> str:
        return bounded(await text_of("case_yaml", {"case_id": case_id}, []))

    for name in SCHEMAS:
        def make(n: str):
            async def schema() -> str:
                return bounded(json.dumps(await text_of("schema", {"name": n}, []), indent=1))

            schema.__name__ = f"schema_{n}"
            return schema

        server.resource(f"hermes://schema/{name}", mime_type="application/schema+json",
                        description=f"The JSON Schema of the {name} (`hermes schema {name}`)")(make(name))  # fmt: skip


def serve(roots: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Serve over stdio until the client closes it."""
    build_server(roots, timeout_s=timeout_s, max_bytes=max_bytes).run("stdio")


__all__ = ["CATEGORIES", "INSTRUCTIONS", "SCHEMAS", "Hermes", "NoSdk", "build_server", "sdk", "serve"]
