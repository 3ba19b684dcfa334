"""Reading what other processes leave in the run directory (capture requests, peer summaries)
from inside the training process, so that nothing there can stop, slow or bloat training: a
regular file only (not a FIFO, a device or a symlink to one), opened without blocking, at most a
few kilobytes, JSON or nothing. Standard library only (the monitor runs at training time)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 64 * 1024  # a request or a peer summary is a few hundred bytes


def read_small_json(path: str | os.PathLike, limit: int = MAX_BYTES) -> tuple[Any, str | None]:
    """(the JSON value, None), or (None, why not) for a file that is absent, not a regular file,
    a symbolic link, larger than ``limit`` bytes, or not JSON. Never blocks, never raises."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # a symlink under O_NOFOLLOW, no permission
        return None, f"cannot open ({exc.strerror or type(exc).__name__})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > limit:
            return None, f"{st.st_size} bytes, over the {limit}-byte limit"
        data = os.read(fd, limit + 1)
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or type(exc).__name__})"
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"over the {limit}-byte limit"
    try:
        return json.loads(data), None
    except (ValueError, RecursionError):
        return None, "not JSON"


def inside(base: Path, name: str) -> Path | None:
    """``base / name`` when it stays directly inside ``base`` (no separator, no '..')."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        return None
    return base / name


__all__ = ["MAX_BYTES", "inside", "read_small_json"]
