"""torch_npu's sqlite export (``export_type="db"``) into the same RankTrace as the text export.

``ascend_pytorch_profiler_<rank>.db`` holds what trace_view.json and kernel_details.csv hold,
as tables with interned strings (``STRING_IDS``) and ns integer times; ``analysis.db`` holds
what communication.json, communication_matrix.json and step_trace_time.csv hold. Each table is
turned into the intermediate frame the text readers produce (``Timeline``, the kernel_details
frame, ``comm_ops`` / ``comm_packets``, the summary tables, the memory record) and handed to
``build_rank``, so both exports give the same frames, columns and dtypes:

- ``PYTORCH_API``: ``type`` op -> host operators, queue -> task queue (Enqueue / Dequeue@...),
  trace -> Python functions, mstx -> host ranges; ``globalTid`` = pid << 32 | tid;
- ``CANN_API``: CANN calls, named ``<AscendCL|Node|Hccl|...>@<name>`` as in trace_view.json;
- ``TASK`` + ``COMPUTE_TASK_INFO`` (+ ``TASK_PMU_INFO`` pivoted): device compute tasks and the
  kernel_details columns; ``TASK`` without either info table: copies, events, markers;
- ``COMMUNICATION_OP`` / ``COMMUNICATION_TASK_INFO``: HCCL ops and their transfer tasks;
- host op -> device task (the text export's ``async_npu`` flows): ``PYTORCH_API.connectionId``
  -> ``CONNECTION_IDS`` -> ``TASK.connectionId`` / ``COMMUNICATION_OP.connectionId``;
- ``OVERLAP_ANALYSIS``, ``AICORE_FREQ``, ``MEMORY_RECORD`` (+ ``NPU_MEM`` as ``APP``),
  ``NPU_INFO``, ``META_DATA``, ``RANK_DEVICE_MAP``, ``STEP_TIME`` (step of each task).

Kernel tasks (``KERNEL_*``, ``AI_CORE``, ``MIX_*`` ...) without a COMPUTE_TASK_INFO row are left
out, as the profiler's own overlap analysis and the text export do (they are the HCCL ops'
launch entries and unnamed helper kernels); their number is in ``counts``.

The readers, by what they read: ``db_file`` (the sqlite file and the conversions of its
columns), ``db_host`` (metadata and environment, PYTORCH_API, CANN_API), ``db_device`` (TASK,
COMPUTE_TASK_INFO, COMMUNICATION_*, STEP_TIME, the flows), ``db_tables`` (AICORE_FREQ,
OVERLAP_ANALYSIS, the memory record, the statistics) and ``analysis_db``; this module puts a
rank together.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import BadTraceError
from .analysis_db import read_analysis_db
from .build import build_rank
from .db_device import device_tasks, op_flows, step_time
from .db_file import SqliteFile, refused_objects
from .db_host import cann_calls, host_frames, read_db_meta
from .db_tables import aicore_freq, api_statistic, memory_record, op_statistic, overlap_intervals
from .files import AscendFiles, AscendMeta, read_meta
from .timeline import Timeline
from .timeline import validate as validate_timeline


def read_profiler_db(path: Path, meta_a: AscendMeta, warnings: list[str]):
    """ascend_pytorch_profiler_*.db -> (Timeline, kernel details, memory record, op_statistic,
    api_statistic); ``meta_a`` gains the db's device name, environment and rank."""
    db = SqliteFile(path)
    try:
        warnings += refused_objects(db)
        if "STRING_IDS" not in db.tables:
            raise BadTraceError("not a torch_npu profiler db: no STRING_IDS table", str(path))
        if not db.tables & {"PYTORCH_API", "TASK", "CANN_API", "COMMUNICATION_OP"}:
            raise BadTraceError("not a torch_npu profiler db: none of PYTORCH_API, TASK, CANN_API, COMMUNICATION_OP", str(path))
        counts: dict[str, int] = {}
        read_db_meta(db, meta_a, counts)
        st = db.strings()
        ops, py, queue, links = host_frames(db, st, warnings)
        cann = cann_calls(db, st, warnings)
        steps = step_time(db)
        dev, kd, hops, ht = device_tasks(db, st, steps, warnings, counts)
        flows = op_flows(db, links, dev, hops)
        pids = sorted(set(ops["pid"].astype(np.int64).tolist())) if len(ops) else []
        tids = sorted(set(ops["tid"].astype(np.int64).tolist()) | set(py["tid"].astype(np.int64).tolist())) if len(ops) or len(py) else []
        tl = Timeline(host_ops=ops, python=py, task_queue=queue, cann=cann, device=dev, hccl_ops=hops, hccl_tasks=ht,
                      op_flows=flows, aicore_freq=aicore_freq(db), overlap=overlap_intervals(db), counts=dict(sorted(counts.items())),
                      process_names={str(p): "Python" for p in pids},
                      thread_names={f"{pids[0]}/{t}": f"Thread {t}" for t in tids} if pids else {})  # fmt: skip
        tl = validate_timeline(tl, str(path))  # rows whose times are garbage are dropped and named
        warnings += tl.warnings
        mem = memory_record(db, st)
        return tl, kd, mem, op_statistic(kd), api_statistic(cann)
    except sqlite3.Error as exc:  # a damaged page met halfway through, or the time budget spent
        raise BadTraceError(db._reason(exc, "not a readable sqlite database"), str(path)) from None
    finally:
        db.close()


def parse_ascend_db(af: AscendFiles):
    """One rank of the db export (``ascend_pytorch_profiler_*.db`` and / or ``analysis.db``)."""
    warnings: list[str] = [f"{af.output / n}: not read: a link out of the profiler directory" for n in af.refused]
    meta_a = read_meta(af)
    warnings += meta_a.warnings
    tl = kd = mem = None
    tables: dict[str, pd.DataFrame | None] = {"step_stats": None, "comm_matrix": None, "op_statistic": None, "api_statistic": None}
    if af.db is not None:
        tl, kd, mem, tables["op_statistic"], tables["api_statistic"] = read_profiler_db(af.db, meta_a, warnings)
    comm_ops = comm_packets = None
    if af.analysis_db is not None:
        try:
            an = read_analysis_db(af.analysis_db, warnings)
        except BadTraceError as exc:
            if af.db is None:  # it is all there is
                raise
            warnings.append(f"skipped {exc}")
            an = {k: None for k in ("step_stats", "comm_matrix", "comm_ops", "comm_packets")}
        tables["step_stats"], tables["comm_matrix"] = an["step_stats"], an["comm_matrix"]
        comm_ops, comm_packets = an["comm_ops"], an["comm_packets"]
    elif af.db is not None:
        warnings.append(f"no analysis.db beside {af.db.name}: no step_stats, comm_ops or comm_matrix")
    return build_rank(af, meta_a, tl, kd, comm_ops, comm_packets, tables, mem, warnings, export="db")
