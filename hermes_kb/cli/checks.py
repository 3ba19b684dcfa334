"""What the CLI checks before and after it runs: names on the command line that do not exist
(usage errors that name what does), the user's --config file (config errors that name that file),
and inputs that load but may not mean what the user thinks (warnings): a single profiled step,
ranks from different jobs, a monitor run directory holding two runs appended."""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, HermesError, UsageError
from ..kb.ids import id_key, item_ids


def _names(items, limit: int = 40) -> str:
    items = list(items)
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def unknown(what: str, given: Any, existing, hint: str = "", limit: int = 40) -> UsageError:
    """A usage error for ``given`` not among ``existing``, naming the closest and what exists."""
    existing = list(existing)
    close = difflib.get_close_matches(str(given), [str(e) for e in existing], n=3, cutoff=0.6)
    msg = f"unknown {what} {given!r}"
    if close:
        msg += f" (did you mean {', '.join(close)}?)"
    msg += f"; {what}s: {_names(existing, limit)}"
    if hint:
        msg += f" ({hint})"
    return UsageError(msg)


def check_kinds(kinds: list[str] | None) -> None:
    from ..facts import FACT_TYPES

    for k in kinds or []:
        if k not in FACT_TYPES:
            raise unknown("fact kind", k, sorted(FACT_TYPES), "hermes schema facts describes each", limit=200)


def unknown_id(kb, item) -> UsageError:
    """An unknown rule or case id: the closest ids, and the ids of its family (C-IO-...)."""
    ids = item_ids(kb)
    family = "-".join(str(item).upper().split("-")[:2]) + "-"
    same = [i for i in ids if i.startswith(family)]
    close = difflib.get_close_matches(str(item), ids, n=3, cutoff=0.6)
    # the same number written with fewer or more zeros (C-IO-01 for C-IO-001) is the obvious match
    num = str(item).rsplit("-", 1)[-1]
    if num.isascii() and num.isdigit():
        same_number = [i for i in ids if i.upper().startswith(family) and i.rsplit("-", 1)[-1].isdigit()
                       and int(i.rsplit("-", 1)[-1]) == int(num)]  # fmt: skip
        close = same_number + [c for c in close if c not in same_number][:3 - len(same_number)]
    msg = f"no rule or case with id {item!r}"
    if close:
        msg += f" (did you mean {', '.join(close)}?)"
    if same:
        msg += f"; ids of {family}*: {', '.join(same)}"
    else:
        families = sorted({"-".join(i.split("-")[:2]) for i in ids}, key=lambda f: id_key(f + "-0"))
        msg += f"; families: {', '.join(f + '-*' for f in families)}"
    return UsageError(msg + f" ({len(ids)} rules and cases: hermes kb list)")


def check_item(kb, item: str | None) -> None:
    if item is not None and kb.by_id(item) is None:
        raise unknown_id(kb, item)


def check_rank(rank: int | None, ranks, source: str = "the input") -> None:
    ranks = sorted(ranks)
    if rank is not None and rank not in ranks:
        raise UsageError(f"--rank {rank}: no such rank in {source}; its ranks: {_names(ranks)}")


