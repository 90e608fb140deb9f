"""The task's process tree as a checkpoint's dump sees it (checkpoint.py, the in-task layout of xserver.py).

CRIU dumps a process and its descendants, and fails on anything tied to outside them. Before a dump, the apps
that setup steps launched are handed to the task's init, and whatever still ties the tree to outside is named:
a process whose parent is outside (a command still running), a group or session begun outside (a setup
command's background process), a pid namespace of an app's own (chromium's sandbox), which CRIU cannot dump.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_retrace.envs.xvfb.sandbox import Sandbox

# How launch() starts an app in the in-task layout: setsid, so its session is the task's; the shell waits, so an
# app that exits early is seen; a dump ends the shell, and the app's parent is then the task's init. Its streams
# are opened inside: ones opened outside the task's mount namespace cannot be dumped.
LAUNCH_SCRIPT = 'setsid "$@" </dev/null >/dev/null 2>&1 & wait $!'


@dataclass
class ProcInfo:
    name: str
    parent: int
    outside_group: bool  # its process group or session was begun outside the task's pid namespace
    cmdline: list[bytes]


def proc_info(pid: int) -> ProcInfo | None:
    """What a dump needs to know of a live process; None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    # NSsid/NSpgid end with the ids the task's own namespace gives: 0 where the leader is outside it (a leader
    # that exited inside is fine: CRIU restores such a group with a helper)
    ids = status.get("NSsid", "").split()[-1:] + status.get("NSpgid", "").split()[-1:]
    return ProcInfo(stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]), "0" in ids, cmdline)


def nested(inside: set[int]) -> list[str]:
    """Children of the task's processes that are not in its pid namespace: in one of their own (chromium's
    sandbox makes one), which CRIU cannot dump ("Can't make pidns id")."""
    found = []
    for pid in inside:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in inside:
                try:
                    name = Path(f"/proc/{child}/comm").read_text().strip()
                except OSError:
                    continue
                found.append(f"{name} (pid {child}) runs in a pid namespace of its own (an app's sandbox), which "
                             f"CRIU cannot dump")
    return found


def hand_to_init(sandbox: Sandbox) -> str | None:
    """Make the task's tree whole for a dump: an app a setup step launched runs under a shell of the task
    (launch()) whose parent is outside; ending that shell hands the app to the task's init. Anything else
    whose parent, group or session is outside the tree, or that runs in a pid namespace of its own: why no
    dump can be taken."""
    init = sandbox.init_pid
    ended = []
    for pid in sandbox.pids(with_root=True):
        info = proc_info(pid)
        if info is not None and info.cmdline[:3] == [b"/bin/sh", b"-c", LAUNCH_SCRIPT.encode()]:
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    deadline = time.monotonic() + 5
    while any(proc_info(pid) is not None for pid in ended) and time.monotonic() < deadline:
        time.sleep(0.005)  # the app's new parent is the init once its shell is reaped
    inside = set(sandbox.pids(with_root=True)) | {init}
    problems = []
    for pid in sorted(inside - {init}):
        info = proc_info(pid)
        if info is None:
            continue
        if info.parent not in inside:
            problems.append(f"{info.name} (pid {pid}) was started from outside the task and still runs")
        elif info.outside_group:
            problems.append(f"{info.name} (pid {pid}) is in a session or process group begun outside the task")
    problems += nested(inside)
    return "; ".join(problems[:3]) or None


def root_processes(sandbox: Sandbox) -> list[tuple[int, str]]:
    """(pid, name) of the task's processes that run as root, but its init and keeper: in the in-task layout
    the X server and the window manager (the task's own processes never run as root)."""
    found = []
    for pid in sandbox.pids(with_root=True):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == ["0"]:
            found.append((pid, fields.get("Name", "").strip()))
    return found
