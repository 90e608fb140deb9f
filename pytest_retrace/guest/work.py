"""The guest's work on the machine it runs on, blocking (the app runs it in starlette's thread pool): the task's
processes, paths confined to the allowed roots, commands and launches (as ``run_as``), opening files, reading and
writing files, the local X display. `Guest` is the local `GuestBackend` (guest/backend.py)."""

from __future__ import annotations

import os
import platform
import posixpath
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from pytest_retrace.envs import FileRefused
from pytest_retrace.envs.guestfs import MAX_READ, GuestFS
from pytest_retrace.envs.procfs import cpu_seconds
from pytest_retrace.guest.config import GuestConfig
from pytest_retrace.guest.desktop import Desktop
from pytest_retrace.guest.requests import bad_request, expand_home
from pytest_retrace.text import show


class Guest:
    def __init__(self, config: GuestConfig) -> None:
        self.config = config
        self.home = os.path.realpath(config.home)
        roots = config.roots
        self.fs = GuestFS({root: Path(root) for root in roots}, self.home)
        self.roots = roots
        self.desktop = Desktop(config.display)
        self.env = dict(config.env if config.env is not None else os.environ)
        if config.display:
            self.env["DISPLAY"] = config.display  # apps and commands show on the display served

    # the desktop
    def screenshot_png(self) -> bytes:
        return self.desktop.screenshot_png()

    def screenshot_rgb(self) -> tuple[int, int, bytes]:
        return self.desktop.screenshot_rgb()

    def screen_size(self) -> tuple[int, int]:
        return self.desktop.screen_size()

    def cursor_position(self) -> tuple[int, int]:
        return self.desktop.cursor_position()

    def task_cpu(self) -> float | None:
        return cpu_seconds(self.task_pids())

    def platform(self) -> str:
        return platform.system()

    # processes
    def task_pids(self) -> list[int]:
        """The task's processes: every process of ``run_as``'s user, or, when commands run as the server's own
        user, the server's descendants (what it started)."""
        parents: dict[int, int] = {}
        owners: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry.name}/status").read_text()
            except OSError:
                continue  # exited meanwhile
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            parents[int(entry.name)] = int(fields["PPid"])
            owners[int(entry.name)] = int(fields["Uid"].split()[0])  # the real uid
        if self.config.run_as is not None:
            return [pid for pid, uid in owners.items() if uid == self.config.run_as[0]]
        found, frontier = [], [os.getpid()]
        while frontier:
            children = [pid for pid, parent in parents.items() if parent in frontier]
            found += children
            frontier = children
        return found

    # paths
    def absolute(self, path: str) -> str:
        """A request's path as an absolute path, ``..`` resolved lexically (links are the callers' business)."""
        return posixpath.normpath(self.fs.absolute(path))

    def inside(self, path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in self.roots)

    def _confine(self, shown: str, full: str) -> str:
        """`full` with every link resolved, which must still be in an allowed root (403 otherwise)."""
        real = os.path.realpath(full)
        if not (self.inside(full) and self.inside(real)):
            raise bad_request(403, f"{shown}: outside the allowed roots ({', '.join(self.roots)})")
        return real

    # commands
    def _as_user(self) -> dict[str, Any]:
        """Popen's arguments that start a process as ``config.run_as``: no supplementary groups, the process
        limit, and the OOM killer's first choice (raising one's own score needs no privilege), so that a task
        that eats the container's memory loses its own processes, not the desktop's."""
        if self.config.run_as is None:
            return {}
        uid, gid = self.config.run_as
        nproc, fsize = self.config.nproc_limit, self.config.fsize_limit

        def drop() -> None:  # in the child, in this order: the score and limit need root, then become the user
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")
            import resource

            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        return {"preexec_fn": drop}

    def run(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        """OSWorld's /execute result; output goes to files, not pipes, so a command that leaves a process
        behind (``app &``) does not hold the request open until the timeout."""
        cap = self.config.max_output
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        cwd=self.home, env=self.env, start_new_session=True, **self._as_user())
            except OSError as exc:
                raise bad_request(400, f"cannot run {show(command)}: {exc.strerror or exc}") from None
            try:
                code, note = proc.wait(timeout=timeout), ""
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                code, note = 124, f"\nretrace guest: timed out after {timeout:g} s"
            out.seek(0)
            err.seek(0)
            return {"status": "success", "output": out.read(cap).decode(errors="replace"),
                    "error": err.read(cap).decode(errors="replace") + note, "returncode": code}

    def launch(self, command: list[str] | str, shell: bool) -> str:
        try:
            proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, cwd=self.home, env=self.env, start_new_session=True,
                                    **self._as_user())
        except OSError as exc:
            raise bad_request(400, f"cannot launch {show(command)}: {exc.strerror or exc}") from None
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()  # no zombies
        return f"{command if shell else ' '.join(command)} launched successfully"

    def open_file(self, path: str, window: str | None, timeout: float) -> tuple[int, str]:
        """OSWorld's /setup/open_file: open a file with xdg-open, or start an application by name, then
        wait until a window whose title holds the name (or `window`) shows."""
        full = self.absolute(expand_home(path, Path(self.home)))
        if os.path.lexists(full):
            real = self._confine(path, full)
            opener = shutil.which("xdg-open", path=self.env.get("PATH"))
            if opener is None:
                return 501, "xdg-open is not installed on this guest: cannot open files"
            self.launch([opener, real], False)
            name = Path(real).name
            candidates = [window] if window else [name, Path(name).stem]
        elif "/" not in path and shutil.which(path, path=self.env.get("PATH")):
            self.launch([path], False)
            candidates = [window or path]
        else:
            raise bad_request(404, f"Application/file not found: {path}")
        found = self.desktop.wait_window([c for c in candidates if c], timeout, self.env)
        if found is None:
            return 200, "File opened (no xdotool or wmctrl on this guest to wait for its window)"
        if found:
            return 200, "File opened and window activated successfully"
        return 500, f"Failed to find window for {candidates} within {timeout:g} seconds."

    # files
    def read(self, path: str) -> bytes | None:
        full = self.absolute(path)
        if not self.inside(full):
            raise bad_request(403, f"{path}: outside the allowed roots ({', '.join(self.roots)})")
        try:
            return self.fs.read(full, cap=MAX_READ)
        except FileRefused as exc:
            real = os.path.realpath(full)
            raise bad_request(403 if not self.inside(real) else 422, str(exc).replace("the sandbox's", "the guest's")) from None
        except OSError as exc:
            raise bad_request(422, f"{path}: cannot be read ({exc.strerror or exc})") from None

    def write(self, path: str, source: Any) -> int:
        """Copy the file object `source` to `path` (created with its directories); the bytes written."""
        full = self.absolute(path)
        real = self._confine(path, full)
        if real in self.roots:
            raise bad_request(422, f"{path} is a directory, not a file")
        try:
            self._makedirs(os.path.dirname(real))
            # O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of hanging the request
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise bad_request(422, f"cannot write {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise bad_request(422, f"cannot write {path}: not a regular file")
            os.set_blocking(fd, True)
            if self.config.run_as is not None:
                os.fchown(fd, *self.config.run_as)
            fh.truncate(0)
            written = 0
            while chunk := source.read(1024 * 1024):
                fh.write(chunk)
                written += len(chunk)
        return written

    def _makedirs(self, path: str) -> None:
        """os.makedirs, each new directory given to ``config.run_as`` (the task must be able to use them)."""
        if os.path.isdir(path):
            return
        self._makedirs(os.path.dirname(path))
        try:
            os.mkdir(path)
        except FileExistsError:
            return  # made by a concurrent request
        if self.config.run_as is not None:
            os.chown(path, *self.config.run_as, follow_symlinks=False)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
