"""Where each case of the knowledge base fires: on the real traces other people recorded
(``../shared/data``, the judged entries of benchmarks/real_traces/expectations.yaml), on the
recorded scenarios bundled in benchmarks/scenarios/recorded (both variants of each, as monitor
run directories), and on the bundled example traces (examples/traces).

Each source is analysed once (in worker processes when several cores are free); every case is then
judged on its facts in one pass of the rules engine, exactly as ``hermes advise`` judges them. A
case counts as fired on a source when the report has a finding for it at any severity, including
findings folded into another (``related``) and nested ones (``alternatives``).

``hermes kb coverage`` prints the table; ``--format md --write docs/kb.md`` replaces the section
between the coverage markers there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..kb.loader import KnowledgeBase

KINDS = ("real", "scenario", "example")
START = "<!-- coverage:start -->"
END = "<!-- coverage:end -->"
SHOWN = 3  # source names shown per cell in the tables (the JSON has them all)


@dataclass(frozen=True)
class Source:
    kind: str  # real | scenario | example
    name: str  # how it is shown: the path under ../shared/data, scenario/variant, the example's file name
    path: Path


@dataclass
class Judged:
    source: Source
    fired: set[str] = field(default_factory=set)
    error: str | None = None
    seconds: float = 0.0


@dataclass
class CaseRow:
    case_id: str
    category: str
    hardware: str
    status: str
    title: str
    where: dict[str, list[str]]  # kind -> source names
    not_recorded: str | None = None  # the case's own word on why nothing shows it yet

    @property
    def fired_anywhere(self) -> bool:
        return any(self.where.values())


@dataclass
class Coverage:
    rows: list[CaseRow]
    judged: list[Judged]
    shared: str | None  # the shared data folder used, None when absent or left out

    def counts(self) -> dict[str, int]:
        out = {k: sum(1 for r in self.rows if r.where.get(k)) for k in KINDS}
        out["real_or_scenario"] = sum(1 for r in self.rows if r.where.get("real") or r.where.get("scenario"))
        out["never"] = sum(1 for r in self.rows if not r.fired_anywhere)
        out["cases"] = len(self.rows)
        return out

    def sources_count(self) -> dict[str, int]:
        return {k: sum(1 for j in self.judged if j.source.kind == k and j.error is None) for k in KINDS}


# ----------------------------------------------------------------------------- the sources


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_shared(root: Path | None = None) -> Path:
    return (root or repo_root()).parent / "shared" / "data"


def real_sources(shared: Path, expectations: Path) -> list[Source]:
    """The judged real traces (``traces:`` of the expectations file) present under ``shared``."""
    from ..kb.loader import safe_yaml

    doc = safe_yaml(expectations) or {}
    out = []
    for e in doc.get("traces") or []:
        rel = str(e.get("path") or "")
        p = shared / rel
        if rel and p.exists():
            out.append(Source("real", rel, p))
    return out


def scenario_sources(recorded: Path) -> list[Source]:
    """Each recorded scenario's variants: the run directory (monitor log + capture), else the lone trace."""
    out = []
    if not recorded.is_dir():
        return out
    for d in sorted(p for p in recorded.iterdir() if p.is_dir()):
        for variant in ("bad", "fixed"):
            for p in (d / variant, d / f"{variant}.json.gz"):
                if p.exists():
                    out.append(Source("scenario", f"{d.name}/{variant}", p))
                    break
    return out


def example_sources(examples: Path) -> list[Source]:
    if not examples.is_dir():
        return []
    return [Source("example", p.name, p) for p in sorted(examples.glob("*.json*")) if p.is_file()]


def all_sources(root: Path | None = None, shared: Path | None = None, kinds: Iterable[str] = KINDS) -> list[Source]:
    root = root or repo_root()
    kinds = set(kinds)
    out: list[Source] = []
    if "real" in kinds and shared is not None and shared.is_dir():
        out += real_sources(shared, root / "benchmarks/real_traces/expectations.yaml")
    if "scenario" in kinds:
        out += scenario_sources(root / "benchmarks/scenarios/recorded")
    if "example" in kinds:
        out += example_sources(root / "examples/traces")
    return out


# ----------------------------------------------------------------------------- analysis and judging


@dataclass
class Analysed:
    facts: list
    platform: str


def analyse(path: Path) -> Analysed:
    """The facts of one source (a trace, a directory of per-rank traces, a monitor run directory)
    and the platform its cases are judged for, as ``hermes advise`` obtains them."""
    from ..analysis.run import analyze_bundle
    from ..analysis.run_dir import analyze_run_dir, as_run_dir, run_platform
    from ..trace import load
    from ..trace.bundle import platform_of

    if (run_dir := as_run_dir(path)) is not None:
        ra = analyze_run_dir(run_dir)
        return Analysed(ra.facts, run_platform(ra))
    bundle = load(str(path))
    return Analysed(analyze_bundle(bundle), platform_of(bundle))


def fired_cases(analysed: Analysed, kb: KnowledgeBase, engine: str = "auto") -> set[str]:
    """Every case with a finding on these facts: the findings of any severity, those folded into
    another (related) and those nested in another (alternatives)."""
    from ..advisor.diagnose import diagnose
    from ..kb.engine import infer

    inf = infer(kb, analysed.facts, engine)  # type: ignore[arg-type]
    findings, _, _ = diagnose(inf, kb, analysed.platform, {})
    out: set[str] = set()
    stack = list(findings)
    while stack:
        f = stack.pop()
        out.add(f.case_id)
        out.update(f.related)
        stack.extend(f.alternatives)
    return out


def _analyse_job(path: str) -> tuple[Analysed | None, str | None, float]:
    t0 = time.perf_counter()
    try:
        return analyse(Path(path)), None, time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001  one source that fails is a row, not the end of the run
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"{type(exc).__name__}: {msg}"[:300], time.perf_counter() - t0


