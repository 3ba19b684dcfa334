"""Facts of the io analyzer (analyzers/io/: dataloader.py, untraced.py, h2d.py): how long the
training loop waits for its data, what that wait is made of (the Hermes paper's reading /
processing / fetching split, adapted to what a Kineto trace records), host time no trace event
explains, and host-to-device copies.
Formulas and thresholds: docs/analysis/io.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import Fact, measure, ratio, us

DataClass = Literal["processing", "reading", "fetching", "worker_wait", "undetermined"]


class NamedTime(BaseModel):
    """A name with the time attributed to it (one row of a top-N list)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    time_us: float = us("time attributed to this name")
    count: int = measure("count", "events with this name")


class DataLoaderWait(Fact):
    """Time the training loop spends inside the DataLoader iterator (``enumerate(DataLoader)#...
    __next__`` annotations) in one step (or, with step = null, over all analysed steps: ``_us``
    fields are sums, ratios are recomputed from the sums), and what that time is made of.

    ``processing_us + reading_us + fetching_us + worker_wait_us + unattributed_us = data_time_us``;
    ``cpu_ops_us + python_us + untraced_us = wait_us``.
    """

    kind: Literal["dataloader_wait"] = "dataloader_wait"
    iterator: Literal["single_process", "multi_process", "other", "mixed"] = Field(
        description="DataLoader iterator class: _SingleProcessDataLoaderIter (num_workers=0), "
        "_MultiProcessingDataLoaderIter (worker processes), another iterator, or several kinds"
    )
    calls_count: int = measure("count", "__next__ annotations in the scope")
    wait_us: float = us("union of the __next__ annotations (clipped to the step window)")
    step_us: float = us("step window length (sum of the windows for the aggregate)")
    step_share_ratio: float = ratio("wait_us / step_us")
    critical_path_us: float | None = us("length of the step's critical path; null when no critical path was computed", default=None)  # fmt: skip
    critical_path_loader_us: float | None = us("host critical-path segments inside the __next__ annotations", default=None)  # fmt: skip
    critical_path_share_ratio: float | None = ratio(
        "critical_path_loader_us / critical_path_us", default=None
    )

    # what runs inside the iterator (shares of wait_us; they add up to 1)
    cpu_ops_us: float = us("inside the iterator: covered by top-level cpu ops")
    python_us: float = us("inside the iterator: covered by python_function events but no cpu op")
    untraced_us: float = us("inside the iterator: covered by no cpu op and no python function")
    cpu_ops_ratio: float = ratio("cpu_ops_us / wait_us (0 when wait_us is 0)")
    python_ratio: float = ratio("python_us / wait_us")
    untraced_ratio: float = ratio("untraced_us / wait_us")
    python_stacks: bool = Field(description="the trace records Python stacks (with_stack): python_function events besides 'Python GC'")  # fmt: skip
    h2d_device_us: float = us(
        "device time of the host-to-device copies running in the step (context for fetching_us)"
    )

    # the queue-based split (Hermes paper, adapted): where the data time goes
    processing_us: float = us("cpu ops (except pin_memory) and Python work other than I/O calls and queue waits inside the iterator")  # fmt: skip
    reading_us: float = us("self time of Python I/O calls (file/socket reads, open, stat, torch.load, ...) inside the iterator")  # fmt: skip
    fetching_us: float = us("host time of the calls issuing the step's host-to-device copies, plus pin_memory ops inside the iterator")  # fmt: skip
    worker_wait_us: float = us("multi-process iterator: untraced time and queue/lock waits inside it (waiting for worker processes)")  # fmt: skip
    unattributed_us: float = us("single-process or other iterator: untraced time inside it (I/O or Python work not recorded)")  # fmt: skip
    data_time_us: float = us("sum of the five components above")
    data_share_ratio: float = ratio("data_time_us / step_us")
    fetching_ratio: float = ratio("fetching_us / step_us: the copies' share of the step, whatever else the loader waits for", default=0.0)
    classification: DataClass = Field(
        description="largest component; 'undetermined' when unattributed_us is the largest or data_time_us is 0"
    )
    classification_ratio: float = ratio("largest component / data_time_us (0 when data_time_us is 0)")
    top_python: list[NamedTime] = Field(
        default_factory=list,
        description="Python functions with the most self time inside the iterator (at most 5)",
    )
    archive_us: float = us(
        "time inside the iterator under archive / decompression frames (zipfile, tarfile, gzip, bz2, lzma, zlib: "
        "the union of those frames; needs with_stack=True)", default=0.0
    )
    archive_ratio: float = ratio("archive_us / wait_us", default=0.0)
    file_opens_count: int = measure(
        "count", "files opened inside the iterator (builtin open() frames; needs with_stack=True)", default=0
    )
    opens_per_call: float = measure("count", "file_opens_count / calls_count", default=0.0)
    open_us: float = us(
        "time inside the iterator under file open / stat frames (open, stat, exists, pathlib), their union",
        default=0.0,
    )
    open_ratio: float = ratio("open_us / wait_us", default=0.0)
    decode_us: float = us(
        "time inside the iterator under image-decoding frames (PIL ImageFile.load and its decoder, cv2.imdecode, "
        "torchvision.io CPU decoders, imageio), their union; needs with_stack=True", default=0.0
    )
    decode_ratio: float = ratio("decode_us / wait_us", default=0.0)

    # the CPU budget (only when the run's monitor log is analysed with the trace: analyzers/monitor/loader_cores.py)
    job_cores: float | None = measure(
        "cores", "CPUs per rank the job can spread loader work over: the machine's CPUs (the mask's when not "
        "pinned narrower) / the job's ranks on the host; null without a monitor log", default=None,
    )
    busy_cores: float | None = measure(
        "cores", "busy cores per rank that more loader work could not use: the larger of own_cores and the machine's "
        "busy CPUs per rank, other processes included (monitor)", default=None
    )
    own_cores: float | None = measure(
        "cores", "cores the rank's own process and its DataLoader workers used on average (monitor): the job's use, "
        "other processes left out", default=None
    )
    core_bound_us: float | None = us(
        "most a loader fix that adds parallelism can remove: step_us - max(step_us - data_time_us, step_us x "
        "min(1, busy_cores / job_cores)); the step cannot get shorter than its CPU work spread over the cores",
        default=None,
    )


