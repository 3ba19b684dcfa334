"""msgspec structs for the Kineto (PyTorch profiler) Chrome-trace JSON.

The whole file is decoded once into ``KinetoFile`` with each event's ``args`` left raw;
args are decoded afterwards only for the categories that need them, with a struct per
category, so the decoder never builds a dict per event. Field types are unions where real
traces disagree (``tid`` is ``"stream 7"`` in some, timestamps are float in newer traces).
PyTorch 1.8-1.9 spell the device and runtime events' link key ``"external id"``: a second field
(``ext_id_2021``) holds it and the builders coalesce the two (a struct field has one name).
"""

from __future__ import annotations

import msgspec
from msgspec import Raw, field

Num = int | float
EMPTY = Raw(b"{}")
NULL = Raw(b"null")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: int | float | str | None = None
    dur: int | float | str | None = None
    id: int | str | None = None
    args: Raw = EMPTY


class KinetoFile(msgspec.Struct, gc=False):
    """Top level. Metadata stays raw and is decoded leniently: a version written as a float or a
    name as a number must never fail a load."""

    # kept raw: events are decoded a chunk at a time so their structs never all live at once
    traceEvents: list[Raw]
    schemaVersion: Raw = NULL
    deviceProperties: Raw = NULL
    distributedInfo: Raw = NULL
    traceName: Raw = NULL
    displayTimeUnit: Raw = NULL
    baseTimeNanoseconds: Raw = NULL
    record_shapes: Raw = NULL
    profile_memory: Raw = NULL
    with_stack: Raw = NULL
    with_flops: Raw = NULL
    cupti_version: Raw = NULL
    cuda_runtime_version: Raw = NULL
    cuda_driver_version: Raw = NULL
    hip_runtime_version: Raw = NULL
    hip_driver_version: Raw = NULL
    roctracer_version: Raw = NULL
    trace_id: Raw = NULL


class CollectiveArgs(msgspec.Struct, gc=False):
    """Fields PyTorch's record_param_comms puts on the collective's CPU op (and, newer, on its kernel)."""

    collective: str | None = field(default=None, name="Collective name")
    in_nelems: int | None = field(default=None, name="In msg nelems")
    out_nelems: int | None = field(default=None, name="Out msg nelems")
    in_split: str | list | None = field(default=None, name="In split size")
    out_split: str | list | None = field(default=None, name="Out split size")
    group_size: int | None = field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = field(default=None, name="Process Group Name")
    pg_desc: str | None = field(default=None, name="Process Group Description")
    pg_ranks: str | list | None = field(default=None, name="Process Group Ranks")
    seq: int | None = field(default=None, name="Seq")


class CpuOpArgs(CollectiveArgs, gc=False):
    ext_id: int = field(default=-1, name="External id")
    seq_nr: int = field(default=-1, name="Sequence number")
    rf_id: int = field(default=-1, name="Record function id")
    fwd_tid: int = field(default=-1, name="Fwd thread id")
    input_dims: Raw = field(default=Raw(b""), name="Input Dims")
    input_types: Raw = field(default=Raw(b""), name="Input type")
    concrete_inputs: Raw = field(default=Raw(b""), name="Concrete Inputs")


class AnnotationArgs(msgspec.Struct, gc=False):
    ext_id: int = field(default=-1, name="External id")
    rf_id: int = field(default=-1, name="Record function id")
    input_types: Raw = field(default=Raw(b""), name="Input type")  # gloo:* spans: the element type


class KernelArgs(CollectiveArgs, gc=False):
    ext_id: int = field(default=-1, name="External id")
    ext_id_2021: int = field(default=-1, name="external id")
    correlation: int = -1
    device: int = -1
    stream: int | str = -1
    grid: list[int] | str | None = None
    block: list[int] | str | None = None
    registers: int = field(default=-1, name="registers per thread")
    shared_mem: int = field(default=-1, name="shared memory")
    blocks_per_sm: Num = field(default=-1.0, name="blocks per SM")
    warps_per_sm: Num = field(default=-1.0, name="warps per SM")
    occupancy: Num = field(default=-1.0, name="est. achieved occupancy %")
    queued: int = -1
    kind: str | None = None


class RuntimeArgs(msgspec.Struct, gc=False):
    ext_id: int = field(default=-1, name="External id")
    ext_id_2021: int = field(default=-1, name="external id")
    correlation: int = -1
    cbid: int = -1
    stream: int | str | None = None


class MemcpyArgs(msgspec.Struct, gc=False):
    ext_id: int = field(default=-1, name="External id")
    ext_id_2021: int = field(default=-1, name="external id")
    correlation: int = -1
    device: int = -1
    stream: int | str = -1
    bytes: int | str = -1
    bandwidth: Num = field(default=-1.0, name="memory bandwidth (GB/s)")
    kind: str | None = None


class SyncArgs(msgspec.Struct, gc=False):
    ext_id: int = field(default=-1, name="External id")
    correlation: int = -1
    device: int = -1
    stream: int | str = -1
    sync_kind: str | None = field(default=None, name="cuda_sync_kind")
    wait_on_stream: int = -1
    wait_event_corr: int = field(default=-1, name="wait_on_cuda_event_record_corr_id")


class PythonArgs(msgspec.Struct, gc=False):
    py_id: int = field(default=-1, name="Python id")
    parent_id: int | None = field(default=None, name="Python parent id")


class MemoryArgs(msgspec.Struct, gc=False):
    bytes: int | None = field(default=None, name="Bytes")
    total_allocated: int = field(default=-1, name="Total Allocated")
    total_reserved: int = field(default=-1, name="Total Reserved")
    addr: int = field(default=-1, name="Addr")
    device_id: int = field(default=-1, name="Device Id")
    device_type: int = field(default=-1, name="Device Type")


class MetaArgs(msgspec.Struct, gc=False):
    name: str | None = None
    labels: str | None = None
    sort_index: int | None = None


file_decoder = msgspec.json.Decoder(KinetoFile)
