"""The ``remote`` environment: desktops reached over HTTP, one per pytest-xdist worker, each running either a
real OSWorld VM server or ``retrace guest`` (pytest_retrace/guest), which speaks the same API.

It relies only on OSWorld's documented endpoints and shapes, so it works against either:

- actions: a Python program made from the :class:`Action` by ``remote_actions.action_program`` (pyautogui,
  as OSWorld's own client sends them), run with ``POST /execute {"command": ["python", "-c", ...]}``;
- screenshots: ``GET /screenshot`` (a PNG, decoded to RGB); settling polls it (settle.py ``wait_stable``);
- files: ``POST /file`` (form ``file_path``) to read, ``POST /setup/upload`` (multipart ``file_path`` +
  ``file_data``) to write;
- commands: ``POST /execute`` with a list running coreutils ``timeout`` and ``/bin/sh -c`` in the home, so a
  timeout is exit status 124 on either server;
- apps: ``POST /setup/launch``, then the window is waited for by polling ``xdotool search`` (or ``wmctrl -lx``)
  through ``/execute``; a guest with neither can only be waited for by the screen changing (documented
  fallback: the launch then waits until the screenshot differs from the one before, then settles);
- the screen: ``POST /screen_size`` (checked against the case's size at start), ``GET /cursor_position``.
- ``GET /task_cpu`` (``retrace guest`` only): the task's CPU time, which a setup's settle step waits on to go
  idle; a guest without it (OSWorld's) is settled on the screen alone.

Options (``--retrace-env-option KEY=VALUE`` or an ``envs/NAME.yaml``; docs/environments.md):

``urls``        the pool: a comma-separated string or a list of base URLs (``http://10.0.0.5:5000``)
``urls_file``   a file with one URL a line (blank lines and ``#`` comments skipped); added after ``urls``
``token_env``   the environment variable holding the bearer token the guests require (``retrace guest
                --token-env``); OSWorld's server ignores the header
``reset``       how a guest is made fresh before each case (OSWorld's server has no reset endpoint):
                ``CMD`` or ``guest:CMD`` runs CMD on the guest through /execute (a shell command that kills
                the task's apps and restores the home from a snapshot, say); ``host:CMD`` runs CMD on this
                machine with RETRACE_GUEST_URL set (revert a VM snapshot, restart a container), then waits for
                the guest to answer again. Without it a guest runs ONE case: the second reset is an EnvError
                rather than a case that silently starts from the previous one's state.
``timeout``     seconds one request may take (commands and actions get their own time on top)
``python``      the guest's Python with pyautogui (default ``python``, as OSWorld's client)

Which guest a process takes: the worker's index in PYTEST_XDIST_WORKER (``gw0`` the first URL, ``gw1`` the
second, ...), the first without xdist; more workers than URLs is an error. The harness's ``network`` and
``hide`` do not reach a remote guest: its network and what it can see are the guest's own business.

Errors: a guest that does not answer (after retries of connection errors) is an :class:`EnvError`, an
infrastructure error; an action the guest answers but refuses or fails is :class:`ActionFailed`.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.envs import (
    ActionFailed,
    CommandResult,
    DisplayBlocked,
    EnvError,
    FileRefused,
    check_on_screen,
)
from pytest_retrace.envs.guestfs import MAX_READ
from pytest_retrace.envs.remote.actions import action_program, release_program
from pytest_retrace.envs.setup import apply_setup
from pytest_retrace.envs.steps import GUEST_HOME, TaskSetup
from pytest_retrace.screen.settle import Rect, SettleConfig, Settled, wait_stable

MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr, as the xvfb environment's run()
MAX_UPLOAD = 64 * 1024 * 1024  # one written file (retrace guest's limit)
RESET_TIMEOUT = 600.0  # seconds a reset command may take
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)  # between attempts after a connection error
_BASE_ACTION_TIME = 15.0  # seconds an action's program may take, plus what the action itself asks for
_WINDOW_POLL = 0.1


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def message(self) -> str:
        """The error a guest sent: OSWorld's "error" or "message", else the start of the body."""
        data = self.json()
        if isinstance(data, dict):
            for key in ("error", "message"):
                if isinstance(data.get(key), str) and data[key]:
                    return data[key]
        return self.body[:300].decode(errors="replace").strip() or f"HTTP {self.status}"


