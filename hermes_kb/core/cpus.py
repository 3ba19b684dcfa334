"""The CPU this process runs on: usable cores, and what its vector units can do at most."""

from __future__ import annotations

import os
from pathlib import Path

# the /proc/cpuinfo flags the monitor records: those that decide the FP32 FMA width, and the
# 16-bit matrix units (AMX, AVX512-BF16) the BF16 advice depends on
VECTOR_FLAGS = ("avx512f", "avx2", "fma", "avx", "sse2", "amx_tile", "avx512_bf16", "asimd", "sve")


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def host_cpu(cpuinfo: str | Path = "/proc/cpuinfo", max_freq: str | Path = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") -> dict:
    """Model name, vector flags and clock (MHz) of the first CPU, from Linux's /proc; {} elsewhere.
    The clock is the cpufreq maximum where the kernel exposes it (virtual machines often do not),
    else the 'cpu MHz' line."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    out: dict = {"model": fields.get("model name") or fields.get("Processor") or "",
                 "flags": sorted(flags & set(VECTOR_FLAGS))}  # fmt: skip
    mhz = None
    try:
        mhz = int(Path(max_freq).read_text().strip()) / 1000.0
    except (OSError, ValueError):
        try:
            mhz = float(fields.get("cpu MHz", ""))
        except ValueError:
            mhz = None
    if mhz:
        out["mhz"] = round(mhz, 1)
    return out


def fp32_fma_peak_per_core(cpu: dict) -> tuple[float, float] | None:
    """(low, high) FP32 FLOP/s of one core's FMA units at the recorded clock, or None when the clock
    or the vector width is unknown. 2 FLOPs per FMA lane; x86 cores have one or two FMA ports of
    the widest width (AVX-512 parts ship with one or two 512-bit units; /proc does not say which),
    AVX2 cores two 256-bit ones; without FMA, one multiply and one add per cycle."""
    mhz = cpu.get("mhz")
    flags = set(cpu.get("flags") or ())
    if not isinstance(mhz, (int, float)) or mhz <= 0:
        return None
    hz = mhz * 1e6
    if "avx512f" in flags:
        lanes, units = 16, (1, 2)
    elif "avx2" in flags and "fma" in flags:
        lanes, units = 8, (2, 2)
    elif "avx" in flags:
        lanes, units = 8, (1, 1)
    elif "sse2" in flags:
        lanes, units = 4, (1, 1)
    elif "asimd" in flags:
        lanes, units = 4, (2, 4)  # Arm NEON: 2 to 4 128-bit FMA pipes (Neoverse N1 to V2)
    else:
        return None
    return 2.0 * lanes * units[0] * hz, 2.0 * lanes * units[1] * hz
