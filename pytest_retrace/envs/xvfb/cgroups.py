"""Memory and process limits for one desktop's tasks, as a control group below the worker's own.

A task that allocates without bound (``sort </dev/zero``) would otherwise wake the kernel's OOM killer for the
whole machine, which may pick another worker's desktop or the worker itself: an agent could change other
cases' n. Inside its own group, the task's processes are the only candidates. The group sits below the
worker's current one, so limits the machine already sets on the worker still hold.

Both hierarchies are handled: cgroup v2 (``memory.max``, ``pids.max``) and v1's ``memory`` and ``pids``
controllers. Where neither can be created (no root, a read-only ``/sys/fs/cgroup``, a v2 parent that keeps
processes and controllers apart) the sandbox runs without it and says so once.
"""

from __future__ import annotations

import os
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller ("" for v2's unified hierarchy) -> this process's cgroup path, from /proc/self/cgroup."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


# TaskGroup.joining's line: the count of files, the files, then the command
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"'


class TaskGroup:
    """One desktop's group: ``create()`` once, ``join_files`` for every process of a task, ``remove()`` at the end."""

    def __init__(self, name: str, memory: int, pids: int) -> None:
        self.name, self.memory, self.pids = name, memory, pids
        self.dirs: list[Path] = []
        self.problem: str | None = None

    @property
    def join_files(self) -> list[str]:
        """Where a process writes its pid to join (its children follow it)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def create(self) -> bool:
        try:
            own = _own_paths()
            if "memory" in own and "pids" in own:  # v1
                plan = [(_ROOT / "memory" / own["memory"].lstrip("/") / self.name,
                         {"memory.limit_in_bytes": self.memory}),
                        (_ROOT / "pids" / own["pids"].lstrip("/") / self.name, {"pids.max": self.pids})]
            elif "" in own and (_ROOT / "cgroup.controllers").exists():  # v2
                plan = [(_ROOT / own[""].lstrip("/") / self.name, {"memory.max": self.memory, "pids.max": self.pids})]
            else:
                raise OSError("no memory and pids controllers")
            for path, limits in plan:
                path.mkdir(exist_ok=True)
                self.dirs.append(path)
                for key, value in limits.items():
                    (path / key).write_text(f"{value}\n")
        except OSError as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            self.remove()
            return False
        return True

    def joining(self, argv: list[str]) -> list[str]:
        """`argv`, joining the group before it runs anything (as join() in a preexec_fn, without one): a shell
        line writes its own pid into each of the group's files, then becomes the command."""
        if not self.dirs:
            return argv
        files = self.join_files
        return ["/bin/sh", "-c", _JOIN, "retrace-join", str(len(files)), *files, *argv]

    def join(self, pid: int | None = None) -> None:
        """Move `pid` (default: this process) into the group."""
        for file in self.join_files:
            with open(file, "w") as fh:
                fh.write(f"{pid or os.getpid()}\n")

    def leave(self, pid: int) -> None:
        """Move `pid` back to the group's parent (the worker's group)."""
        for path in self.dirs:
            with open(path.parent / "cgroup.procs", "w") as fh:
                fh.write(f"{pid}\n")

    def remove(self) -> None:
        """Remove the group; it must be empty (every process of the last task has exited)."""
        for path in self.dirs:
            try:
                path.rmdir()
            except OSError:
                pass  # still busy or already gone: the next desktop with this name reuses it
        self.dirs = []