class _Unreachable(EnvError):
    """No answer from the guest (connection refused, reset, timed out) after the retries."""


class _Refused(EnvError):
    """The guest answered /execute with an error (not a command's non-zero exit: the request itself)."""


class _Client:
    """HTTP to one guest, with urllib (no proxy: guests are on the harness's own network)."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, method: str, path: str, *, data: bytes | None = None, content_type: str | None = None,
                timeout: float | None = None, idempotent: bool = True, limit: int = MAX_READ + 1) -> _Reply:
        """One request; any HTTP status is returned. Connection errors are retried (RETRY_DELAYS) when the
        request cannot have reached the guest (connection refused) or repeating it does no harm
        (`idempotent`, which also retries a 502, 503 or 504); a request that may have been performed (a click)
        is never sent twice."""
        headers = {"Accept": "*/*"}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        delays = list(RETRY_DELAYS)
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                    return _Reply(resp.status, resp.read(limit), resp.headers.get("Content-Type", ""))
            except urllib.error.HTTPError as exc:
                with exc:
                    reply = _Reply(exc.code, exc.read(limit), exc.headers.get("Content-Type", "") if exc.headers else "")
                if exc.code in (502, 503, 504) and idempotent and delays:  # a proxy or display between restarts
                    time.sleep(delays.pop(0))
                    continue
                return reply
            except (urllib.error.URLError, OSError, HTTPException) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                refused = isinstance(reason, ConnectionRefusedError)
                if isinstance(reason, (TimeoutError, socket.timeout)) and not idempotent:
                    raise _Unreachable(f"{self.url}{path}: no answer within {timeout or self.timeout:g} s") from None
                if not delays or not (refused or idempotent):
                    raise _Unreachable(f"{self.url}{path}: {reason or type(exc).__name__}") from None
                time.sleep(delays.pop(0))

    def post_json(self, path: str, payload: dict[str, Any], **kw: Any) -> _Reply:
        return self.request("POST", path, data=json.dumps(payload).encode(), content_type="application/json", **kw)


def _multipart(fields: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, str]:
    """A multipart/form-data body (urllib has no encoder for it) and its Content-Type."""
    boundary = f"retrace-{uuid.uuid4().hex}"
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        out.write(value.encode() + b"\r\n")
    for name, data in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n'
                  "Content-Type: application/octet-stream\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def parse_urls(urls: str | Sequence[str] | None, urls_file: str | Path | None) -> list[str]:
    """The pool's URLs, in order, each checked to be an http(s) URL with a host."""
    found: list[str] = []
    if isinstance(urls, str):
        found += [u.strip() for u in urls.split(",") if u.strip()]
    elif urls is not None:
        if not all(isinstance(u, str) for u in urls):
            raise ValueError(f"urls: a comma-separated string or a list of URLs, got {urls!r}")
        found += [u.strip() for u in urls if u.strip()]
    if urls_file is not None:
        try:
            text = Path(urls_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"urls_file: cannot read {urls_file}: {exc.strerror or exc}") from None
        found += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for url in found:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"urls: {url!r} is not an http:// or https:// URL with a host")
    if not found:
        raise ValueError("the remote environment needs guest URLs: option urls (comma-separated) or urls_file")
    return found


