"""Finding and reading the files torch_npu's profiler writes (``*_ascend_pt`` directories).

Each file is recognised by its own name and header, never by a guess made once for the whole
directory: real exports differ by profiler level (Level0 writes no communication.json), by CANN
version (a leading ``Device_id`` column since 8.x) and by export type (text csv/json or sqlite).
Every reader here returns plain pandas frames with snake_case columns and float µs times, or
``None`` when the file is absent; a damaged file raises ``BadTraceError`` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ...core.errors import BadTraceError, as_rank
from ...core import limits

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TEXT_FILES = (
    "trace_view.json", "kernel_details.csv", "operator_details.csv", "op_statistic.csv",
    "step_trace_time.csv", "communication.json", "communication_matrix.json", "api_statistic.csv",
    "memory_record.csv",
)  # fmt: skip
_DB_RE = re.compile(r"^ascend_pytorch_profiler(?:_\d+)?\.db$")
_RANK_DIR_RE = re.compile(r"rank[-_]?([0-9]+)", re.IGNORECASE)


@dataclass
class AscendFiles:
    """What one rank's directory holds (absolute paths; None when absent)."""

    root: Path  # the *_ascend_pt directory (or the loose directory the files sit in)
    output: Path  # where the ASCEND_PROFILER_OUTPUT files are
    files: dict[str, Path] = field(default_factory=dict)  # file name -> path, for TEXT_FILES
    db: Path | None = None
    analysis_db: Path | None = None
    info: Path | None = None  # profiler_info*.json
    metadata: Path | None = None  # profiler_metadata.json
    refused: list[str] = field(default_factory=list)  # names that link out of the directory: not read

    def has_any(self) -> bool:
        return bool(self.files) or self.db is not None or self.analysis_db is not None

    def get(self, name: str) -> Path | None:
        return self.files.get(name)

    @property
    def rank_hint(self) -> int | None:
        m = None
        for m in _RANK_DIR_RE.finditer(self.root.name):
            pass
        return as_rank(m.group(1)) if m else None


def _stays_inside(p: Path, root: Path) -> bool:
    """``p`` is a regular file whose real path lies under ``root``'s: a link out of the
    directory (to /proc/self/environ, a secrets file, another job's output) is never read."""
    try:
        real, base = p.resolve(strict=True), root.resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return real.is_file() and (real == base or base in real.parents)


def _scan(root: Path, output: Path) -> AscendFiles:
    af = AscendFiles(root=root, output=output)

    def take(p: Path) -> bool:
        if not p.is_file():  # only regular files (a FIFO, a directory or a dangling link is not read)
            return False
        if not _stays_inside(p, root):
            af.refused.append(p.name)
            return False
        return True

    for name in TEXT_FILES:
        p = output / name
        if take(p):
            af.files[name] = p
    for p in sorted(output.glob("*.db")) if output.is_dir() else []:
        if not (_DB_RE.match(p.name) or p.name == "analysis.db") or not take(p):
            continue
        if _DB_RE.match(p.name):
            af.db = p
        else:
            af.analysis_db = p
    infos = [p for p in sorted(root.glob("profiler_info*.json")) if take(p)]
    af.info = infos[0] if infos else None
    meta = root / "profiler_metadata.json"
    af.metadata = meta if take(meta) else None
    return af


def ascend_rank_dir(path: Path) -> AscendFiles | None:
    """The files of one rank if ``path`` is a torch_npu output directory (``*_ascend_pt``, its
    ASCEND_PROFILER_OUTPUT, or a directory holding the output files directly), else None."""
    if not path.is_dir():
        return None
    if path.name == OUTPUT_DIR:
        af = _scan(path.parent, path)
    elif (path / OUTPUT_DIR).is_dir():
        af = _scan(path, path / OUTPUT_DIR)
    else:
        af = _scan(path, path)
    if af.has_any() or path.name.endswith("_ascend_pt") or af.info is not None:
        return af
    return None


def find_ascend_ranks(path: Path) -> list[AscendFiles]:
    """Every rank directory at ``path`` itself or among its direct children."""
    own = ascend_rank_dir(path)
    if own is not None and (own.has_any() or own.root.name.endswith("_ascend_pt")):
        return [own]
    out = []
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        af = ascend_rank_dir(child) if child.is_dir() else None
        if af is not None:
            out.append(af)
    return out


# ---- generic readers -------------------------------------------------------------------------

_UNIT_RE = [(re.compile(r"\(us\)"), "_us"), (re.compile(r"\(ms\)"), "_ms"), (re.compile(r"\(%\)"), "_pct"),
            (re.compile(r"\(mb\)"), "_mb"), (re.compile(r"\(kb\)"), "_kb"), (re.compile(r"\(byte\)"), "_bytes"),
            (re.compile(r"\(gb/s\)"), "_gbps")]  # fmt: skip