def judge(sources: Sequence[Source], kb: KnowledgeBase, *, jobs: int = 1, engine: str = "auto",
          progress: Callable[[Judged], None] | None = None,
          analyse_fn: Callable[[str], tuple[Analysed | None, str | None, float]] = _analyse_job) -> list[Judged]:  # fmt: skip
    """Analyse every source once (``jobs`` worker processes) and judge all cases on it here, in this
    process (the rules engine stays in one process and one thread)."""
    out: list[Judged] = []

    def done(src: Source, res) -> None:
        analysed, err, secs = res
        j = Judged(src, error=err, seconds=secs)
        if analysed is not None:
            try:
                j.fired = fired_cases(analysed, kb, engine)
            except Exception as exc:  # noqa: BLE001
                j.error = f"{type(exc).__name__}: {exc}"[:300]
        out.append(j)
        if progress is not None:
            progress(j)

    if jobs > 1 and len(sources) > 1 and analyse_fn is _analyse_job:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [(s, pool.submit(analyse_fn, str(s.path))) for s in sources]
            for s, fut in futures:
                done(s, fut.result())
    else:
        for s in sources:
            done(s, analyse_fn(str(s.path)))
    return out


def coverage(kb: KnowledgeBase, judged: Sequence[Judged], shared: Path | None = None) -> Coverage:
    from ..kb.ids import id_key

    rows = []
    for e in kb.cases:
        c = e.item
        where = {k: [j.source.name for j in judged if j.source.kind == k and c.id in j.fired] for k in KINDS}
        rows.append(CaseRow(c.id, c.category, c.hardware, c.status, c.title, where, c.not_recorded))
    rows.sort(key=lambda r: id_key(r.case_id))
    return Coverage(rows, list(judged), str(shared) if shared is not None else None)


def run(kb: KnowledgeBase, *, root: Path | None = None, shared: Path | None = None, kinds: Iterable[str] = KINDS,
        jobs: int | None = None, progress: Callable[[Judged], None] | None = None) -> Coverage:  # fmt: skip
    """Sources found, analysed and judged: the whole ``hermes kb coverage``."""
    kinds = list(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise UsageError(f"unknown source kind {bad[0]!r}; choose from {', '.join(KINDS)}")
    use_shared = shared if shared is not None and shared.is_dir() else None
    sources = all_sources(root, use_shared, kinds)
    from ..core.cpus import usable_cpus

    n = jobs if jobs is not None else max(1, min(usable_cpus(), 4))
    return coverage(kb, judge(sources, kb, jobs=n, progress=progress), use_shared)


# ----------------------------------------------------------------------------- output


def cell(names: list[str]) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:SHOWN])
    return f"{len(names)}: {shown}" + (f" +{len(names) - SHOWN} more" if len(names) > SHOWN else "")


def to_json(cov: Coverage) -> dict[str, Any]:
    return {
        "counts": cov.counts(),
        "sources": [{"kind": j.source.kind, "name": j.source.name, "fired": sorted(j.fired), "error": j.error,
                     "seconds": round(j.seconds, 2)} for j in cov.judged],  # fmt: skip
        "shared": cov.shared,
        "cases": [{"id": r.case_id, "category": r.category, "hardware": r.hardware, "status": r.status,
                   "title": r.title, **{k: r.where.get(k, []) for k in KINDS}, "not_recorded": r.not_recorded}
                  for r in cov.rows],  # fmt: skip
    }


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(cov: Coverage) -> str:
    c = cov.counts()
    s = cov.sources_count()
    failed = [j for j in cov.judged if j.error]
    lines = [
        f"{c['cases']} cases; sources judged: {s['real']} real traces"
        + ("" if cov.shared else " (../shared/data absent)")
        + f", {s['scenario']} recorded scenario runs, {s['example']} example traces.",
        "",
        f"- fire on a real trace: **{c['real']}**; on a recorded scenario: **{c['scenario']}**; "
        f"on either: **{c['real_or_scenario']}**; on a bundled example: {c['example']}; never: **{c['never']}**",
    ]
    if failed:
        lines.append("- sources that could not be analysed: " + "; ".join(f"{j.source.name} ({j.error})" for j in failed))
    lines += ["", "| case | category | hw | real traces | recorded scenarios | examples |", "|---|---|---|---|---|---|"]
    for r in cov.rows:
        lines.append(f"| {r.case_id} | {r.category} | {r.hardware} | {_md_escape(cell(r.where['real']))} | "
                     f"{_md_escape(cell(r.where['scenario']))} | {_md_escape(cell(r.where['example']))} |")  # fmt: skip
    why = [r for r in cov.rows if not r.fired_anywhere and r.not_recorded]
    if why:
        lines += ["", "Cases that fire nowhere yet, in their own words (`not_recorded` in the case file):", ""]
        lines += [f"- **{r.case_id}**: {_md_escape(' '.join(r.not_recorded.split()))}" for r in why]
    return "\n".join(lines) + "\n"


def markers(doc: Path) -> tuple[str, int, int]:
    try:
        text = doc.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {doc}: {getattr(exc, 'strerror', None) or exc}") from None
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise UsageError(f"{doc} has no '{START}' ... '{END}' section to replace")
    return text, i, j


def write_section(doc: Path, body: str) -> None:
    """Replace what lies between the coverage markers in ``doc`` with ``body``."""
    text, i, j = markers(doc)
    new = text[: i + len(START)] + "\n" + body.rstrip("\n") + "\n" + text[j:]
    tmp = doc.with_name(f".{doc.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, doc)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {doc}: {exc.strerror or exc}") from None
