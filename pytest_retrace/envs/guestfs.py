"""Reading the files an agent left behind, as the harness (root) must: without trusting any of them.

An evaluator reads ``~/report.txt`` after the agent had a real shell in the sandbox for several turns, and
processes it started may still be running. So the file may be a FIFO (an ``open`` blocks forever), a link to
``/dev/zero`` (an endless read) or to a file outside the sandbox that only root may read (``/etc/shadow``,
which would then land in reports), a directory, or huge. Each of these is the agent's artefact and must score
the check 0 with a reason (:class:`FileRefused`), never hang the worker or count as an infrastructure error.

Paths are resolved the way the sandbox sees them, one component at a time with ``O_PATH | O_NOFOLLOW`` file
descriptors: a symbolic link is followed by reading it and continuing from where it points (absolute links
from the sandbox's root), so a link swapped in by a still-running process between two steps cannot redirect
the walk outside. Only the sandbox's private trees (``/home/user`` and ``/tmp``) can be read; the last open is
non-blocking and must yield a regular file no larger than the cap.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from pytest_retrace.envs import FileRefused

MAX_READ = 64 * 1024 * 1024  # the largest file an evaluator reads: an office document is a few MiB
_MAX_LINKS = 40  # as the kernel's own limit for one path lookup (MAXSYMLINKS)
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


class GuestFS:
    """The sandbox's private trees as the guest names them (``{"/home/user": host dir, "/tmp": host dir}``)."""

    def __init__(self, roots: Mapping[str, Path], home: str) -> None:
        self.roots = {tuple(_parts(guest)): Path(host) for guest, host in roots.items()}
        self.home = home

    def absolute(self, path: str) -> str:
        """A guest path with ``~`` expanded and a relative path taken from the home."""
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        return path if path.startswith("/") else f"{self.home}/{path}"

    def read(self, path: str, cap: int = MAX_READ) -> bytes | None:
        """The bytes of the regular file at guest `path`; None if it does not exist; FileRefused otherwise."""
        shown = path
        parent, name = self._walk(_parts(self.absolute(path)), shown)
        if parent is None:
            return None
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC,
                             dir_fd=parent)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # swapped for a link after the walk looked at it
                    raise FileRefused(f"{shown}: became a symbolic link while being read") from None
                if exc.errno in (errno.ENXIO, errno.EACCES, errno.EPERM):  # a socket, or not ours to read
                    raise FileRefused(f"{shown}: cannot be opened ({exc.strerror})") from None
                raise
            info = os.fstat(fd)  # of what was opened: authoritative, whatever happens to the name now
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise FileRefused(f"{shown} is {_kind(info.st_mode)}, not a regular file")
            if info.st_size > cap:
                os.close(fd)
                raise FileRefused(f"{shown} is {info.st_size} bytes, over the {cap}-byte limit")
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(cap + 1)
            if len(data) > cap:
                raise FileRefused(f"{shown} grew over the {cap}-byte limit while being read")
            return data
        finally:
            os.close(parent)

    def _walk(self, pending: list[str], shown: str) -> tuple[int | None, str]:
        """(fd of the directory holding the last component, its name); (None, "") if a directory is missing.

        Follows links like the kernel would inside the sandbox, but refuses any step out of a private tree."""
        where: list[str] = []  # guest components resolved so far
        fds: list[int] = []  # one O_PATH fd per component inside a tree: fds[0] is the tree's root
        links = 0
        pending = list(pending)
        try:
            while pending:
                name = pending.pop(0)
                if name == "..":
                    if fds and len(fds) == 1:
                        raise FileRefused(f"{shown}: leaves {'/' + '/'.join(where)}")
                    if fds:
                        os.close(fds.pop())
                    if where:
                        where.pop()
                    continue
                if not fds:  # still above the trees: only their ancestors can be crossed
                    where.append(name)
                    host = self.roots.get(tuple(where))
                    if host is not None:
                        fds.append(os.open(host, _PATH_FLAGS | os.O_DIRECTORY))
                    elif not any(root[: len(where)] == tuple(where) for root in self.roots):
                        raise FileRefused(f"{shown}: /{'/'.join(where)} is outside the sandbox's home and /tmp")
                    if not pending:
                        raise FileRefused(f"{shown} is a directory, not a regular file")
                    continue
                try:
                    fd = os.open(name, _PATH_FLAGS, dir_fd=fds[-1])
                except (FileNotFoundError, NotADirectoryError):
                    return None, ""
                mode = os.fstat(fd).st_mode
                if stat.S_ISLNK(mode):
                    os.close(fd)
                    links += 1
                    if links > _MAX_LINKS:
                        raise FileRefused(f"{shown}: too many levels of symbolic links")
                    target = os.readlink(name, dir_fd=fds[-1])
                    if target.startswith("/"):  # from the sandbox's root: start over from the top
                        while fds:
                            os.close(fds.pop())
                        where = []
                    pending = _parts(target) + pending
                    continue
                if not pending:  # the last component: the caller opens it for reading
                    os.close(fd)
                    return fds.pop(), name
                if not stat.S_ISDIR(mode):
                    os.close(fd)
                    return None, ""  # a file used as a directory: the path does not exist
                fds.append(fd)
                where.append(name)
            raise FileRefused(f"{shown} is a directory, not a regular file")
        finally:
            for fd in fds:
                os.close(fd)
