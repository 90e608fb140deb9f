"""Real guests on loopback for test_guest.py and test_remote.py: an Xvfb display (with openbox and apps when
asked) and ``retrace guest`` serving it from a subprocess on a free port."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

VENV_BIN = str(Path(sys.executable).parent)
needs_desktop = pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("xdotool") is None,
                                   reason="needs Xvfb and xdotool (scripts/bootstrap)")


class Display:
    """An Xvfb server on a display number it picks itself (-displayfd), optionally with openbox."""

    def __init__(self, size: tuple[int, int] = (640, 480), wm: bool = False) -> None:
        read_fd, write_fd = os.pipe()
        self.xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", f"{size[0]}x{size[1]}x24", "-nolisten", "tcp",
             "-noreset"], pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            number = pipe.readline().decode().strip()  # blocks until Xvfb listens
        if not number:
            self.xvfb.kill()
            raise RuntimeError(f"Xvfb did not start (exit {self.xvfb.wait()})")
        self.name = f":{number}"
        self.wm: subprocess.Popen[bytes] | None = None
        if wm:
            self.wm = subprocess.Popen(["openbox"], env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while "window id" not in subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=self.env(),
                                                    capture_output=True, text=True, check=False).stdout:
                assert time.monotonic() < deadline, "openbox did not start"
                time.sleep(0.02)

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DISPLAY": self.name, **extra}

    def windows(self, title: str) -> list[str]:
        res = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", title], env=self.env(),
                             capture_output=True, text=True, check=False)
        return res.stdout.split()

    def wait_window(self, title: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.windows(title):
            assert time.monotonic() < deadline, f"no window {title!r} on {self.name}"
            time.sleep(0.05)

    def close(self) -> None:
        for proc in (self.wm, self.xvfb):  # every app of the display exits with its X server
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Guest:
    """``retrace guest --port 0`` for `display`, with `home` as its home, and a token when given."""

    display: Display
    home: Path
    token: str | None = None
    extra: list[str] = field(default_factory=list)
    # a process space of its own, as an OSWorld VM has: the build's probe of where processes are (`cd`) then
    # sees the guest's processes only, not every test worker's and app's on this machine, which come and go
    own_processes: bool = False
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    TOKEN_VAR = "RETRACE_TEST_GUEST_TOKEN"

    def start(self) -> Guest:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home.parent / f"{self.home.name}-server.log"
        env = self.display.env(HOME=str(self.home), PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                               PYTHONPATH=str(REPO))
        args = [sys.executable, "-m", "pytest_retrace.cli", "guest", "--port", "0", *self.extra]
        if self.token:
            env[self.TOKEN_VAR] = self.token
            args += ["--token-env", self.TOKEN_VAR]
        if self.own_processes and os.geteuid() == 0 and shutil.which("unshare"):
            args = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--", *args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.home)
        deadline = time.monotonic() + 20
        while not (match := re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"retrace guest did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        self.url = match.group(1)
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def request(self, method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None,
                token: str | None = None, timeout: float = 20.0) -> Reply:
        headers = dict(headers or {})
        if token or (token is None and self.token):
            headers["Authorization"] = f"Bearer {token or self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout) as resp:
                return Reply(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return Reply(exc.code, dict(exc.headers), exc.read())

    def post_json(self, path: str, payload: Any, **kw: Any) -> Reply:
        return self.request("POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"}, **kw)

    def raw(self, data: bytes, timeout: float = 10.0) -> bytes:
        """Send `data` as is on a new connection; the first response's bytes (head and Content-Length body)."""
        answer = b""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server may stop reading early
                sock.sendall(data)
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
                    head, sep, body = answer.partition(b"\r\n\r\n")
                    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                    if sep and length and len(body) >= int(length.group(1)):
                        break
        return answer

    def healthy(self) -> bool:
        return self.request("GET", "/health").status == 200

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def multipart(fields: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body as `requests` (OSWorld's client) sends one, and its headers."""
    boundary = "testboundary7d93"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{k}.bin"\r\n'
              f"Content-Type: application/octet-stream\r\n\r\n".encode() + v + b"\r\n" for k, v in files.items()]
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def osworld_module(name: str) -> Any:
    """One module of desktop-env (OSWorld's package), imported alone by the project's loader (its packages'
    __init__ files import every metric and getter); the test is skipped where desktop-env is not installed."""
    from pytest_retrace.osworld.package import Unavailable, load_module

    try:
        return load_module(name)
    except Unavailable as exc:
        pytest.skip(str(exc))