def worker_index() -> int:
    """This process's index in the pool: N of PYTEST_XDIST_WORKER=gwN, 0 without xdist."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) if match else 0


def _home_relative(path: str) -> str:
    """GUEST_HOME/... as ~/...: the guest's own home may be elsewhere (OSWorld's is /home/user too)."""
    if path == GUEST_HOME or path.startswith(GUEST_HOME + "/"):
        return "~" + path[len(GUEST_HOME):]
    return path


def _guest_path(path: str) -> str:
    """A task's file path as the guest expands it: the task's home (GUEST_HOME, "~", relative paths) is "~"."""
    if path == "~" or path.startswith(("~/", "/")):
        return _home_relative(path)
    return "~/" + path


class RemoteEnvironment:
    name = "remote"

    def __init__(self, size: tuple[int, int] = (1280, 800), settle: SettleConfig | None = None,
                 network: str = "none", hide: Sequence[Path | str] = (), urls: str | Sequence[str] | None = None,
                 urls_file: str | Path | None = None, token_env: str | None = None, reset: str | None = None,
                 timeout: float = 30.0, python: str = "python") -> None:
        if network not in ("none", "host"):
            raise ValueError(f"network: {network!r} is not one of none, host")
        self.size = (int(size[0]), int(size[1]))
        self.settle_cfg = settle or SettleConfig()
        self._settle = self.settle_cfg  # the current task's (prepare)
        self.network = network  # not enforced: a remote guest's network is its own (docs/environments.md)
        self.hide = tuple(hide)  # likewise: nothing of this machine is on the guest to hide
        self.urls = parse_urls(urls, urls_file)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout: a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        if not isinstance(python, str) or not python:
            raise ValueError(f"python: the guest's Python command, got {python!r}")
        self.python = python
        self.reset_mode, self.reset_command = self._parse_reset(reset)
        self.token_env = token_env
        if token_env is not None and not os.environ.get(token_env):
            raise ValueError(f"token_env: the environment variable {token_env} is not set or empty")
        self.masks: Sequence[Rect] = ()
        self.url = ""
        self._client: _Client | None = None
        self._cases = 0  # resets done: without a reset command only one case may run on a guest
        self._window_tool: str | None = None  # "xdotool", "wmctrl" or "" (neither), found at start
        self._task_cpu: bool | None = None  # False: the guest cannot tell (task_cpu_seconds)

    @staticmethod
    def _parse_reset(reset: str | None) -> tuple[str | None, str | None]:
        if reset is None or (isinstance(reset, str) and not reset.strip()):
            return None, None
        if not isinstance(reset, str):
            raise ValueError(f"reset: a shell command (guest:CMD or host:CMD), got {reset!r}")  # noqa: TRY004 - an option's value
        where, sep, command = reset.partition(":")
        if sep and where.strip() in ("guest", "host"):
            if not command.strip():
                raise ValueError(f"reset: {reset!r} names no command")
            return where.strip(), command.strip()
        return "guest", reset.strip()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        index = worker_index()
        workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
        if workers.isdigit() and int(workers) > len(self.urls):
            raise EnvError(f"{workers} pytest-xdist workers but {len(self.urls)} guest URL(s): give one guest per "
                           f"worker (-n {len(self.urls)} at most)")
        if index >= len(self.urls):
            raise EnvError(f"worker gw{index} has no guest: only {len(self.urls)} URL(s) in the pool")
        self.attach(self.urls[index], os.environ.get(self.token_env) if self.token_env else None)

    def attach(self, url: str, token: str | None, probe: bool = True) -> None:
        """Use the guest at `url`: its screen must be the cases' size and its Python must have pyautogui.
        start() takes the worker's URL of the pool; the docker provider attaches to each container it starts,
        without `probe` (its image is known to have pyautogui and xdotool)."""
        self.url = url
        self._client = _Client(url, token, self.timeout)
        self._task_cpu = None
        if not probe:
            self._window_tool = "xdotool"
            return
        width, height = self._screen_size()
        if (width, height) != self.size:
            raise EnvError(f"{self.url}: the guest's screen is {width}x{height}, the cases need "
                           f"{self.size[0]}x{self.size[1]}")
        probe = self._execute([self.python, "-c", "import pyautogui"], shell=False, timeout=60)
        if probe.get("returncode") != 0:
            raise EnvError(f"{self.url}: the guest cannot run pyautogui with {self.python!r}: "
                           f"{str(probe.get('error') or '').strip()[-300:]}")
        tools = self._execute("command -v xdotool >/dev/null && echo xdotool; "
                              "command -v wmctrl >/dev/null && echo wmctrl; true", shell=True, timeout=30)
        found = str(tools.get("output") or "").split()
        self._window_tool = "xdotool" if "xdotool" in found else "wmctrl" if "wmctrl" in found else ""

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        if self._client is None:
            raise EnvError("the environment is not started")
        if self.reset_mode is None and self._cases:
            raise EnvError(f"{self.url}: no reset configured (option reset), so this guest runs one case only; "
                           "the next one would start from this one's state. Give reset=CMD, or one guest per case")
        if self.reset_mode == "guest":
            assert self.reset_command is not None
            res = self.run(self.reset_command, timeout=RESET_TIMEOUT)
            if res.returncode != 0:
                raise EnvError(f"{self.url}: reset `{self.reset_command}` exited {res.returncode}: "
                               f"{res.stderr.strip()[-300:]}")
        elif self.reset_mode == "host":
            self._reset_on_host()
        self._cases += 1
        w, h = self.size
        self._program(release_program(park=(w - 1, h - 1)), "releasing keys and parking the pointer", infra=True)
        self.prepare(task, files, masks)

    def prepare(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        """The part of a reset after the guest is fresh: the task's setup steps, then settle. The docker
        provider calls it directly on a new container, where no key is held and the pointer is parked."""
        self.masks = masks
        self._settle = self.settle_cfg.at_least(task.settle_quiet)
        apply_setup(self, task, files, masks)
        self.settle()

    def _reset_on_host(self) -> None:
        assert self.reset_command is not None
        env = {**os.environ, "RETRACE_GUEST_URL": self.url, "RETRACE_GUEST_INDEX": str(worker_index())}
        try:
            res = subprocess.run(self.reset_command, shell=True, env=env, capture_output=True, text=True,
                                 timeout=RESET_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise EnvError(f"reset `{self.reset_command}` did not finish within {RESET_TIMEOUT:g} s") from None
        if res.returncode != 0:
            raise EnvError(f"reset `{self.reset_command}` exited {res.returncode}: {res.stderr.strip()[-300:]}")
        deadline = time.monotonic() + RESET_TIMEOUT
        while True:  # the guest may be rebooting from a snapshot: wait until it answers again
            try:
                self._screen_size()
                return
            except EnvError:
                if time.monotonic() > deadline:
                    raise EnvError(f"{self.url} did not answer within {RESET_TIMEOUT:g} s of its reset") from None
                time.sleep(1.0)

    def close(self) -> None:
        self._client = None  # nothing held open: urllib connects per request

    # -- requests ----------------------------------------------------------------------------------
    @property
    def client(self) -> _Client:
        if self._client is None:
            raise EnvError("the environment is not started")
        return self._client

    def _screen_size(self) -> tuple[int, int]:
        reply = self.client.request("POST", "/screen_size", data=b"")
        data = reply.json()
        if reply.status != 200 or not isinstance(data, dict):
            raise EnvError(f"{self.url}/screen_size: {reply.message()}")
        try:
            return int(data["width"]), int(data["height"])
        except (KeyError, TypeError, ValueError):
            raise EnvError(f"{self.url}/screen_size: unexpected answer {reply.body[:200]!r}") from None

    def _execute(self, command: list[str] | str, *, shell: bool, timeout: float) -> dict[str, Any]:
        """POST /execute; the guest's JSON result (status "success"). Anything else is an EnvError here:
        callers that run an agent's action turn a refusal into ActionFailed themselves."""
        reply = self.client.post_json("/execute", {"command": command, "shell": shell, "timeout": timeout},
                                      timeout=timeout + self.timeout, idempotent=False, limit=4 * MAX_OUTPUT)
        data = reply.json()
        if reply.status != 200 or not isinstance(data, dict) or data.get("status") != "success":
            raise _Refused(f"{self.url}/execute: HTTP {reply.status}: {reply.message()[:500]}")
        return data

    def _alive(self) -> bool:
        try:
            self.client.request("GET", "/platform", timeout=min(self.timeout, 10.0))
        except EnvError:
            return False
        return True

    def harness_fault(self) -> str | None:
        """The guest not answering. What else fails on a VM (its X server, say) the guest cannot tell apart from
        what the task did there: an OSWorld VM runs the task as the X server's own user."""
        return None if self._alive() else f"the guest {self.client.url} does not answer"

    def _program(self, program: str, what: str, work: float = 0.0, infra: bool = False) -> None:
        """Run a pyautogui program on the guest."""
        self.perform([self.python, "-c", program], what, _BASE_ACTION_TIME + work, infra=infra)

    def perform(self, argv: list[str], what: str, timeout: float, infra: bool = False) -> None:
        """Run `argv` on the guest as (part of) an action. A guest that answers but fails it: ActionFailed (an
        EnvError with `infra`, for the harness's own programs); no answer: EnvError."""
        failure = EnvError if infra else ActionFailed
        try:
            res = self._execute(argv, shell=False, timeout=timeout)
        except _Refused as exc:
            raise failure(f"{what}: the guest refused it: {exc}") from None
        except _Unreachable as exc:
            if self._alive():
                raise failure(f"{what} did not finish within {timeout:.0f} s") from None
            raise EnvError(f"{what}: {exc}") from None
        if res.get("returncode") != 0:
            detail = str(res.get("error") or res.get("output") or "").strip()
            raise failure(f"{what} failed on the guest (exit {res.get('returncode')}): {detail[-300:]}")

    # -- input and output --------------------------------------------------------------------------
    def execute(self, action: Action) -> Settled:
        check_on_screen(action, self.size)
        before = self.screenshot()
        if action.kind == "wait":
            time.sleep(action.seconds)
        program = action_program(action)
        if program is not None:
            a = action
            work = (0.05 * len(a.text) + 0.05 * len(a.keys) * a.presses + 0.05 * (abs(a.dx) + abs(a.dy))
                    + a.seconds * a.presses)
            self._program(program, action.describe(), work=work)
        return self.settle(before)

    def screenshot(self) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        reply = self.client.request("GET", "/screenshot", limit=256 * 1024 * 1024)
        if reply.status == 409:  # retrace's guest: a grab holds the display (guest/desktop.py)
            raise DisplayBlocked(f"{self.url}/screenshot: {reply.message()}")
        if reply.status != 200:
            raise EnvError(f"{self.url}/screenshot: HTTP {reply.status}: {reply.message()}")
        try:
            with Image.open(io.BytesIO(reply.body)) as image:
                return np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise EnvError(f"{self.url}/screenshot: not an image: {exc}") from None

    def settle(self, before: np.ndarray | None = None) -> Settled:
        return wait_stable(self.screenshot, self._settle, self.masks, before)

    def cursor_position(self) -> tuple[int, int]:
        reply = self.client.request("GET", "/cursor_position")
        data = reply.json()
        if reply.status == 200 and isinstance(data, dict):
            data = [data.get("x"), data.get("y")]
        if reply.status != 200 or not isinstance(data, list) or len(data) != 2:
            raise EnvError(f"{self.url}/cursor_position: HTTP {reply.status}: {reply.body[:200]!r}")
        try:
            return int(data[0]), int(data[1])
        except (TypeError, ValueError):
            raise EnvError(f"{self.url}/cursor_position: unexpected answer {reply.body[:200]!r}") from None

    def task_cpu_seconds(self) -> float | None:
        """``retrace guest``'s ``GET /task_cpu``; None from a guest without it (OSWorld's server: 404), asked once."""
        if self._task_cpu is False:
            return None
        reply = self.client.request("GET", "/task_cpu", idempotent=True)
        data = reply.json() if reply.status == 200 else None
        if not isinstance(data, dict) or not isinstance(data.get("seconds"), (int, float)):
            if reply.status in (404, 405):
                self._task_cpu = False
                return None
            raise EnvError(f"{self.url}/task_cpu: HTTP {reply.status}: {reply.body[:200]!r}")
        return float(data["seconds"])

    # -- files and processes -----------------------------------------------------------------------
    def read_file(self, path: str) -> bytes | None:
        """The file's bytes; None if missing; FileRefused if the guest will not serve it as a regular file
        (retrace guest: 403 outside the home and /tmp, 422 not a regular file or over the size cap). OSWorld's
        server answers a directory or device with a 500: that is told apart by asking the guest what is
        there."""
        guest = _guest_path(path)
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
        kind = self._file_kind(guest)
        if kind and kind != "regular file" and kind != "regular empty file":
            raise FileRefused(f"{path} is a {kind}, not a regular file")
        raise EnvError(f"{self.url}/file {path}: HTTP {reply.status}: {reply.message()}")

    def _file_kind(self, guest: str) -> str:
        quoted = '"$HOME"' + shlex.quote(guest[1:]) if guest.startswith("~/") else shlex.quote(guest)
        try:
            res = self._execute(f"stat -L -c %F -- {quoted}", shell=True, timeout=15)
        except EnvError:
            return ""
        return str(res.get("output") or "").strip() if res.get("returncode") == 0 else ""

    def write_file(self, path: str, data: bytes) -> None:
        if len(data) > MAX_UPLOAD:
            raise EnvError(f"cannot write {path}: {len(data)} bytes, over the {MAX_UPLOAD}-byte upload limit")
        body, content_type = _multipart({"file_path": _guest_path(path)}, {"file_data": data})
        reply = self.client.request("POST", "/setup/upload", data=body, content_type=content_type,
                                    timeout=self.timeout + len(data) / 1e6, idempotent=True)
        if reply.status != 200:
            raise EnvError(f"cannot write {path}: HTTP {reply.status}: {reply.message()}")

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """A shell command in the guest's home, as the guest server's user; a timeout is exit status 124
        (coreutils ``timeout`` on the guest: OSWorld's server has no timeout field of its own)."""
        script = 'cd ~ 2>/dev/null; exec /bin/sh -c "$1"'
        argv = ["timeout", "-k", "2", f"{timeout:g}", "/bin/sh", "-c", script, "sh", command]
        started = time.monotonic()
        try:
            res = self._execute(argv, shell=False, timeout=timeout + 5)
        except _Refused as exc:
            raise EnvError(str(exc)) from None
        code = res.get("returncode")
        if not isinstance(code, int):
            raise EnvError(f"{self.url}/execute: no returncode in {str(res)[:200]}")
        stdout = str(res.get("output") or "")[:MAX_OUTPUT]
        stderr = str(res.get("error") or "")[:MAX_OUTPUT]
        if code in (137, -9) and time.monotonic() - started >= timeout:
            code = 124  # SIGTERM ignored, so `timeout -k` killed the group, itself included: still a timeout
        if code == 124:
            stderr += f"\nretrace: timed out after {timeout:g} s"
        return CommandResult(code, stdout, stderr)

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        argv = [_home_relative(a) for a in argv]
        before = self.screenshot() if window is not None and not self._window_tool else None
        reply = self.client.post_json("/setup/launch", {"command": argv, "shell": False}, idempotent=False)
        if reply.status != 200:
            raise EnvError(f"cannot launch {shlex.join(argv)}: HTTP {reply.status}: {reply.message()}")
        if window is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if before is not None:
                if not np.array_equal(self.screenshot(), before):
                    return
            elif self.find_windows(window):
                return
            time.sleep(_WINDOW_POLL)
        raise EnvError(f"no window matching {window!r} within {timeout} s after launching {argv[0]}")

    def find_windows(self, pattern: str) -> list[str]:
        """Visible windows whose class or title matches the regex `pattern` (xdotool's, or wmctrl's list
        searched with Python's re); [] on a guest with neither tool."""
        if self._window_tool == "xdotool":
            q = shlex.quote(pattern)
            res = self._execute(f"xdotool search --onlyvisible --class {q} 2>/dev/null; "
                                f"xdotool search --onlyvisible --name {q} 2>/dev/null; true", shell=True, timeout=15)
            return sorted(set(str(res.get("output") or "").split()))
        if self._window_tool == "wmctrl":
            res = self._execute("wmctrl -lx", shell=True, timeout=15)
            found = []
            for line in str(res.get("output") or "").splitlines():
                fields = line.split(None, 4)  # id, desktop, class, host, title
                if len(fields) >= 3 and any(re.search(pattern, f, re.IGNORECASE) for f in fields[2:3] + fields[4:]):
                    found.append(fields[0])
            return sorted(set(found))
        return []

