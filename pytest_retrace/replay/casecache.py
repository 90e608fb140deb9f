"""Validated case files kept between processes, so that each pytest process does not parse and validate the
suite again: every xdist worker collects every case, and parsing and validating the 251 built-in ones costs a
process about 0.5 CPU-s, ten times what reading them back from here does (benchmarks/bench_startup.py).

A case is found again only for the same bytes at the same path read by the same code: the key is a digest of the
file's content, its path (and the working directory when the path is relative: a case's files resolve against
it), and a stamp of this package's sources (each module's size and modification time), of Python's and of
pydantic's versions. So an edited case file, or an edited validator, is parsed anew. What a load checks outside
the case file (its referenced files exist, the screenshots' sizes) is not kept here: ``load_case`` checks it on
every load. A file that fails to load is never kept: its error is reported from a fresh parse each time.

Entries are pickles of the validated model, and a pickle is code: the directory (``$RETRACE_CACHE_DIR``, else
``$XDG_CACHE_HOME/pytest-retrace``, else ``~/.cache/pytest-retrace``) must be this user's own and writable by
no one else, or nothing is read from or written to it. ``RETRACE_CASE_CACHE=0`` turns the cache off. Only the
current stamp's entries are kept: the first process of a new stamp removes the others, and a stamp's entries
are emptied when there are more than MAX_ENTRIES.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pytest_retrace.cachedir import private_dir

PACKAGE = Path(__file__).resolve().parent.parent
VERSION = 1  # of this layout
# Entries of one stamp are emptied past this many: temporary case files (a test suite's) each leave one, and
# the cache must not grow without bound between two changes of the code. About 3 KB each.
MAX_ENTRIES = 10_000


@functools.cache
def _stamp() -> str:
    import pydantic

    digest = hashlib.sha256(f"{VERSION} {sys.version} {pydantic.VERSION} {pickle.HIGHEST_PROTOCOL}".encode())
    for source in sorted(PACKAGE.rglob("*.py")):
        info = source.stat()
        digest.update(f"\0{source.relative_to(PACKAGE)} {info.st_size} {info.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


@functools.cache
def directory() -> Path | None:
    """This stamp's entry directory, made if need be; None when the cache is off or its place is not private."""
    if os.environ.get("RETRACE_CASE_CACHE", "1") == "0":
        return None
    here = private_dir("cases", _stamp())
    if here is None:
        return None
    cases = here.parent
    try:
        for other in cases.iterdir():  # entries of older code: never read again
            if other.name != here.name:
                shutil.rmtree(other, ignore_errors=True)
        with os.scandir(here) as entries:
            if sum(1 for _ in entries) > MAX_ENTRIES:
                shutil.rmtree(here, ignore_errors=True)
                here.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return here


def key(path: Path, content: bytes) -> str:
    where = str(path) if path.is_absolute() else f"{os.getcwd()}\0{path}"
    return hashlib.sha256(where.encode() + b"\0" + content).hexdigest()


def get(entry: str) -> Any | None:
    """The case kept under ``entry``, or None (none kept, the cache off, or an entry that does not load)."""
    here = directory()
    if here is None:
        return None
    try:
        with open(here / entry, "rb") as file:
            return pickle.load(file)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a torn or foreign entry is only a miss: the file is parsed instead
        return None


def put(entry: str, case: Any) -> None:
    """Keep ``case`` under ``entry``: written to a temporary file and renamed, so that a process reading it
    at the same moment (xdist workers collect together) sees the whole entry or none."""
    here = directory()
    if here is None:
        return
    try:
        with tempfile.NamedTemporaryFile(dir=here, prefix=".tmp-", delete=False) as file:
            pickle.dump(case, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(file.name, here / entry)
    except (OSError, pickle.PicklingError):
        try:
            os.unlink(file.name)
        except (OSError, NameError):
            pass
