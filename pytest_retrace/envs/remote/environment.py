"""The ``remote`` environment: desktops reached over HTTP, one per pytest-xdist worker, each running either a
real OSWorld VM server or ``retrace guest`` (pytest_retrace/guest), which speaks the same API.

It relies only on OSWorld's documented endpoints and shapes, so it works against either:

- actions: a Python program made from the :class:`Action` by ``action_program`` (envs/remote/actions.py:
  pyautogui, as OSWorld's own client sends them), run with ``POST /execute {"command": ["python", "-c", ...]}``;
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
import os
import re
import shlex
import subprocess
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

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
from pytest_retrace.envs.remote.client import (
    MAX_OUTPUT,
    Client,
    Refused,
    Unreachable,
    guest_path,
    home_relative,
    multipart_body,
)
from pytest_retrace.envs.remote.pool import parse_reset, parse_urls, worker_index
from pytest_retrace.envs.setup import apply_setup
from pytest_retrace.envs.steps import TaskSetup
from pytest_retrace.screen.frames import DEFAULT_SCREEN, Rect
from pytest_retrace.screen.settle import SettleConfig, Settled, wait_stable

MAX_UPLOAD = 64 * 1024 * 1024  # one written file (retrace guest's limit)
RESET_TIMEOUT = 600.0  # seconds a reset command may take
_BASE_ACTION_TIME = 15.0  # seconds an action's program may take, plus what the action itself asks for
_WINDOW_POLL = 0.1


class RemoteEnvironment:
    name = "remote"

    def __init__(self, size: tuple[int, int] = DEFAULT_SCREEN, settle: SettleConfig | None = None,
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
        self.reset_mode, self.reset_command = parse_reset(reset)
        self.token_env = token_env
        if token_env is not None and not os.environ.get(token_env):
            raise ValueError(f"token_env: the environment variable {token_env} is not set or empty")
        self.masks: Sequence[Rect] = ()
        self.url = ""
        self._client: Client | None = None
        self._cases = 0  # resets done: without a reset command only one case may run on a guest
        self._window_tool: str | None = None  # "xdotool", "wmctrl" or "" (neither), found at start
        self._task_cpu: bool | None = None  # False: the guest cannot tell (task_cpu_seconds)

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
        self._client = Client(url, token, self.timeout)
        self._task_cpu = None
        if not probe:
            self._window_tool = "xdotool"
            return
        width, height = self.client.screen_size()
        if (width, height) != self.size:
            raise EnvError(f"{self.url}: the guest's screen is {width}x{height}, the cases need "
                           f"{self.size[0]}x{self.size[1]}")
        probe = self.client.execute([self.python, "-c", "import pyautogui"], shell=False, timeout=60)
        if probe.get("returncode") != 0:
            raise EnvError(f"{self.url}: the guest cannot run pyautogui with {self.python!r}: "
                           f"{str(probe.get('error') or '').strip()[-300:]}")
        tools = self.client.execute("command -v xdotool >/dev/null && echo xdotool; "
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
                self.client.screen_size()
                return
            except EnvError:
                if time.monotonic() > deadline:
                    raise EnvError(f"{self.url} did not answer within {RESET_TIMEOUT:g} s of its reset") from None
                time.sleep(1.0)

    def close(self) -> None:
        self._client = None  # nothing held open: urllib connects per request

    # -- requests ----------------------------------------------------------------------------------
    @property
    def client(self) -> Client:
        if self._client is None:
            raise EnvError("the environment is not started")
        return self._client

    def harness_fault(self) -> str | None:
        """The guest not answering. What else fails on a VM (its X server, say) the guest cannot tell apart from
        what the task did there: an OSWorld VM runs the task as the X server's own user."""
        return None if self.client.alive() else f"the guest {self.client.url} does not answer"

    def _program(self, program: str, what: str, work: float = 0.0, infra: bool = False) -> None:
        """Run a pyautogui program on the guest."""
        self.perform([self.python, "-c", program], what, _BASE_ACTION_TIME + work, infra=infra)

    def perform(self, argv: list[str], what: str, timeout: float, infra: bool = False) -> None:
        """Run `argv` on the guest as (part of) an action. A guest that answers but fails it: ActionFailed (an
        EnvError with `infra`, for the harness's own programs); no answer: EnvError."""
        failure = EnvError if infra else ActionFailed
        try:
            res = self.client.execute(argv, shell=False, timeout=timeout)
        except Refused as exc:
            raise failure(f"{what}: the guest refused it: {exc}") from None
        except Unreachable as exc:
            if self.client.alive():
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
        guest = guest_path(path)
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
            res = self.client.execute(f"stat -L -c %F -- {quoted}", shell=True, timeout=15)
        except EnvError:
            return ""
        return str(res.get("output") or "").strip() if res.get("returncode") == 0 else ""

    def write_file(self, path: str, data: bytes) -> None:
        if len(data) > MAX_UPLOAD:
            raise EnvError(f"cannot write {path}: {len(data)} bytes, over the {MAX_UPLOAD}-byte upload limit")
        body, content_type = multipart_body({"file_path": guest_path(path)}, {"file_data": data})
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
            res = self.client.execute(argv, shell=False, timeout=timeout + 5)
        except Refused as exc:
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
        argv = [home_relative(a) for a in argv]
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
            res = self.client.execute(f"xdotool search --onlyvisible --class {q} 2>/dev/null; "
                                      f"xdotool search --onlyvisible --name {q} 2>/dev/null; true", shell=True, timeout=15)
            return sorted(set(str(res.get("output") or "").split()))
        if self._window_tool == "wmctrl":
            res = self.client.execute("wmctrl -lx", shell=True, timeout=15)
            found = []
            for line in str(res.get("output") or "").splitlines():
                fields = line.split(None, 4)  # id, desktop, class, host, title
                if len(fields) >= 3 and any(re.search(pattern, f, re.IGNORECASE) for f in fields[2:3] + fields[4:]):
                    found.append(fields[0])
            return sorted(set(found))
        return []

