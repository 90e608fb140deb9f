"""Shared helpers for the project's own tests."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_retrace.envs.procfs import read_environ
from pytest_retrace.envs.xvfb import XvfbEnvironment

REPO = Path(__file__).resolve().parent.parent
_TAG = re.compile(rb"RETRACE_(?:ENV|SESSION)=([^\0]*)")


def retrace_processes(prefix: str) -> dict[int, str]:
    """Live processes started by a retrace environment whose root lies under `prefix` (pid -> cmdline).

    Every process an environment starts carries RETRACE_ENV/RETRACE_SESSION=<its root dir>, so this
    finds leaks of one particular run even while other test workers run desktops of their own."""
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        # not a bare read (empty while a process execs); a zombie has none: it holds no resources
        environ = read_environ(int(entry.name))
        for match in _TAG.finditer(environ):
            if match.group(1).decode(errors="replace").startswith(prefix):
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(entry.name)] = cmd
                break
    return found


@pytest.fixture(scope="module")
def env() -> Iterator[XvfbEnvironment]:
    """A real desktop shared by the tests of one module (started once, always closed)."""
    e = XvfbEnvironment()
    e.start()
    yield e
    e.close()
