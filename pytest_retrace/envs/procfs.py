"""Finding a task's processes by the tag in their environment (``/proc/<pid>/environ``), and their CPU time.

A process in the middle of ``execve`` shows an *empty* environ: the kernel has switched to the new
address space but not yet copied the environment into it (``mm->env_end`` is still 0). A plain scan
therefore misses a process that a shell forked and is just exec'ing (measured: 1 of 20 scans right
after ``for i in $(seq 200); do sleep 30 & done``), and reset would leave it alive for the next
task. So an empty environ is only believed once ``/proc/<pid>/stat`` says the exec has finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from pytest_retrace.envs import EnvError

_PF_EXITING = 0x00000004  # include/linux/sched.h: dying, its address space may already be gone
_PF_KTHREAD = 0x00200000  # a kernel thread never has one


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None  # exited meanwhile, or not ours to read (another user's, or init's)


def read_environ(pid: int, timeout: float = 5.0) -> bytes:
    """The process's environment block; b"" if it has none (kernel thread, zombie, gone)."""
    deadline = time.monotonic() + timeout
    while True:
        data = _read(f"/proc/{pid}/environ")
        if data != b"":
            return data or b""
        fields = (_read(f"/proc/{pid}/stat") or b"").decode(errors="replace").rsplit(")", 1)[-1].split()
        # after "(comm)": state is field 0, flags field 6, env_end field 47 (proc(5) numbers 3, 9, 50)
        if not fields or fields[0] in ("Z", "X") or int(fields[6]) & (_PF_EXITING | _PF_KTHREAD):
            return b""
        if len(fields) > 47 and int(fields[47]) != 0:
            # exec has finished: this read is authoritative (an empty environment is legal: `env -i`)
            return _read(f"/proc/{pid}/environ") or b""
        if time.monotonic() > deadline:
            raise EnvError(f"process {pid} stayed inside execve for {timeout} s")
        time.sleep(0.001)


def tagged_pids(needle: bytes) -> list[int]:
    """Every live process whose environment contains `needle` (e.g. b"RETRACE_TASK=/tmp/x\\0")."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and needle in read_environ(int(e.name))]


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU time the processes have used so far, their reaped children's included (proc(5):
    utime, stime, cutime, cstime); a process gone meanwhile counts nothing."""
    ticks = 0
    for pid in pids:
        fields = (_read(f"/proc/{pid}/stat") or b"").decode(errors="replace").rsplit(")", 1)[-1].split()
        if len(fields) > 14:  # after "(comm)", utime is field 11 (proc(5) number 14)
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / _TICKS


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None if gone or a zombie: a pid reused by
    another process has another start time."""
    raw = _read(f"/proc/{pid}/stat")
    try:
        fields = raw.decode().rsplit(")", 1)[1].split() if raw else []
    except (UnicodeDecodeError, IndexError):
        return None
    if not fields:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]
