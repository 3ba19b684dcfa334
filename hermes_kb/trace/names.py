"""Classification of event names shared by readers and analyzers.

All functions take one distinct name and are applied once per category of a categorical
column, never once per event.
"""

from __future__ import annotations

import re

_STEP_RE = re.compile(r"^ProfilerStep#([0-9]{1,18})$")  # a longer number does not fit a step (int64): not a step

LAUNCH_APIS = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchCooperativeKernel",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel", "hipExtLaunchMultiKernelMultiDevice",
}  # fmt: skip
GRAPH_LAUNCH_APIS = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
SYNC_APIS = {
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize",
    "hipEventSynchronize",
}  # fmt: skip
WAIT_APIS = {"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"}


def runtime_kind(name: str) -> str:
    """launch / graph_launch / sync / wait_event / memcpy / memset / malloc / free / event / other."""
    if name in LAUNCH_APIS:
        return "launch"
    if name in GRAPH_LAUNCH_APIS:
        return "graph_launch"
    if name in SYNC_APIS:
        return "sync"
    if name in WAIT_APIS:
        return "wait_event"
    low = name.lower()
    if "memcpy" in low:
        return "memcpy"
    if "memset" in low:
        return "memset"
    if "launch" in low and "kernel" in low:
        return "launch"
    if "malloc" in low or "hostalloc" in low or low.endswith("memalloc") or "mempoolalloc" in low:
        return "malloc"
    if "free" in low:
        return "free"
    if "synchronize" in low:
        return "sync"
    if low.startswith(("cudaevent", "hipevent", "cuevent")):
        return "event"
    return "other"


def annotation_kind(name: str) -> tuple[str, int]:
    """(kind, step number or -1): step / dataloader / optimizer / other."""
    m = _STEP_RE.match(name)
    if m:
        return "step", int(m.group(1))
    if name.startswith("enumerate(DataLoader)"):
        return "dataloader", -1
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer", -1
    return "other", -1


def is_profiler_scope(name: str) -> bool:
    """ProfilerStep#N, enumerate(DataLoader)#... or Optimizer.step/zero_grad#...: the scopes the
    profiler and PyTorch itself open with record_function."""
    return annotation_kind(name)[0] != "other"


_MEMCPY_RE = re.compile(r"Mem(?:cpy|set)\s*(\w+)?\s*(?:\((\w+)\s*(?:->\s*(\w+))?\))?", re.IGNORECASE)


def memcpy_parts(name: str) -> tuple[str, str, str]:
    """'Memcpy HtoD (Pageable -> Device)' -> ('HtoD', 'Pageable', 'Device'); Memset -> ('Memset', '', dst)."""
    m = _MEMCPY_RE.search(name)
    if not m:
        return "", "", ""
    kind, a, b = m.group(1) or "", m.group(2) or "", m.group(3) or ""
    if name.lower().startswith("memset"):
        return "Memset", "", a
    return kind, a, b


_COLL_PATTERNS = [
    ("all_reduce", re.compile(r"all_?reduce|allreduce", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("send_recv", re.compile(r"sendrecv|send_recv", re.I)),
    ("send", re.compile(r"\bsend|_send|nccl:send", re.I)),
    ("recv", re.compile(r"recv|receive", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
    ("gather", re.compile(r"gather", re.I)),
    ("scatter", re.compile(r"scatter", re.I)),
]

_COLL_KERNEL_RE = re.compile(
    r"nccl|rccl|multimem_all_reduce|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce|"
    r"hccl|allreduce|all_reduce_kernel",
    re.I,
)


def collective_kind(name: str) -> str:
    for kind, pat in _COLL_PATTERNS:
        if pat.search(name):
            return kind
    return "other"


def is_collective_kernel(name: str) -> bool:
    return bool(_COLL_KERNEL_RE.search(name))
