"""What the monitor decided by itself (its notes, ``rank<R>.monitor.jsonl``), as lines of the
report: automatic captures and their reasons, triggers refused, a warm-up that never settled, how
MFU was obtained and the domains found. Most are notes (``Report.notes``: what the monitor did,
how a number was obtained; nothing is wrong); a capture that failed and a warm-up that never
settled are warnings (``Report.warnings``: the analysis has less, or less clean, data than asked)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from hermes_kb.monitor.reader import RunLog

from .series import finite_num, mfu_note, nonneg_int, read_notes

KIND_WORDS = {"slow_step": "slow step", "slow_rank": "slowest rank", "throughput_drop": "throughput drop"}
MAX_DOMAIN_LINES = 3


def _key(v: Any) -> str | int | None:
    """A note's id as a dict key: a string or an integer; anything else (a list, a dict) matches nothing."""
    return v if isinstance(v, (str, int)) and not isinstance(v, bool) else None


def _items(v: Any) -> list:
    return v if isinstance(v, list) else []


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "no ranks listed"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def notes_warnings(run: RunLog, notes: dict[int, list[dict]] | None = None) -> list[str]:
    """Every line of ``warnings_and_notes``, warnings first."""
    warnings, lines = warnings_and_notes(run, notes)
    return warnings + lines


def warnings_and_notes(run: RunLog, notes: dict[int, list[dict]] | None = None) -> tuple[list[str], list[str]]:
    """What the monitor decided by itself, as (warnings, notes). Notes: each automatic capture
    with its reason and what it held (or that the run ended before it ran); triggers that asked
    for a capture and did not get one, with why (one line per rank and kind); how the FLOPs and
    the peak behind MFU were obtained, or why there is no MFU; the domains found (one line for all
    ranks that share it). Warnings: a capture that failed; a warm-up that never settled (the
    analysed steps may hold some of it)."""
    notes = read_notes(run) if notes is None else notes
    out: list[str] = []
    warned: list[str] = []
    shared: dict[str, list[int]] = defaultdict(list)
    for r in sorted(notes):
        recs = notes[r]
        got = {_key(x.get("id")): x for x in recs if x.get("type") == "captured"}
        taken: set[str] = set()
        for t in recs:
            if t.get("type") != "trigger" or t.get("captured") is not True:
                continue
            kind = str(t.get("kind"))
            c = got.get(_key(t.get("id")))
            line = f"monitor: rank {r}: automatic capture ({KIND_WORDS.get(kind, kind)}): {t.get('reason')}"
            failed = False
            if c is None:
                line += "; the capture did not run (the run ended first)"
            elif c.get("error"):
                line += f"; the capture failed: {c['error']}"
                failed = True
            else:
                a, b = nonneg_int(c.get("first_step")), nonneg_int(c.get("last_step"))
                line += f"; captured steps {a}-{b}" if a is not None and b is not None else "; captured"
                sl, w, ref = nonneg_int(c.get("slowest_step")), finite_num(c.get("slowest_s")), finite_num(c.get("others_median_s"))
                if kind == "slow_step" and sl is not None and w and ref:
                    held = "held" if c.get("caught") else "missed the slow step: its slowest was"
                    line += f", which {held} step {sl} ({w * 1e3:,.1f} ms against {ref * 1e3:,.1f} ms for the others)"
                if c.get("trace"):
                    line += f" ({Path(str(c['trace'])).name})"
            (warned if failed else out).append(line)
            taken.add(kind)
        refused: dict[str, list[dict]] = defaultdict(list)
        for t in recs:
            if t.get("type") == "trigger" and t.get("captured") is False and (t.get("kind") != "slow_step" or t.get("plan")):
                refused[str(t.get("kind"))].append(t)
        for kind, ts in refused.items():
            if kind in taken:
                continue
            more = f" ({len(ts) - 1} more like it)" if len(ts) > 1 else ""
            out.append(f"monitor: rank {r}: {KIND_WORDS.get(kind, kind)} not captured ({ts[0].get('why_not')}): "
                       f"{ts[0].get('reason')}{more}")  # fmt: skip
        for w in recs:
            if w.get("type") == "warmup" and w.get("settled") is False:
                warned.append(f"monitor: rank {r}: {w.get('reason')} (end at step {w.get('end_step')})")
        m = mfu_note(recs)
        if m is not None:
            shared[f"monitor: MFU from FLOPs: {m.get('source')}, {finite_num(m.get('flops_per_step')) or 0:,.4g} per step; "
                   f"peak: {m.get('peak_source')}"].append(r)  # fmt: skip
        else:
            why = [x for x in recs if x.get("type") == "mfu" and x.get("counted") is False]
            if why:
                shared[f"monitor: no MFU: {why[-1].get('reason')}"].append(r)
        doms = [x for x in recs if x.get("type") == "domains"]
        if doms and isinstance(doms[-1].get("domains"), list):
            ds = [d for d in doms[-1]["domains"] if isinstance(d, dict)]
            text = "; ".join(f"{d.get('name')} ({_ranks_text([x for x in _items(d.get('ranks')) if isinstance(x, int)])}, "
                             f"{d.get('backend')})" for d in ds)  # fmt: skip
            comm = "; ".join(str(x) for x in _items(doms[-1].get("comm")))
            shared[f"monitor: domains found in torch.distributed: {text or 'none of 2 ranks or more'}"
                   + (f"; time in collectives measured by {comm}" if comm else "")].append(r)
    doms = 0
    for text, ranks in shared.items():
        if "domains found" in text:
            doms += 1
            if doms > MAX_DOMAIN_LINES:  # a large job has one layout per group of ranks: a few are enough
                continue
        out.append(text.replace("monitor: ", f"monitor: {_ranks_text(ranks)}: ", 1))
    if doms > MAX_DOMAIN_LINES:
        out.append(f"monitor: {doms - MAX_DOMAIN_LINES} more layouts of process groups on the other ranks "
                   f"(`hermes analyze RUN_DIR -k monitor_slow_rank` lists every domain)")  # fmt: skip
    return list(dict.fromkeys(warned)), list(dict.fromkeys(out))