def read_config(path: Path, kb) -> dict[str, dict[str, Any]]:
    """The user's threshold overrides, checked against the knowledge base: a file that cannot be
    read or parsed, a value of the wrong type or a parameter the item does not have is a
    ConfigError naming the file; an id that names no rule or case is a UsageError."""
    import yaml

    from ..kb.loader import YamlLimitError, safe_yaml

    where = str(path)
    if not Path(path).exists():
        raise ConfigError("no such config file", where)
    if Path(path).is_dir():
        raise ConfigError("is a directory, expected a YAML file", where)
    try:
        data = safe_yaml(Path(path))
    except YamlLimitError as exc:
        raise ConfigError(exc.problem, f"{where}:{exc.line}:{exc.column}") from None
    except HermesError as exc:
        raise ConfigError(exc.message, where) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', None) or exc}", at) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config must map rule/case ids to {parameter: value} (e.g. 'C-IO-001: {min_share: 0.2}')", where)
    for item_id, params in data.items():
        entry = kb.by_id(str(item_id))
        if entry is None:
            err = unknown_id(kb, item_id)
            err.path = where
            raise err
        if not isinstance(params, dict):
            raise ConfigError(f"{item_id}: expected a mapping of parameter: value, got {type(params).__name__}", where)
        declared = entry.item.parameters
        for name, value in params.items():
            if name not in declared:
                have = ", ".join(sorted(declared)) or "none"
                raise ConfigError(f"{item_id}: unknown parameter {name!r} (its parameters: {have}; hermes kb show {item_id})",
                                  where)  # fmt: skip
            default = declared[name].default
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
                    raise ConfigError(f"{item_id}.{name}: expected a number like its default {default!r}, got {value!r}",
                                      where)  # fmt: skip
            elif type(value) is not type(default):
                raise ConfigError(f"{item_id}.{name}: expected a {type(default).__name__} like its default {default!r}, "
                                  f"got {value!r}", where)  # fmt: skip
    return data


# -- warnings about what was loaded ------------------------------------------------------------

FAR_APART_US = 600e6  # ranks whose traces start this far apart (10 minutes) were not profiled together


def _ranges(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def bundle_warnings(bundle) -> list[str]:
    """A single profiled step per rank; ranks that look like different jobs."""
    out: list[str] = []
    single = [t.rank for t in bundle if len(t.steps) == 1]
    if single:
        out.append(f"rank(s) {_ranges(single)}: a single profiled step; step-to-step variation, spikes and the "
                   f"steady state cannot be measured and warm-up may be in it: profile at least 3 active steps "
                   f"(torch.profiler.schedule(wait=1, warmup=1, active=3))")  # fmt: skip
    if len(bundle) < 2:
        return out
    why = []
    worlds = {t.rank: t.meta.world_size for t in bundle if t.meta.world_size}
    if len(set(worlds.values())) > 1:
        why.append("world sizes " + ", ".join(f"{w} (rank {r})" for r, w in sorted(worlds.items())[:6]))
    devices = {t.rank: t.meta.device_name for t in bundle if t.meta.device_name}
    if len(set(devices.values())) > 1:
        seen: dict[str, int] = {}
        for r, d in sorted(devices.items()):
            seen.setdefault(d, r)
        why.append("devices " + ", ".join(f"{d} (rank {r})" for d, r in seen.items()))
    starts = {t.rank: t.time_span()[0] for t in bundle}
    spans = [t.time_span()[1] - t.time_span()[0] for t in bundle]
    gap = max(starts.values()) - min(starts.values())
    if gap > max(FAR_APART_US, 10 * max(spans, default=0.0)):
        first, last = min(starts, key=starts.get), max(starts, key=starts.get)
        why.append(f"start times {gap / 60e6:,.0f} min apart (rank {first} first, rank {last} last)")
    if why:
        out.append("the ranks may come from different jobs (" + "; ".join(why) + "): cross-rank facts (imbalance, "
                   "waits, slow ranks) compare them as one job; to compare two runs use hermes diff BEFORE AFTER")  # fmt: skip
    return out


def run_warnings(run) -> list[str]:
    """A monitor log holding two or more runs appended (step numbers start again)."""
    out = []
    for r, log in sorted(run.ranks.items()):
        steps = log.step
        restarts = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
        if restarts:
            i = restarts[0]
            out.append(f"{log.path}: holds {len(restarts) + 1} runs appended one after the other (step numbers start "
                       f"again at {steps[i]} after step {steps[i - 1]}); they are analysed as one run: give each "
                       f"run its own RUN_DIR")  # fmt: skip
    return out


__all__ = ["bundle_warnings", "check_item", "check_kinds", "check_rank", "read_config",
           "run_warnings", "unknown"]
