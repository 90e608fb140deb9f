"""Finding a task's processes by their environment tag, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_retrace.envs.procfs import read_environ, tagged_pids


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        procs.append(subprocess.Popen(argv, env=env, start_new_session=True))
        return procs[-1]

    yield start
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)  # the group: the shell's backgrounded sleeps too
        p.wait()


def test_a_tagged_process_and_every_process_it_forks_are_found(spawn) -> None:
    tag = f"RETRACE_SESSION=procfs-{os.getpid()}"
    name, value = tag.split("=")
    sh = spawn(["/bin/sh", "-c", "for i in 1 2 3 4 5; do sleep 30 & done; wait"], env={**os.environ, name: value})
    deadline = time.monotonic() + 10
    while len(found := tagged_pids(tag.encode() + b"\0")) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sh.pid in found and len(found) == 6
    assert tagged_pids(tag.encode() + b"x\0") == []  # the tag must match whole, not as a prefix


def test_an_empty_environment_is_believed_without_waiting(spawn) -> None:
    # `env -i` is legal: once exec has finished, an empty environ is not "still inside execve"
    p = spawn(["env", "-i", "sleep", "30"])
    deadline = time.monotonic() + 10
    while not os.readlink(f"/proc/{p.pid}/exe").endswith("/sleep") and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    assert read_environ(p.pid) == b""
    assert time.monotonic() - start < 0.5


def test_kernel_threads_zombies_and_gone_processes_have_no_environment() -> None:
    assert read_environ(2) == b""  # kthreadd
    z = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{z.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_environ(z.pid) == b""  # a zombie, not yet reaped
    z.wait()
    assert read_environ(z.pid) == b""  # gone
    assert f"PATH={os.environ['PATH']}".encode() in read_environ(os.getpid()).split(b"\0")
