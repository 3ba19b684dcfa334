"""One rank of torch_npu profiler output (``*_ascend_pt``) into a RankTrace: the text export's
files read into intermediate tables (``tables``, ``timeline``; what they lack from analysis.db)
and assembled by ``build.build_rank`` (the mapping onto the Kineto-shaped frames is described
there); a rank with only the sqlite export is read by ``db``."""

from __future__ import annotations

from pathlib import Path

from ...core.errors import BadTraceError
from ..bundle import RankTrace
from . import tables as at
from .build import build_rank
from .files import AscendFiles, read_meta
from .timeline import read_timeline


def _optional(reader, path: Path | None, warnings: list[str], *args):
    if path is None:
        return None
    try:
        return reader(path, *args, warnings=warnings)
    except BadTraceError as exc:
        warnings.append(f"skipped {exc}")
        return None


def parse_ascend(af: AscendFiles) -> tuple[RankTrace, float]:
    """Parse one rank directory. Returns the RankTrace (times relative to its first event) and
    the absolute time (µs) of that first event."""
    src = str(af.root)
    if not af.has_any():
        raise BadTraceError(
            "no torch_npu profiler output found (expected ASCEND_PROFILER_OUTPUT/trace_view.json, kernel_details.csv, "
            "communication.json, step_trace_time.csv or ascend_pytorch_profiler_*.db)", src)  # fmt: skip
    has_text = bool(af.files)
    if not has_text and (af.db is not None or af.analysis_db is not None):
        from .db import parse_ascend_db  # the sqlite export, when it is all there is

        return parse_ascend_db(af)
    warnings: list[str] = [f"{af.output / n}: not read: a link out of the profiler directory" for n in af.refused]
    meta_a = read_meta(af)
    warnings += meta_a.warnings
    tl = read_timeline(af.files["trace_view.json"]) if "trace_view.json" in af.files else None
    if tl is not None:
        warnings += tl.warnings
    kd_path = af.get("kernel_details.csv")
    kd = at.kernel_details(kd_path, warnings) if (kd_path is not None and tl is None) else _optional(at.kernel_details, kd_path, warnings)
    comm = _optional(at.communication, af.get("communication.json"), warnings)
    comm_ops, comm_packets = comm if comm is not None else (None, None)
    tables = {
        "step_stats": _optional(at.step_trace_time, af.get("step_trace_time.csv"), warnings),
        "comm_matrix": _optional(at.communication_matrix, af.get("communication_matrix.json"), warnings),
        "op_statistic": _optional(at.statistic, af.get("op_statistic.csv"), warnings, "op_type"),
        "api_statistic": _optional(at.statistic, af.get("api_statistic.csv"), warnings, "api_name"),
    }
    mem = _optional(at.memory_record, af.get("memory_record.csv"), warnings)
    if af.analysis_db is not None and (comm_ops is None or tables["step_stats"] is None or tables["comm_matrix"] is None):
        from .analysis_db import fill_from_analysis_db  # what the text files lack, from analysis.db

        comm_ops, comm_packets = fill_from_analysis_db(af.analysis_db, tables, comm_ops, comm_packets, warnings)
    if af.db is not None and has_text:
        warnings.append(f"{af.db.name} present too: the text export was read")
    return build_rank(af, meta_a, tl, kd, comm_ops, comm_packets, tables, mem, warnings, export="text")
