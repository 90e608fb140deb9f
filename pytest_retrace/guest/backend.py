"""What the guest's routes act on: a `GuestBackend`, the desktop they serve.

Two implement it: `guest.work.Guest`, the machine the server runs on (a container's or VM's own processes,
files and X display), and `guest.envbackend.EnvironmentBackend`, a `pytest_retrace.envs` Environment the
server runs beside (the xvfb provider's sandbox, which hides the server's venv and has a network namespace of
its own, so the server cannot run inside it). Every route speaks only this protocol, so one server, with the
same checks and shapes, serves any desktop. What needs more than these primitives (windows, wallpaper,
directory trees: guest/osworld_work.py) is a shell script run through `run`, so both backends do it alike.

Errors: a bad request is ``requests.bad_request`` (a 4xx the route answers as JSON); a desktop that is gone
is `guest.desktop.DesktopError` or the environment's `EnvError` (a 503).
"""

from __future__ import annotations

from typing import IO, Any, Protocol


class GuestBackend(Protocol):
    home: str  # the desktop's home as its own processes see it ("~" in a request)
    roots: tuple[str, ...]  # the trees the file API may reach: the home and /tmp

    def run(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        """OSWorld's /execute result ``{"status", "output", "error", "returncode"}``; a timeout is returncode 124
        with ``timed out after`` in ``error``."""
        ...

    def read(self, path: str) -> bytes | None:
        """A regular file inside the roots; None when missing (403 / 422 for anything else)."""
        ...

    def write(self, path: str, source: IO[bytes]) -> int:
        """Create or replace a file inside the roots (its directories too); the bytes written."""
        ...

    def launch(self, command: list[str] | str, shell: bool) -> str:
        """Start an app without waiting for it; OSWorld's ``... launched successfully``."""
        ...

    def open_file(self, path: str, window: str | None, timeout: float) -> tuple[int, str]:
        """OSWorld's /setup/open_file: the HTTP status and the message."""
        ...

    def screenshot_png(self) -> bytes: ...

    def screenshot_rgb(self) -> tuple[int, int, bytes]:
        """Width, height and the screen's RGB bytes (height * width * 3, row-major): ``/screenshot?format=rgb``,
        which spares settling a PNG encode here and a decode in the harness."""
        ...

    def screen_size(self) -> tuple[int, int]: ...

    def cursor_position(self) -> tuple[int, int]: ...

    def task_cpu(self) -> float | None:
        """CPU seconds the task's processes have used, or None where the desktop cannot tell."""
        ...

    def platform(self) -> str:
        """``platform.system()`` of the desktop: "Linux"."""
        ...
