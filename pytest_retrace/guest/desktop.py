"""The guest's X display: screenshots (mss), the pointer and screen size (python-xlib), windows (xdotool or
wmctrl). Each call is made from starlette's thread pool: mss opens a connection per grab (an mss instance
must not cross threads), the Xlib connection is shared under a lock."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import threading
import time
from typing import Any


def ere_escape(text: str) -> str:
    """`text` as a POSIX extended regular expression matching itself (xdotool's regexes are POSIX ones)."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


class DesktopError(RuntimeError):
    """The display cannot be reached (no DISPLAY, X server gone): the server answers 503."""


class DisplayBlocked(DesktopError):
    """The X server runs but answered no grab within GRAB_DEADLINE: an X client holds a server grab (the
    task's doing, envs/xthread.py). The server answers 409, and at once while that grab's thread is stuck."""


GRAB_DEADLINE = 10.0  # as envs/xthread.py's DEADLINE


class Desktop:
    def __init__(self, display: str | None = None) -> None:
        self._display_name = display
        self._lock = threading.Lock()
        self._xlib: Any = None
        self._stuck: threading.Thread | None = None  # a grab past its deadline, still waiting on the server

    @property
    def display(self) -> str:
        name = self._display_name or os.environ.get("DISPLAY", "")
        if not name:
            raise DesktopError("no X display: start the guest with DISPLAY set")
        return name

    def _grab(self) -> Any:
        """One grab on a thread of its own, waited for GRAB_DEADLINE s: a blocking C call cannot be interrupted,
        and a thread stuck on a grab the task holds must not take the server's other requests with it."""
        import mss

        if self._stuck is not None and self._stuck.is_alive():
            raise DisplayBlocked(f"the X server {self.display} is held by a server grab (a screenshot has waited "
                                 f"on it for over {GRAB_DEADLINE:g} s)")
        factory = getattr(mss, "MSS", None) or mss.mss
        out: dict[str, Any] = {}

        def grab() -> None:
            try:
                with factory(display=self.display) as grabber:
                    out["shot"] = grabber.grab(grabber.monitors[1])
            except Exception as exc:  # noqa: BLE001 - mss raises its own ScreenShotError, and Xlib-level errors
                out["error"] = exc

        thread = threading.Thread(target=grab, name="guest-grab", daemon=True)
        thread.start()
        thread.join(GRAB_DEADLINE)
        if thread.is_alive():
            self._stuck = thread
            raise DisplayBlocked(f"the X server {self.display} answered no screenshot within {GRAB_DEADLINE:g} s "
                                 f"while running: an X client holds a server grab")
        if "error" in out:
            raise DesktopError(f"cannot grab {self.display}: {out['error']}")
        return out["shot"]

    def screenshot_png(self) -> bytes:
        from PIL import Image

        shot = self._grab()
        image = Image.frombytes("RGB", shot.size, shot.bgra, "raw", "BGRX")
        out = io.BytesIO()
        image.save(out, format="PNG", compress_level=1)  # fast: settling polls screenshots
        return out.getvalue()

    def screenshot_rgb(self) -> tuple[int, int, bytes]:
        """Width, height and the RGB bytes, row-major: what settling polls, with no PNG to encode or decode.
        mss's own BGRA-to-RGB (bytearray slices) measured 3.6 ms at 1280x800, PIL's frombytes + tobytes 10.6 ms
        and numpy (not in the image) 4.3 ms; the PNG encode it replaces 19 ms."""
        shot = self._grab()
        return shot.width, shot.height, shot.rgb

    def _x(self, call: Any) -> Any:
        """`call(display)` on the shared Xlib connection, reconnecting once if the connection broke."""
        from Xlib import display as xdisplay

        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._xlib is None:
                        self._xlib = xdisplay.Display(self.display)
                    return call(self._xlib)
                except DesktopError:
                    raise
                except Exception as exc:  # noqa: BLE001 - Xlib raises many unrelated types
                    self._close()
                    if attempt == 2:
                        raise DesktopError(f"cannot query {self.display}: {exc}") from None
        raise AssertionError("unreachable")

    def _close(self) -> None:
        conn, self._xlib = self._xlib, None
        if conn is not None:
            with contextlib.suppress(Exception):  # the connection is broken already
                conn.close()

    def screen_size(self) -> tuple[int, int]:
        return self._x(lambda d: (d.screen().width_in_pixels, d.screen().height_in_pixels))

    def cursor_position(self) -> tuple[int, int]:
        def query(d: Any) -> tuple[int, int]:
            pointer = d.screen().root.query_pointer()
            return int(pointer.root_x), int(pointer.root_y)

        return self._x(query)

    def wait_window(self, titles: list[str], timeout: float, env: dict[str, str]) -> bool | None:
        """Wait until a visible window's title contains one of `titles`: True when one shows, False at the
        timeout, None when the guest has neither xdotool nor wmctrl to look with."""
        path = env.get("PATH")
        xdotool, wmctrl = shutil.which("xdotool", path=path), shutil.which("wmctrl", path=path)
        if xdotool is None and wmctrl is None:
            return None
        run_env = {**env, "DISPLAY": self.display}
        deadline = time.monotonic() + timeout
        while True:
            for title in titles:
                if xdotool is not None:
                    res = subprocess.run([xdotool, "search", "--onlyvisible", "--name", ere_escape(title)],
                                         check=False, capture_output=True, text=True, env=run_env, timeout=10)
                    if res.stdout.split():
                        return True
                else:
                    res = subprocess.run([wmctrl, "-l"], check=False, capture_output=True, text=True, env=run_env,
                                         timeout=10)
                    if any(title in line for line in res.stdout.splitlines()):
                        return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