class HostGap(BaseModel):
    """One stretch of the host threads with no cpu op and no user annotation running."""

    model_config = ConfigDict(extra="forbid")

    start_us: float = us("gap start, from the bundle origin")
    end_us: float = us("gap end")
    duration_us: float = us("end - start")
    before: str | None = Field(default=None, description="the op/annotation that ended where the gap starts")
    after: str | None = Field(default=None, description="the op/annotation that starts where the gap ends")
    python_function: str | None = Field(
        default=None,
        description="innermost python_function covering at least half of the gap's Python time (with_stack traces only)",
    )
    untraced_us: float = us("part of the gap covered by no python_function either")


class UntracedHostTime(Fact):
    """Host time inside a step (or over all analysed steps, step = null) not spent in any
    operator: on the host threads (the thread with the step annotations and the threads that
    launch device work), the step's host window minus every cpu op and user annotation (other
    than ProfilerStep). Split into Python work (python_function events) and untraced time."""

    kind: Literal["untraced_host_time"] = "untraced_host_time"
    window_us: float = us("host window: step start to the end of its step annotation (sum for the aggregate)")
    outside_ops_us: float = us("time with no cpu op and no user annotation on the host threads")
    python_us: float = us("part of outside_ops_us covered by python_function events")
    untraced_us: float = us("part of outside_ops_us covered by no python_function either")
    python_io_us: float = us(
        "part of python_us inside Python frames that block on I/O or the clock: open/write/flush/fsync/sleep, "
        "pickler dump/load, torch.save/load, logging handlers, socket calls (analyzers/io/untraced.py PYTHON_IO_RE)",
        default=0.0,
    )
    python_io_ratio: float = ratio("python_io_us / window_us", default=0.0)
    io_steps_count: int = measure(
        "count", "aggregate only: steps with python_io_us of at least 10% of their window (0 for a single step)", default=0,
    )
    io_step_excess_us: float | None = us(
        "aggregate only, when some steps do I/O and others (I/O under 1% of the window) do not: the summed excess "
        "of the I/O steps over the median quiet step, i.e. all the I/O steps add, serialisation and state "
        "gathering around the I/O frames included", default=None,
    )
    blocking_io_us: float | None = us(
        "max(python_io_us, io_step_excess_us) when the I/O frames in the I/O steps make up at least half of that "
        "excess (the I/O is what sets those steps apart); else python_io_us (filled in when not given)", default=None,
    )
    monitor_us: float = us(
        "time inside hermes' own monitor (hermes_kb/monitor frames: its step() and resource sampling) in the "
        "window; covered like an operator, so not part of outside_ops_us or python_us", default=0.0,
    )
    python_io_share_ratio: float = ratio("python_io_us / python_us: how much of the Python time is blocking I/O", default=0.0)
    python_preprocess_us: float = us(
        "part of python_us inside input-preprocessing frames on the host threads, outside any DataLoader: image, "
        "video and audio decoding and transforms, tokenizers, Hugging Face processors and pipeline preprocess "
        "(analyzers/io/untraced.py PREPROCESS_RE)", default=0.0,
    )
    python_preprocess_ratio: float = ratio("python_preprocess_us / window_us", default=0.0)
    python_preprocess_share_ratio: float = ratio(
        "python_preprocess_us / python_us: how much of the Python time prepares inputs", default=0.0)
    preprocess_frames: list[str] = Field(
        default_factory=list, description="the outermost input-preprocessing frames, most time first (3 at most)")
    outside_ops_ratio: float = ratio("outside_ops_us / window_us")
    python_ratio: float = ratio("python_us / window_us")
    untraced_ratio: float = ratio("untraced_us / window_us")
    gaps_count: int = measure("count", "stretches of outside_ops_us")
    large_gap_threshold_us: float = us("a gap at least this long counts as large")
    large_gaps_count: int = measure("count", "gaps of at least large_gap_threshold_us")
    large_gaps_us: float = us("total length of the large gaps")
    irregular_pause_us: float = us(
        "of the large gaps, the time under a Python frame that is not I/O and that took at least 5x (and 1 ms more "
        "than) the median of its other calls: ordinary code stopping for milliseconds, as a garbage collection "
        "does (0 without Python stacks)", default=0.0)
    irregular_pause_ratio: float = ratio("irregular_pause_us / window_us", default=0.0)
    irregular_pause_count: int = measure("count", "large gaps with such an irregular pause", default=0)
    irregular_frames: list[str] = Field(default_factory=list, description="the Python frames that paused, longest first")
    python_stacks: bool = Field(description="the trace records Python stacks (with_stack)")
    top_gaps: list[HostGap] = Field(default_factory=list, description="the 3 longest gaps")
    # what is left of python_us once the measuring and the waiting are taken out (only when the run's monitor
    # log is analysed with the trace: analyzers/monitor/profiler_overhead.py)
    profiler_added_us: float | None = us(
        "window_us x profiler_overhead.added_ratio: what profiling added to these steps (0 when not measured); "
        "null without a monitor log", default=None,
    )
    cpu_wait_us: float | None = us(
        "window_us x monitor_cpu.runqueue_wait_ratio: time the training thread was runnable but waiting for a "
        "CPU (0 when not measured); null without a monitor log", default=None,
    )
    python_own_us: float | None = us(
        "max(python_us - profiler_added_us - cpu_wait_us, 0): Python time neither the profiler's cost nor a wait "
        "for a CPU can explain: the interpreter's own work", default=None,
    )
    python_own_ratio: float | None = ratio("python_own_us / window_us", default=None)

    @model_validator(mode="after")
    def _blocking(self) -> UntracedHostTime:
        if self.blocking_io_us is None:
            self.blocking_io_us = self.python_io_us
        return self


