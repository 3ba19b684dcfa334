"""Resource limits on what hermes reads, enforced before the memory is spent (docs/reliability.md).

- ``HERMES_MAX_TRACE_BYTES`` (default 4 GiB): the most bytes of JSON one file may hold, after
  gunzip. A plain file larger than that is refused from its size, before it is read.
- ``HERMES_MAX_GZIP_RATIO`` (default 100): a gzip file may expand to at most this many times its
  own size (at least 64 MiB, at most the byte limit above). Real traces expand 8-30x; a gzip bomb
  (1 MB expanding to 1 GB) is refused as soon as its output passes the bound, while decompressing.
- ``HERMES_MAX_EVENTS`` (default 10,000,000): the most events one file may hold (counted as JSON
  objects before decoding, twice the limit at most, then exactly).

- ``HERMES_MAX_DB_SECONDS`` (default 600): the wall time all queries of one sqlite export (torch_npu's
  db) may take together; sqlite is interrupted past it. Its tables are held to ``HERMES_MAX_EVENTS``
  rows each, counted before one is read.

- ``HERMES_MAX_MEMORY`` (default: the memory the system has available when the file is read): a
  file of more events than that memory holds at ``BYTES_PER_EVENT`` (what reading and analysing an
  event takes at the peak, measured on 500,000 small events) is refused before its events are
  decoded, with one line, instead of exhausting the machine's memory part way.

Only regular files are read: a FIFO, a socket or a device (``/dev/zero``) is refused when it is
opened (non-blocking, so a FIFO with no writer never hangs), never read.
"""

from __future__ import annotations

import os
import stat

from .errors import BadTraceError, InputNotFoundError, UsageError

GiB = 1 << 30
MiB = 1 << 20
DEFAULT_MAX_BYTES = 4 * GiB
DEFAULT_GZIP_RATIO = 100
GZIP_FLOOR = 64 * MiB
DEFAULT_MAX_EVENTS = 10_000_000


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip().replace("_", "")
    if not raw:
        return default
    try:
        value = int(float(raw))
    except (ValueError, OverflowError):  # "inf", "nan", "lots": the setting is wrong, not the trace
        raise UsageError(f"{name}={raw[:40]!r}: not a finite number (give a count, e.g. {name}={default})") from None
    return value if value > 0 else default


def max_bytes() -> int:
    return _env_int("HERMES_MAX_TRACE_BYTES", DEFAULT_MAX_BYTES)


def max_events() -> int:
    return _env_int("HERMES_MAX_EVENTS", DEFAULT_MAX_EVENTS)


DEFAULT_DB_SECONDS = 600
# peak RSS of `hermes advise` per event, measured on 500,000 cpu_op events of ~90 bytes of JSON
# each: 926 MB in the main process (the forked workers' pages are mostly shared): ~1.9 KB an event
BYTES_PER_EVENT = 2048


def available_memory() -> int | None:
    """Bytes the system can give without swapping (MemAvailable), None where it is not known."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(events: int, path: str) -> None:
    """Refuse, in one line, a file whose events would need more memory than there is."""
    budget = _env_int("HERMES_MAX_MEMORY", 0) or available_memory()
    need = events * BYTES_PER_EVENT
    if budget and need > budget:
        raise BadTraceError(f"holds {events:,} events: analysing them needs about {human(need)} (about "
                            f"{human(BYTES_PER_EVENT)} an event), more than the {human(budget)} of memory available "
                            "(free memory, profile fewer steps, or set HERMES_MAX_MEMORY to try anyway)", path)  # fmt: skip


def max_db_seconds() -> int:
    return _env_int("HERMES_MAX_DB_SECONDS", DEFAULT_DB_SECONDS)


def gzip_limit(compressed: int) -> int:
    """The most bytes a gzip file of ``compressed`` bytes may expand to."""
    ratio = _env_int("HERMES_MAX_GZIP_RATIO", DEFAULT_GZIP_RATIO)
    return min(max_bytes(), max(GZIP_FLOOR, ratio * compressed))


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: str | os.PathLike, what: str = "a trace file"):
    """Open ``path`` for reading (binary) if it is a regular file, else raise a one-line
    BadTraceError. Opened non-blocking, then checked on the open descriptor: a FIFO without a
    writer, or one swapped in after a check, never blocks."""
    p = str(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(p):
            raise BadTraceError("is a dangling symbolic link", p) from None
        raise InputNotFoundError("no such file", p) from None
    except IsADirectoryError:
        raise BadTraceError(f"is a directory, expected {what}", p) from None
    except OSError as exc:
        raise BadTraceError(f"cannot read: {exc.strerror or exc}", p) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BadTraceError(f"is a directory, expected {what}", p)
        if not stat.S_ISREG(st.st_mode):
            raise BadTraceError(f"is {_kind(st.st_mode)}, not a regular file: refused", p)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | os.PathLike, limit: int | None = None, what: str = "a trace file") -> bytes:
    """The whole content of a regular file, refused (before reading) above ``limit`` bytes."""
    limit = max_bytes() if limit is None else limit
    fh, st = open_regular(path, what)
    with fh:
        if st.st_size > limit:
            raise BadTraceError(too_big(st.st_size, limit), str(path))
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise BadTraceError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    if len(data) > limit:
        raise BadTraceError(too_big(len(data), limit), str(path))
    return data


def check_size(path: str | os.PathLike, limit: int | None = None, what: str = "a file") -> None:
    """Refuse a file that is not regular or larger than ``limit`` without reading it."""
    limit = max_bytes() if limit is None else limit
    fh, st = open_regular(path, what)
    fh.close()
    if st.st_size > limit:
        raise BadTraceError(too_big(st.st_size, limit), str(path))


def too_big(size: int, limit: int) -> str:
    return (f"holds {human(size)}, more than the limit of {human(limit)} "
            f"(set HERMES_MAX_TRACE_BYTES to read it)")  # fmt: skip
