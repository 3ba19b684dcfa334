"""Tensor element types: the one table of the names profilers record for them (Kineto's ``Input
type``, ``record_param_comms`` dtypes, torch dtype names, HCCL / Ascend spellings), each with its
short name and its size in bytes."""

from __future__ import annotations

from functools import lru_cache

# short name, bytes per element, spellings (lower case, without "torch." and "c10::")
_TYPES: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("fp32", 4, ("float", "float32", "fp32")),
    ("fp64", 8, ("double", "float64", "fp64")),
    ("fp16", 2, ("half", "float16", "fp16")),
    ("bf16", 2, ("bfloat16", "bf16", "bfp16")),
    ("fp8", 1, ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")),
    ("int64", 8, ("long int", "long", "int64")),
    ("int32", 4, ("int", "int32")),
    ("int16", 2, ("short int", "short", "int16")),
    ("int8", 1, ("signed char", "char", "int8")),
    ("uint8", 1, ("unsigned char", "byte", "uint8")),
    ("uint16", 2, ("uint16",)),
    ("uint32", 4, ("uint32",)),
    ("uint64", 8, ("uint64",)),
    ("bool", 1, ("bool",)),
    ("complex32", 4, ("complex<half>",)),
    ("complex64", 8, ("complex<float>", "complexfloat")),
    ("complex128", 16, ("complex<double>", "complexdouble")),
)
_BY_SPELLING = {s: (short, size) for short, size, spellings in _TYPES for s in spellings}
# the floating-point types by width, for "the widest float among an operator's inputs"
FLOAT_RANK = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 3, "fp64": 4}


def normalize(name: str) -> str:
    return name.strip().lower().replace("torch.", "").replace("c10::", "")


@lru_cache(maxsize=1024)
def lookup(name: str) -> tuple[str, int] | None:
    """(short name, bytes per element) of a recorded dtype name, None when unknown."""
    return _BY_SPELLING.get(normalize(name))


def element_bytes(name: str) -> int | None:
    """Bytes per element; any 8- or 4-bit float format counts one byte (packed formats round up)."""
    low = normalize(name)
    if low.startswith(("float8", "float4")):
        return 1
    got = _BY_SPELLING.get(low)
    return got[1] if got is not None else None


def short_name(name: str) -> str | None:
    got = lookup(name)
    return got[0] if got is not None else None


# The spellings Kineto's ``Input type`` records for tensor arguments (c10's C++ type names), matched
# as written: its capitalised "Int", "Double" and "Bool" tag scalar arguments, not tensors (2021
# traces), which the case-blind ``lookup`` would take for int32 / fp64 / bool tensors. "long"
# (clang's spelling of int64, in some 2022 traces) is not listed: the operator costs have never
# counted such tensors, and listing it changes those traces' reports.
_INPUT_TYPES = frozenset({
    "float", "double", "c10::Half", "c10::BFloat16", "c10::Float8_e4m3fn", "c10::Float8_e5m2",
    "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz", "c10::Float8_e8m0fnu", "long int", "int", "short int",
    "signed char", "unsigned char", "bool", "c10::complex<float>", "c10::complex<double>", "c10::complex<c10::Half>",
})  # fmt: skip


def input_type(name: str) -> tuple[str, int] | None:
    """(short name, bytes per element) of a tensor argument's Kineto ``Input type`` entry, None for
    a scalar argument's tag or an unknown name (tested as a set member: an unhashable entry raises)."""
    return lookup(name) if name in _INPUT_TYPES else None


__all__ = ["FLOAT_RANK", "element_bytes", "input_type", "lookup", "normalize", "short_name"]
