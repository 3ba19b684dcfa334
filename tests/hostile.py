"""Names a trace can carry that must never act: HTML/script payloads, Markdown breakouts,
terminal escape sequences. ``hostile_report`` puts them into every string of a real report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from hermes_kb.advisor.report import PathOp, Report, SlowRank, StepPoint

MARK = "data-pwned"
HTML_PAYLOADS = [
    f"<script>document.documentElement.setAttribute('{MARK}','script');document.title='pwned'</script>",
    f"\"><img src=x onerror=\"document.documentElement.setAttribute('{MARK}','img')\">",
    f"</script><script>document.documentElement.setAttribute('{MARK}','close')</script>",
    f"'><svg onload=\"document.documentElement.setAttribute('{MARK}','svg')\">",
    f"</title><script>document.documentElement.setAttribute('{MARK}','title')</script>",
]
MD_PAYLOADS = [
    "op\n\n<img src=x onerror=alert(1)>",
    "a` <img src=x onerror=alert(2)> `b",
    "``` \n<script>alert(3)</script>\n```",
    "x](javascript:alert(4))",
]
TERM_PAYLOADS = [
    "title\x1b]0;pwned\x07",  # window title
    "clip\x1b]52;c;cHduZWQ=\x07",  # OSC 52 clipboard write
    "clear\x1b[2J\x1b[H",  # clear screen, cursor home
    "link\x1b]8;;http://evil.invalid\x1b\\x\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "cr\rspoof",
    "c1\x9b31mred",  # 8-bit CSI
    "bell\x07back\x08",
    "bidi\u202eexe.txt",
]
ALL = HTML_PAYLOADS + MD_PAYLOADS + TERM_PAYLOADS


def hostile_report(report: Report) -> Report:
    """A copy of ``report`` with the payloads in every string a trace can reach."""
    r = report.model_copy(deep=True)
    p = iter(ALL * 4)
    r.inputs.sources = [f"/tmp/{next(p)}.json.gz"]
    r.warnings = [next(p) for _ in range(3)]
    for s in r.summary:
        s.device = next(p)
        s.series = [StepPoint(step=i, duration_us=1000.0 + 10 * i, spike="spike" if i == 2 else None) for i in range(5)]
        s.critical_path_us = 5000.0
        s.critical_path_ops = [PathOp(name=x, category="cpu_op", time_us=100.0, share_ratio=0.1) for x in ALL]
    r.slow_ranks = [SlowRank(domain=next(p), rank=0, source="rank_imbalance", measure=next(p), note=next(p))]
    for f in r.findings:
        f.explanation = " ".join(ALL)
        f.assumption = next(p)
        for o in f.optimizations:
            o.how_to = next(p)
            o.snippet = "```\n</code></pre><script>document.documentElement.setAttribute('data-pwned','snippet')</script>\n```\n" + next(p)
        for e in f.evidence:
            e.events = list(ALL)
            e.scope = next(p)
            e.note = next(p)
            e.values = {**e.values, "name": next(p)}
    for u in r.unexplained:
        u.summary = next(p)
    return r


def hostile_trace(src: Path, dest: Path) -> Path:
    """The bundled example with its operators, annotations and device renamed to the payloads."""
    doc = json.loads(gzip.open(src).read())
    names = iter(ALL * 1000)
    renamed: dict[str, str] = {}
    for e in doc["traceEvents"]:
        n = e.get("name")
        if e.get("cat") == "cpu_op" and isinstance(n, str):
            e["name"] = renamed.setdefault(n, f"{n}{next(names)}")
    doc["deviceProperties"] = [{"id": 0, "name": "Dev" + TERM_PAYLOADS[0] + HTML_PAYLOADS[1]}]
    dest.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dest


class FakeProfiler:
    """Stands in for torch.profiler inside the monitor (no torch here): enter, exit, export a
    tiny trace (tests/test_monitor_hostile.py, benchmarks/fuzz.py's requests class)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text('{"traceEvents": []}')
