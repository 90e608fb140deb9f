"""The task's files and windows on a guest, for :class:`~pytest_retrace.envs.remote.environment.RemoteEnvironment`:
``/file`` and ``/setup/upload`` with the guest's paths (a Windows guest's under %USERPROFILE%), and the
visible windows (xdotool, wmctrl, or a Windows guest's pygetwindow)."""

from __future__ import annotations

import re
import shlex
import urllib.parse

from pytest_retrace.envs import EnvError, FileRefused
from pytest_retrace.envs.guestfs import MAX_READ
from pytest_retrace.envs.remote import windows as win
from pytest_retrace.envs.remote.client import Client, guest_path, multipart_body

MAX_UPLOAD = 64 * 1024 * 1024  # one written file (retrace guest's limit)


class GuestFiles:
    """read_file, write_file and find_windows over the environment's client (a mixin: the environment
    has the attributes below)."""

    url: str
    timeout: float
    python: str
    windows: bool
    window_tool: str | None  # "xdotool", "wmctrl", "pygetwindow" or "" (none), found at attach

    @property
    def client(self) -> Client:
        raise NotImplementedError

    def read_file(self, path: str) -> bytes | None:
        """The file's bytes; None if missing; FileRefused if the guest will not serve it as a regular file
        (retrace guest: 403 outside the home and /tmp, 422 not a regular file or over the size cap). OSWorld's
        server answers a directory or device with a 500: that is told apart by asking the guest what is
        there."""
        guest = self.guest_file(path)
        body = urllib.parse.urlencode({"file_path": guest}).encode()
        reply = self.client.request("POST", "/file", data=body, content_type="application/x-www-form-urlencoded")
        if reply.status == 200:
            if len(reply.body) > MAX_READ:
                raise FileRefused(f"{path} is over the {MAX_READ}-byte limit")
            return reply.body
        if reply.status == 404:
            return None
        if reply.status in (403, 413, 422):
            raise FileRefused(reply.message())  # retrace guest's message names the path
        kind = self.file_kind(guest)
        if kind and kind != "regular file" and kind != "regular empty file":
            raise FileRefused(f"{path} is a {kind}, not a regular file")
        raise self.client.error("/file", reply, f"cannot read {path}")

    def guest_file(self, path: str) -> str:
        return win.windows_path(path) if self.windows else guest_path(path)

    def file_kind(self, guest: str) -> str:
        if self.windows:
            return ""  # no stat there; OSWorld's 500 for a directory stays an error
        quoted = '"$HOME"' + shlex.quote(guest[1:]) if guest.startswith("~/") else shlex.quote(guest)
        try:
            res = self.client.execute(f"stat -L -c %F -- {quoted}", shell=True, timeout=15)
        except EnvError:
            return ""
        return str(res.get("output") or "").strip() if res.get("returncode") == 0 else ""

    def write_file(self, path: str, data: bytes) -> None:
        if len(data) > MAX_UPLOAD:
            raise EnvError(f"cannot write {path}: {len(data)} bytes, over the {MAX_UPLOAD}-byte upload limit")
        body, content_type = multipart_body({"file_path": self.guest_file(path)}, {"file_data": data})
        reply = self.client.request("POST", "/setup/upload", data=body, content_type=content_type,
                                    timeout=self.timeout + len(data) / 1e6, idempotent=True)
        if reply.status != 200:
            raise self.client.error("/setup/upload", reply, f"cannot write {path}")

    def find_windows(self, pattern: str) -> list[str]:
        """Visible windows whose class or title matches the regex `pattern` (xdotool's, or wmctrl's list
        searched with Python's re, or a Windows guest's titles from pygetwindow); [] on a guest with none."""
        if self.window_tool == "xdotool":
            q = shlex.quote(pattern)
            res = self.client.execute(f"xdotool search --onlyvisible --class {q} 2>/dev/null; "
                                      f"xdotool search --onlyvisible --name {q} 2>/dev/null; true", shell=True, timeout=15)
            return sorted(set(str(res.get("output") or "").split()))
        if self.window_tool == "pygetwindow":
            res = self.client.execute([self.python, "-c", win.WINDOW_TITLES], shell=False, timeout=15)
            titles = str(res.get("output") or "").splitlines()
            return sorted({t for t in titles if re.search(pattern, t, re.IGNORECASE)})
        if self.window_tool == "wmctrl":
            res = self.client.execute("wmctrl -lx", shell=True, timeout=15)
            found = []
            for line in str(res.get("output") or "").splitlines():
                fields = line.split(None, 4)  # id, desktop, class, host, title
                if len(fields) >= 3 and any(re.search(pattern, f, re.IGNORECASE) for f in fields[2:3] + fields[4:]):
                    found.append(fields[0])
            return sorted(set(found))
        return []

