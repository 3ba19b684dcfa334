"""What of the environment matters for performance, captured once per run."""

from __future__ import annotations

import gc
import os
import platform
import sys

from ..core.cpus import host_cpu

ENV_PREFIXES = ("NCCL_", "HCCL_", "TORCH_", "CUDA_", "ASCEND_", "OMP_", "MKL_", "KMP_", "PYTORCH_", "TORCHINDUCTOR_")
ENV_NAMES = ("OMP_NUM_THREADS", "CUDA_LAUNCH_BLOCKING", "ASCEND_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF",
             "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "ASCEND_GLOBAL_LOG_LEVEL", "WORLD_SIZE", "LOCAL_WORLD_SIZE")  # fmt: skip


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    versions = {"python": platform.python_version()}
    torch = sys.modules.get("torch")  # never import torch just to read its version
    if torch is not None:
        versions["torch"] = getattr(torch, "__version__", "?")
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        if cuda:
            versions["cuda"] = cuda
        try:
            if torch.cuda.is_available():
                versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    npu = sys.modules.get("torch_npu")
    if npu is not None:
        versions["torch_npu"] = getattr(npu, "__version__", "?")
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "versions": versions,
        "env": env,
        "gc_thresholds": list(gc.get_threshold()),
        "gc_enabled": gc.isenabled(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "pid": os.getpid(),
        "torch_threads": _torch_threads(torch),
        "torch_backends": torch_backends(torch),
        "cpu": host_cpu(),
    }


def torch_backends(torch) -> dict:
    """The switches that choose device kernels (cuDNN autotuning, TF32), as the job set them."""
    if torch is None:
        return {}
    import warnings

    out: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading allow_tf32 is deprecated in newer torch
        try:
            b = torch.backends
            out["cudnn_enabled"] = bool(b.cudnn.enabled)
            out["cudnn_benchmark"] = bool(b.cudnn.benchmark)
            out["cudnn_deterministic"] = bool(b.cudnn.deterministic)
            out["cudnn_allow_tf32"] = bool(b.cudnn.allow_tf32)
            out["matmul_allow_tf32"] = bool(b.cuda.matmul.allow_tf32)
            out["float32_matmul_precision"] = str(torch.get_float32_matmul_precision())
        except Exception:
            pass
    return out


def _torch_threads(torch) -> int | None:
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:
        return None


def detect_rank() -> int:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    for key in ("RANK", "LOCAL_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0