class HostToDeviceCopies(Fact):
    """Host-to-device copies of one source memory kind (pageable or pinned) on one rank over all
    analysed steps (step = null)."""

    kind: Literal["h2d_copies"] = "h2d_copies"
    src: Literal["pageable", "pinned", "other"] = Field(description="host memory the copies read from")
    pageable: bool = Field(description="true for pageable (not page-locked) source memory")
    copies_count: int = measure("count", "HtoD memcpy activities")
    copied_bytes: int = measure("bytes", "bytes copied")
    device_us: float = us("sum of the copies' durations on the device")
    host_us: float = us("sum of the durations of the runtime calls that issued them (host blocked or busy)")
    bandwidth_gbps: float | None = measure(
        "gbps", "bytes / device time (null when device time is 0)", default=None
    )
    share_of_h2d_bytes_ratio: float = ratio("bytes / all HtoD bytes of the rank")
    largest_bytes: int = measure("bytes", "largest single copy")
    window_us: float = us("summed length of the analysed step windows", default=0.0)
    waited_us: float = us(
        "time in the windows when the copies hold the step: a copy or the call issuing it in progress while no "
        "kernel runs (the host blocked in a synchronous copy, the device waiting for its input)", default=0.0)
    waited_ratio: float = ratio("waited_us / window_us", default=0.0)
    pinned_copy_us: float | None = us(
        "the same bytes copied from pinned memory at PINNED_LINK_SHARE of the device's host link (one direction; "
        "null: the device or its link is not in hermes' table)", default=None)
    pinned_removes_low_ratio: float | None = ratio(
        "share of waited_us pinned copies remove when they stay exposed: 1 - pinned_copy_us / waited_us", default=None)
    pinned_removes_high_ratio: float | None = ratio(
        "share of waited_us removed when the pinned copies are issued non_blocking ahead of use and hide "
        "behind compute: 1 (null with pinned_copy_us)", default=None)
