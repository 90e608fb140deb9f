"""`EnvironmentBackend`: the guest's routes acting on a `pytest_retrace.envs` Environment from outside it.

The xvfb provider's task runs in a sandbox that hides the harness's files (the venv the server needs) and
has a network namespace of its own, so the server cannot run inside it as in a container. It runs beside
the desktop instead and does everything through the environment: commands with ``env.run`` (in the task's
sandbox, as its user, with its DISPLAY), files with ``env.read_file`` / ``env.write_file``, apps with
``env.launch``, the screen with ``env.screenshot``. ``python`` in OSWorld's commands is the sandbox's
``python3`` (a Debian system has no ``python``).
"""

from __future__ import annotations

import io
import posixpath
import shlex
import time
import weakref
from typing import IO, Any

from pytest_retrace.envs import EnvError, Environment, FileRefused
from pytest_retrace.envs.steps import GUEST_HOME
from pytest_retrace.guest.config import MAX_UPLOAD
from pytest_retrace.guest.desktop import ere_escape
from pytest_retrace.guest.requests import bad_request, expand_home
from pytest_retrace.text import show

# a shell without `python` gets a function of that name: OSWorld's shell commands say `python`
_PYTHON_SHIM = 'command -v python >/dev/null 2>&1 || python() { python3 "$@"; }\n'


def _argv(command: list[str] | str, shell: bool) -> list[str]:
    """The program OSWorld's server would start for `command` (``subprocess`` with `shell`: ``/bin/sh -c``
    with a list's first item as the script and the rest as its ``$0``, ``$1``...), `python` being python3."""
    if shell:
        script, *rest = [command] if isinstance(command, str) else command
        return ["/bin/sh", "-c", _PYTHON_SHIM + script, *rest]
    argv = list(command)
    return ["python3", *argv[1:]] if argv[0] == "python" else argv


class EnvironmentBackend:
    """A `GuestBackend` (guest/backend.py) over `env`, whose home is `home` as the task sees it."""

    def __init__(self, env: Environment, home: str = GUEST_HOME, max_upload: int = MAX_UPLOAD) -> None:
        # a weak reference: a server kept while its environment lives (osworld/connect.py) must not keep it alive
        self._env = weakref.ref(env)
        self.home = home
        self.roots = (home, "/tmp")
        self.max_upload = max_upload

    @property
    def env(self) -> Environment:
        env = self._env()
        if env is None:
            raise EnvError("the environment this guest served is gone")
        return env

    # commands
    def run(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        res = self.env.run(shlex.join(_argv(command, shell)), timeout=timeout)
        return {"status": "success", "output": res.stdout, "error": res.stderr, "returncode": res.returncode}

    def launch(self, command: list[str] | str, shell: bool) -> str:
        argv = _argv(command, shell)
        try:
            self.env.launch(argv)
        except EnvError as exc:
            if self.env.harness_fault() is not None:
                raise
            raise bad_request(400, f"cannot launch {show(command)}: {exc}") from None
        return f"{command if shell else ' '.join(command)} launched successfully"

    def open_file(self, path: str, window: str | None, timeout: float) -> tuple[int, str]:
        full = posixpath.normpath(self._absolute(path))
        if self._test("-e", full):
            if not self._inside(full):
                raise bad_request(403, f"{path}: outside the allowed roots ({', '.join(self.roots)})")
            if not self._has("xdg-open"):
                return 501, "xdg-open is not installed on this desktop: cannot open files"
            self.env.launch(["xdg-open", full])
            name = posixpath.basename(full)
            candidates = [window] if window else [name, posixpath.splitext(name)[0]]
        elif "/" not in path and self._has(path):
            self.env.launch([path])
            candidates = [window or path]
        else:
            raise bad_request(404, f"Application/file not found: {path}")
        if not self._has("xdotool"):
            return 200, "File opened (no xdotool on this desktop to wait for its window)"
        deadline = time.monotonic() + timeout
        while True:
            for title in filter(None, candidates):
                res = self.env.run(f"xdotool search --onlyvisible --name {shlex.quote(ere_escape(title))}", timeout=10)
                if res.stdout.split():
                    return 200, "File opened and window activated successfully"
            if time.monotonic() >= deadline:
                return 500, f"Failed to find window for {candidates} within {timeout:g} seconds."
            time.sleep(0.2)

    # files
    def read(self, path: str) -> bytes | None:
        full = self._confined(path)
        try:
            return self.env.read_file(full)
        except FileRefused as exc:
            text = str(exc)
            raise bad_request(403 if "outside" in text or "leaves" in text else 422, text) from None

    def write(self, path: str, source: IO[bytes]) -> int:
        full = self._confined(path)
        if full in self.roots:
            raise bad_request(422, f"{path} is a directory, not a file")
        data = source.read(self.max_upload + 1)
        if len(data) > self.max_upload:
            raise bad_request(413, f"{path}: over the {self.max_upload}-byte limit of one file")
        try:
            self.env.write_file(full, data)
        except EnvError as exc:
            if self.env.harness_fault() is not None:
                raise
            raise bad_request(422, f"cannot write {path}: {exc}") from None
        return len(data)

    # the desktop
    def screenshot_png(self) -> bytes:
        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(self.env.screenshot()).save(out, format="PNG", compress_level=1)
        return out.getvalue()

    def screenshot_rgb(self) -> tuple[int, int, bytes]:
        import numpy as np

        shot = np.ascontiguousarray(self.env.screenshot(), dtype=np.uint8)  # an (h, w, 3) RGB array already
        return int(shot.shape[1]), int(shot.shape[0]), shot.tobytes()

    def screen_size(self) -> tuple[int, int]:
        shot = self.env.screenshot()  # the display as it is, not as configured
        return int(shot.shape[1]), int(shot.shape[0])

    def cursor_position(self) -> tuple[int, int]:
        return self.env.cursor_position()

    def task_cpu(self) -> float | None:
        return self.env.task_cpu_seconds()

    def platform(self) -> str:
        return "Linux"  # every provider's desktop is an X11 Linux one

    # helpers
    def _absolute(self, path: str) -> str:
        full = expand_home(path, self.home)
        return full if full.startswith("/") else f"{self.home}/{full}"

    def _inside(self, full: str) -> bool:
        return any(full == root or full.startswith(root + "/") for root in self.roots)

    def _confined(self, path: str) -> str:
        """`path` absolute and normalised; inside the roots lexically, or 403 (the environment's own file
        calls then refuse a link out of them)."""
        full = posixpath.normpath(self._absolute(path))
        if not self._inside(full):
            raise bad_request(403, f"{path}: outside the allowed roots ({', '.join(self.roots)})")
        return full

    def _test(self, flag: str, path: str) -> bool:
        return self.env.run(f"test {flag} {shlex.quote(path)}", timeout=10).returncode == 0

    def _has(self, program: str) -> bool:
        return self.env.run(f"command -v {shlex.quote(program)}", timeout=10).returncode == 0

