"""Where the MCP server may read: only under the roots it was started with (``--root``).

A path is resolved (``os.path.realpath``) and must lie under a resolved root, as must the path
as given; every symbolic link on the way, and every link inside a directory given as input, must
resolve under a root too; FIFOs, devices and sockets are refused before anything opens them (a
read of a FIFO would block the tool forever). Relative paths are taken relative to each root in
turn (the first where they exist)."""

from __future__ import annotations

import os
import stat

from ..core.errors import EXIT_USAGE, HermesError

MAX_WALK = 100_000  # entries checked inside a directory given as input


class RefusedPath(HermesError):
    """A path the server will not read: outside the roots, a link leaving them, a special file."""

    exit_code = EXIT_USAGE


def _kind(mode: int) -> str | None:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return None if (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) else "not a regular file"


class Roots:
    """The resolved roots, and the check every path goes through."""

    def __init__(self, roots: list[str | os.PathLike]):
        if not roots:
            raise RefusedPath("no --root given: the server would read nothing")
        self.roots: list[str] = []  # resolved
        self.named: list[str] = []  # as given (absolute): a root may itself be reached through a link
        for r in roots:
            real = os.path.realpath(os.fspath(r))
            if not os.path.isdir(real):
                raise RefusedPath("a root must be an existing directory", str(r))
            self.roots.append(real)
            self.named.append(os.path.normpath(os.path.abspath(os.fspath(r))))

    @staticmethod
    def under(path: str, base: str) -> bool:
        return path == base or path.startswith(base.rstrip(os.sep) + os.sep)

    def inside(self, real: str) -> bool:
        return any(self.under(real, r) for r in self.roots)

    def base_of(self, lexical: str) -> str | None:
        """The root (as given or resolved) the path as given lies under, the deepest one."""
        bases = [b for b in (*self.named, *self.roots) if self.under(lexical, b)]
        return max(bases, key=len) if bases else None

    def _candidates(self, path: str) -> list[str]:
        if os.path.isabs(path):
            return [os.path.normpath(path)]
        return [os.path.normpath(os.path.join(r, path)) for r in self.roots]

    def check(self, path: str | os.PathLike) -> str:
        """The resolved path, or RefusedPath saying why not (one line)."""
        given = os.fspath(path)
        if not given or "\x00" in given:
            raise RefusedPath("an empty path or one with a NUL byte", repr(given))
        cands = self._candidates(given)
        lexical = next((c for c in cands if os.path.lexists(c)), cands[0])
        base = self.base_of(lexical)
        if base is None:
            raise RefusedPath(f"outside the server's roots ({', '.join(self.named)})", given)
        self._links_on_the_way(lexical, base, given)
        real = os.path.realpath(lexical)
        if not self.inside(real):
            raise RefusedPath(f"resolves to {real}, outside the server's roots", given)
        try:
            st = os.stat(real)
        except OSError as exc:
            from ..core.errors import InputNotFoundError

            raise InputNotFoundError(f"cannot read it ({exc.strerror})", given) from None
        if (what := _kind(st.st_mode)) is not None:
            raise RefusedPath(f"{what}: refused (only regular files and directories are read)", given)
        if stat.S_ISDIR(st.st_mode):
            self._walk(real, given)
        return real

    def _links_on_the_way(self, lexical: str, base: str, given: str) -> None:
        """Every component of the path below its root that is a symbolic link must resolve under a root."""
        cur = base
        for p in [p for p in lexical[len(base):].split(os.sep) if p]:
            cur = os.path.join(cur, p)
            if os.path.islink(cur) and not self.inside(os.path.realpath(cur)):
                raise RefusedPath(f"the symbolic link {cur} leaves the server's roots", given)

    def _walk(self, real: str, given: str) -> None:
        """A directory given as input: nothing in it may leave the roots or be a special file."""
        seen = 0
        for base, dirs, files in os.walk(real, followlinks=False):
            for name in dirs + files:
                seen += 1
                if seen > MAX_WALK:
                    raise RefusedPath(f"holds over {MAX_WALK} entries: give a smaller directory", given)
                full = os.path.join(base, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(full)
                    if not self.inside(target):
                        raise RefusedPath(f"holds {full}, a symbolic link to {target} outside the roots", given)
                    try:
                        st = os.stat(target)
                    except OSError:
                        continue
                if (what := _kind(st.st_mode)) is not None:
                    raise RefusedPath(f"holds {full}, {what}: refused", given)


__all__ = ["MAX_WALK", "RefusedPath", "Roots"]
