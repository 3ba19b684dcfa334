"""A real session with `hermes mcp`, as an assistant would drive it: the server started over stdio
(`hermes mcp --root ...`), its tools listed and called, each answer summarised. docs/agents.md shows
what this printed. Run: python examples/mcp_session.py TRACE [ROOT]"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path


def show(name: str, args: dict, answer: dict, keys: list[str]) -> None:
    print(f"\n> {name}({json.dumps(args)})")
    print(json.dumps({k: answer.get(k) for k in keys}, indent=1, ensure_ascii=False)[:1800])


async def session(trace: str, root: str) -> None:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "hermes_kb", "mcp", "--root", root])
    async with Client(params) as c:
        tools = (await c.list_tools()).tools
        print("tools:", ", ".join(t.name for t in tools))

        async def ask(name: str, args: dict) -> dict:
            r = await c.call_tool(name, args)
            text = r.content[0].text
            if r.is_error:
                print(f"\n> {name}({json.dumps(args)})\nerror: {text}")
                return {}
            return json.loads(text)

        adv = await ask("advise", {"path": trace, "top": 3})
        print(f"\n> advise({json.dumps({'path': trace, 'top': 3})})")
        for s in adv["report"]["summary"]:
            print(f"rank {s['rank']}: mean step {s['mean_step_us'] / 1e3:.1f} ms, {s['critical_component']} holds "
                  f"{s['critical_ratio']:.0%}")
        for f in adv["findings"]:
            sp = f["expected_speedup"]
            print(f"- {f['case_id']} ({f['severity']}): {f['title']}: {sp['low']:.2f}-{sp['high']:.2f}x, "
                  f"replayed set {f['whatif_target']}; evidence: "
                  + "; ".join(f"{p['fact']} rank {p.get('rank')} window {p.get('evidence_window_us')}"
                              for p in f["provenance"][:2]))
        top = adv["findings"][0] if adv["findings"] else None
        bd = await ask("breakdown", {"path": trace})
        show("breakdown", {"path": trace}, bd["items"][0], ["kind", "rank", "duration_us", "critical_component",
                                                            "critical_ratio", "data_us", "compute_us", "provenance"])
        if top is not None and top.get("whatif_target"):
            args = {"path": trace, "target": top["whatif_target"], "fraction": 0.4}
            show("whatif", args, await ask("whatif", args),
                 ["target", "fraction", "replay_base_us", "removed_us", "replayed_span_us", "speedup", "steps_count",
                  "removed_per_step_us", "analyze_points"])
        ex = await ask("explain", {"case_id": "C-IO-001", "path": trace})
        print(f"\n> explain({json.dumps({'case_id': 'C-IO-001', 'path': trace})})")
        print("\n".join(ex["text"][:12]))
        hits = await ask("kb_search", {"text": "num_workers"})
        print(f"\n> kb_search({json.dumps({'text': 'num_workers'})})")
        for h in hits["items"][:4]:
            print(f"- {h['case_id']}: {h['title']} (fix: {h['fixes'][0]['title']})")
        await ask("advise", {"path": "/etc/passwd"})


if __name__ == "__main__":
    trace = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent / "traces/cpu_dataloader_bound.json.gz")
    root = sys.argv[2] if len(sys.argv) > 2 else str(Path(trace).resolve().parent)
    asyncio.run(session(trace, root))
