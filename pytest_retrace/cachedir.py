"""Where pytest-retrace keeps what it may reuse between processes and runs: ``$RETRACE_CACHE_DIR``, else
``$XDG_CACHE_HOME/pytest-retrace``, else ``~/.cache/pytest-retrace``.

What is loaded from there as code (a pickled case, a library CRIU preloads) is read only from a directory that is
this user's own and writable by no one else (:func:`private_dir`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def root() -> Path:
    if explicit := os.environ.get("RETRACE_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-retrace"


def private(path: Path) -> bool:
    """A directory that is ours and writable by no one else (not a link to one)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def private_dir(*parts: str) -> Path | None:
    """``root()/parts...``, each level made (0700) if need be and checked private; None where one is not, or cannot
    be made: the caller then does without the cache."""
    top = root()
    levels = [top]
    for part in parts:
        levels.append(levels[-1] / part)
    try:
        for level in levels:
            level.mkdir(mode=0o700, parents=level is top, exist_ok=True)  # ~/.cache may not exist yet
            if not private(level):
                return None
    except OSError:
        return None
    return levels[-1]
