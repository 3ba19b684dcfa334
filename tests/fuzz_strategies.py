"""hypothesis strategies for Kineto event lists (used by tests/test_fuzz.py and benchmarks/fuzz.py).

The events are structured like the profiler's (the categories hermes reads, ProfilerStep and
DataLoader scopes, kernels with correlations, flows, memory instants, metadata) with their fields
drawn from values real traces have and values they never should (NaN-like strings, negative or
huge times, ids beyond 64 bits, wrong types), so that every reader path meets both.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

CATS = ["cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "cuda_runtime", "gpu_memcpy", "gpu_memset",
        "python_function", "cuda_sync", "cpu_instant_event", "ac2g", "Operator", "Kernel", "Runtime", "", "other"]  # fmt: skip
NAMES = ["aten::mm", "aten::add_", "ProfilerStep#1", "ProfilerStep#2", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "Optimizer.step#SGD.step", "cudaLaunchKernel", "ncclKernel_AllReduce_RING_LL_Sum_float", "Memcpy HtoD (Pageable -> Device)",
         "cudaDeviceSynchronize", "[memory]", "void gemm<float>()", "Python GC", "record_param_comms", "", "\x1b[2J", "{{ 7*7 }}"]  # fmt: skip

BASE = 1_700_000_000_000_000.0

times = st.one_of(
    st.floats(min_value=BASE, max_value=BASE + 5e6, allow_nan=False),  # a 5 s window: the bulk
    st.floats(min_value=BASE, max_value=BASE + 5e6, allow_nan=False),
    st.floats(min_value=BASE, max_value=BASE + 5e6, allow_nan=False),
    st.sampled_from([0, -1, -1e15, 1e18, 1e300, "inf", "-inf", "Infinity", "nan", "12", "x", None]),
    st.integers(min_value=-(2**70), max_value=2**70),
)
durations = st.one_of(
    st.floats(min_value=0, max_value=2e5, allow_nan=False),
    st.floats(min_value=0, max_value=2e5, allow_nan=False),
    st.sampled_from([0, -1, -1e9, 1e15, 1e300, "inf", "5", "x", None]),
)
ids = st.one_of(st.integers(min_value=0, max_value=1000), st.integers(min_value=-(2**65), max_value=2**65),
                st.sampled_from(["stream 7", "0x10", "x", None, True, 1.5]))  # fmt: skip
arg_values = st.one_of(ids, st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3),
                       st.lists(st.lists(st.integers(0, 64), max_size=3), max_size=3), st.floats(allow_nan=False))  # fmt: skip
args = st.dictionaries(
    st.sampled_from(["External id", "correlation", "Input Dims", "Input type", "stream", "device", "bytes", "grid", "block",
                     "Collective name", "In msg nelems", "Group size", "dtype", "Record function id", "Sequence number",
                     "Python id", "Python parent id", "Bytes", "Total Allocated", "cuda_sync_kind",
                     "est. achieved occupancy %", "memory bandwidth (GB/s)", "Process Group Name"]),  # fmt: skip
    arg_values, max_size=5,
)


@st.composite
def event(draw) -> dict:
    ph = draw(st.sampled_from(["X", "X", "X", "X", "i", "f", "s", "M"]))
    e: dict = {"ph": ph, "cat": draw(st.sampled_from(CATS)), "name": draw(st.sampled_from(NAMES)),
               "pid": draw(ids), "tid": draw(ids), "ts": draw(times)}  # fmt: skip
    if ph == "X":
        e["dur"] = draw(durations)
    if ph in ("f", "s"):
        e["id"] = draw(ids)
    if draw(st.booleans()):
        e["args"] = draw(args)
    for k in draw(st.lists(st.sampled_from(["ts", "dur", "name", "cat", "pid", "tid", "ph"]), max_size=1)):
        e.pop(k, None)  # a field left out now and then
    return e


def steps_frame(n: int = 3) -> list[dict]:
    """A well-formed skeleton (steps, a data-loader scope, ops) so that analysis goes deep."""
    out = []
    for s in range(n):
        t0 = BASE + s * 1e5
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0,
                    "dur": 1e5, "args": {"External id": s}})  # fmt: skip
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 10, "dur": 5e4,
                    "args": {"External id": 100 + s}})  # fmt: skip
    return out


event_lists = st.builds(lambda skel, extra: skel + extra, st.sampled_from([[], steps_frame(3), steps_frame(8)]),
                        st.lists(event(), min_size=0, max_size=40))  # fmt: skip


def collect_event_lists(n: int, seed_value: int = 18) -> list[list[dict]]:
    """``n`` event lists drawn by hypothesis, the same for the same seed."""
    out: list[list[dict]] = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(event_lists)
    def collect(events):
        out.append(events)

    collect()
    return out[:n]