def snake(header: str) -> str:
    s = header.strip().lower()
    for pat, rep in _UNIT_RE:
        s = pat.sub(rep, s)
    s = re.sub(r"[^0-9a-z]+", "_", s).strip("_")
    return s


def read_json(path: Path) -> Any:
    data = limits.read_limited(path, what="a JSON file")
    cap = limits.max_events()
    if data.count(b"{") > 2 * cap:  # decoded into Python objects: refuse before they are built
        raise BadTraceError(f"holds more than {cap:,} events, the limit (set HERMES_MAX_EVENTS to read it)", str(path))
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise BadTraceError(f"not valid JSON: {str(exc)[:120]}", str(path)) from None
    except RecursionError:
        raise BadTraceError("not valid JSON: nested too deeply", str(path)) from None
    except UnicodeDecodeError:
        raise BadTraceError("not valid JSON: invalid UTF-8 text", str(path)) from None


def read_csv(path: Path, aliases: dict[str, str] | None = None) -> pd.DataFrame:
    """A torch_npu csv with snake_case headers; text cells stripped, ``N/A`` as missing."""
    limits.check_size(path, what="a csv file")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], skipinitialspace=True)
    except (OSError, ValueError, pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise BadTraceError(f"not a readable csv: {str(exc).splitlines()[0][:120]}", str(path)) from None
    cols = [snake(c) for c in df.columns]
    if aliases:
        cols = [aliases.get(c, c) for c in cols]
    df.columns = cols
    for c in df.columns:
        df[c] = df[c].str.strip()  # timestamps are written with a trailing tab
    return df.replace({"N/A": "", "NA": "", "nan": ""})


def num(s: pd.Series, default: float = np.nan) -> np.ndarray:
    out = pd.to_numeric(s, errors="coerce").to_numpy(np.float64)
    if not np.isnan(default):
        out = np.where(np.isnan(out), default, out)
    return out


def ints(s: pd.Series, default: int = -1) -> np.ndarray:
    """Integer cells as int64; a cell that is not a number, or not one an int64 holds, is ``default``."""
    v = pd.to_numeric(s, errors="coerce").to_numpy(np.float64, na_value=np.nan).copy()
    bad = ~np.isfinite(v) | (np.abs(v) >= 2.0**63)
    v[bad] = default
    return v.astype(np.int64)


def require(df: pd.DataFrame, cols: tuple[str, ...], path: Path) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        # the header's text is not echoed: a file received from someone else may be anything
        raise BadTraceError(f"missing column(s) {', '.join(missing)} (the header has {len(df.columns)} column(s) "
                            "of other names)", str(path))  # fmt: skip


# ---- metadata --------------------------------------------------------------------------------


@dataclass
class AscendMeta:
    rank: int | None = None
    world_size: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    parallel_groups: list[dict[str, Any]] = field(default_factory=list)
    distributed_args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    profiler_level: str | None = None
    device_name: str | None = None
    warnings: list[str] = field(default_factory=list)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v.strip()) < 19:
        return int(v.strip())
    return None


def read_meta(af: AscendFiles) -> AscendMeta:
    m = AscendMeta()
    for path in (af.info, af.metadata):
        if path is None:
            continue
        try:
            doc = read_json(path)
        except BadTraceError as exc:  # metadata is optional: say so and go on
            m.warnings.append(str(exc))
            continue
        if not isinstance(doc, dict):
            m.warnings.append(f"{path}: expected a JSON object; ignored")
            continue
        if m.rank is None:
            m.rank = as_rank(doc.get("rank_id"))
        for k in ("torch_npu_version", "cann_version", "torch_version"):
            if isinstance(doc.get(k), (str, int, float)):
                m.versions[k] = str(doc[k])
        cfg = doc.get("config")
        if isinstance(cfg, dict):
            m.config = cfg
            exp = cfg.get("experimental_config") or {}
            if isinstance(exp, dict) and exp.get("_profiler_level"):
                m.profiler_level = str(exp["_profiler_level"])
        env = doc.get("ENV_VARIABLES")
        if isinstance(env, dict):
            m.env.update({str(k): "" if v is None else str(v) for k, v in env.items()})
        dist = doc.get("distributed_args")
        if isinstance(dist, dict):
            m.distributed_args = dist
            if m.rank is None:
                m.rank = as_rank(dist.get("rank"))
            m.world_size = as_rank(dist.get("world_size")) or None
        groups = doc.get("parallel_group_info")
        if isinstance(groups, dict):
            for key, g in groups.items():
                if isinstance(g, dict):
                    ranks = [int(r) for r in g.get("global_ranks") or [] if _int(r) is not None]
                    m.parallel_groups.append({"pg_name": str(key), "pg_desc": str(g.get("group_name", "")),
                                              "ranks": ranks, "group_size": len(ranks),
                                              "group_rank": _int(g.get("group_rank"))})  # fmt: skip
    return m
