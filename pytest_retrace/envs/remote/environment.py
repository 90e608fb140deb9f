"""The ``remote`` environment: desktops reached over HTTP, one per pytest-xdist worker, each running either a
real OSWorld VM server or ``retrace guest`` (pytest_retrace/guest), which speaks the same API.

It relies only on OSWorld's documented endpoints and shapes, so it works against either:

- actions: a Python program made from the :class:`Action` by ``action_program`` (envs/remote/actions.py:
  pyautogui, as OSWorld's own client sends them), run with ``POST /execute {"command": ["python", "-c", ...]}``;
- screenshots: ``GET /screenshot?format=rgb`` (``retrace guest``'s raw RGB, or a PNG from a server that
  ignores the query, as OSWorld's: decode.py); settling polls it (settle.py ``wait_stable``), on a
  guest that is not ours at growing intervals and at most ``max_screenshots`` per case (screens.py);
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
``screenshot_budget``, ``max_screenshots``   ``auto`` (default): a guest that is not ours (no ``/health``)
                gets at most ``max_screenshots`` (150) per case and settles with growing poll intervals
                (envs/remote/screens.py); ``on``/``off`` force it either way
``windows_shell`` ``cmd`` (default) or ``powershell``: what runs commands on a Windows guest (windows.py)

Which guest a process takes: the worker's index in PYTEST_XDIST_WORKER (``gw0`` the first URL, ``gw1`` the
second, ...), the first without xdist; more workers than URLs is an error. The harness's ``network`` and
``hide`` do not reach a remote guest: its network and what it can see are the guest's own business.

Errors: a guest that does not answer (after retries of connection errors) is an :class:`EnvError`, an
infrastructure error, and so is a display out of X client slots (:class:`DisplayExhausted`, errors.py); an
action the guest answers but refuses or fails is :class:`ActionFailed`. Messages quote the guest's own error
text (errors.server_text), never an HTML page or a tail cut mid-line.
"""

from __future__ import annotations

import os
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
    check_on_screen,
)
from pytest_retrace.envs.ports import Relays
from pytest_retrace.envs.remote import windows as win
from pytest_retrace.envs.remote.actions import action_program, release_program
from pytest_retrace.envs.remote.client import (
    MAX_OUTPUT,
    Client,
    Refused,
    Unreachable,
    home_relative,
)
from pytest_retrace.envs.remote.decode import MAX_BODY, screen_array
from pytest_retrace.envs.remote.errors import DisplayExhausted, tail
from pytest_retrace.envs.remote.files import GuestFiles
from pytest_retrace.envs.remote.pool import parse_reset, parse_urls, worker_index
from pytest_retrace.envs.remote.screens import DEFAULT_MAX, Backoff, Budget, parse_budget
from pytest_retrace.envs.setup import apply_setup
from pytest_retrace.envs.steps import TaskSetup
from pytest_retrace.screen.frames import DEFAULT_SCREEN, Rect, park_point
from pytest_retrace.screen.settle import SettleConfig, Settled, wait_stable

RESET_TIMEOUT = 600.0  # seconds a reset command may take
_BASE_ACTION_TIME = 15.0  # seconds an action's program may take, plus what the action itself asks for
_WINDOW_POLL = 0.1
SCREENSHOT_PATH = "/screenshot?format=rgb"  # raw pixels from our guest; OSWorld's ignores the query (PNG)


class RemoteEnvironment(GuestFiles):
    name = "remote"

    def __init__(self, size: tuple[int, int] = DEFAULT_SCREEN, settle: SettleConfig | None = None,
                 network: str = "none", hide: Sequence[Path | str] = (), urls: str | Sequence[str] | None = None,
                 urls_file: str | Path | None = None, token_env: str | None = None, reset: str | None = None,
                 timeout: float = 30.0, python: str = "python", screenshot_budget: str | bool = "auto",
                 max_screenshots: int = DEFAULT_MAX, windows_shell: str = "cmd") -> None:
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
        self.budget_mode, self.max_screenshots = parse_budget(screenshot_budget, max_screenshots)
        if windows_shell not in win.SHELLS:
            raise ValueError(f"windows_shell: {windows_shell!r} is not one of {', '.join(win.SHELLS)}")
        self.windows_shell = windows_shell
        self.shots = Budget(None)  # this case's screenshots; capped at attach for a guest that is not ours
        self.ours = True  # the guest is `retrace guest` (answers /health): a screenshot leaks no X connection
        self.platform = "Linux"  # the guest's /platform (OSWorld's platform.system())
        self.windows = False  # it says Windows
        self.reset_mode, self.reset_command = parse_reset(reset)
        self.token_env = token_env
        if token_env is not None and not os.environ.get(token_env):
            raise ValueError(f"token_env: the environment variable {token_env} is not set or empty")
        self.masks: Sequence[Rect] = ()
        self.url = ""
        self._client: Client | None = None
        self._cases = 0  # resets done: without a reset command only one case may run on a guest
        self.window_tool: str | None = None  # "xdotool", "wmctrl" or "" (neither), found at start
        self._task_cpu: bool | None = None  # False: the guest cannot tell (task_cpu_seconds)
        self._relays = Relays()  # forward()

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
        self.ours, self.windows, self.platform = True, False, "Linux"
        if probe:
            self._probe()
        capped = self.budget_mode == "on" or (self.budget_mode == "auto" and not self.ours)
        self.shots = Budget(self.max_screenshots if capped else None)
        if not probe:
            self.window_tool = "xdotool"

    def _probe(self) -> None:
        width, height = self.client.screen_size()
        if (width, height) != self.size:
            raise EnvError(f"{self.url}: the guest's screen is {width}x{height}, the cases need "
                           f"{self.size[0]}x{self.size[1]} (--retrace-screen): cases made on this guest declare "
                           f"`screen: [{width}, {height}]` and run with --retrace-screen {width}x{height}")
        health = self.client.request("GET", "/health", timeout=min(self.timeout, 10.0))
        self.ours = health.status == 200 and isinstance(health.json(), dict) and health.json().get("status") == "ok"
        platform = self.client.request("GET", "/platform", timeout=min(self.timeout, 10.0))
        if platform.status != 200:
            raise self.client.error("/platform", platform)
        self.platform = platform.body.decode(errors="replace").strip() or "Linux"
        self.windows = win.is_windows(self.platform)
        probe = self.client.execute([self.python, "-c", "import pyautogui"], shell=False, timeout=60)
        if probe.get("returncode") != 0:
            raise EnvError(f"{self.url}: the guest cannot run pyautogui with {self.python!r}: "
                           f"{tail(str(probe.get('error') or ''))}")
        if self.windows:  # neither xdotool nor wmctrl there: windows are found with pyautogui's pygetwindow
            self.window_tool = "pygetwindow"
            return
        tools = self.client.execute("command -v xdotool >/dev/null && echo xdotool; "
                                    "command -v wmctrl >/dev/null && echo wmctrl; true", shell=True, timeout=30)
        found = str(tools.get("output") or "").split()
        self.window_tool = "xdotool" if "xdotool" in found else "wmctrl" if "wmctrl" in found else ""

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        if self._client is None:
            raise EnvError("the environment is not started")
        if self.reset_mode is None and self.client.exhausted:
            raise DisplayExhausted(f"{self.client.exhausted}; no reset is configured (option reset)")
        if self.reset_mode is None and self._cases:
            raise EnvError(f"{self.url}: no reset configured (option reset), so this guest runs one case only; "
                           "the next one would start from this one's state. Give reset=CMD, or one guest per case")
        self.client.exhausted = None  # the reset is what may give the slots back; if not, the next call says so
        if self.reset_mode == "guest":
            assert self.reset_command is not None
            res = self.run(self.reset_command, timeout=RESET_TIMEOUT)
            if res.returncode != 0:
                raise EnvError(f"{self.url}: reset `{self.reset_command}` exited {res.returncode}: {tail(res.stderr)}")
        elif self.reset_mode == "host":
            self._reset_on_host()
        self._cases += 1
        self.shots.new_case()
        self._program(release_program(park=park_point(self.size)), "releasing keys and parking the pointer", infra=True)
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
            raise EnvError(f"reset `{self.reset_command}` exited {res.returncode}: {tail(res.stderr)}")
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
        self._relays.close()

    def forward(self, port: int) -> int:
        """A loopback port relayed to `port` at the guest's host (envs/ports.py), as OSWorld reaches its VM's."""
        return self._relays.forward(port, urllib.parse.urlsplit(self.client.url).hostname or "localhost")

    # -- requests ----------------------------------------------------------------------------------
    @property
    def client(self) -> Client:
        if self._client is None:
            raise EnvError("the environment is not started")
        return self._client

    def harness_fault(self) -> str | None:
        """The guest not answering, its display out of X client slots, or this case's screenshots spent. What
        else fails on a VM (its X server, say) the guest cannot tell apart from what the task did there: an
        OSWorld VM runs the task as the X server's own user."""
        if self.client.exhausted or self.shots.spent:
            return self.client.exhausted or self.shots.spent
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
            detail = tail(str(res.get("error") or res.get("output") or ""))
            raise failure(f"{what} failed on the guest (exit {res.get('returncode')}): {detail}")

    # -- input and output --------------------------------------------------------------------------
    def execute(self, action: Action) -> Settled:
        check_on_screen(action, self.size)
        before = self.screenshot()
        if action.kind == "wait":
            time.sleep(action.seconds)
        program = action_program(action, self.windows)
        if program is not None:
            a = action
            work = (0.05 * len(a.text) + 0.05 * len(a.keys) * a.presses + 0.05 * (abs(a.dx) + abs(a.dy))
                    + a.seconds * a.presses)
            self._program(program, action.describe(), work=work)
        return self.settle(before)

    def screenshot(self) -> np.ndarray:
        """Raw RGB from ``retrace guest`` (no PNG to encode there and decode here: settling polls this), a PNG
        from any other server, which ignores the query (decode.py)."""
        self.shots.take(self.url)
        reply = self.client.request("GET", SCREENSHOT_PATH, limit=MAX_BODY + 1)
        if reply.status == 409:  # retrace's guest: a grab holds the display (guest/desktop.py)
            raise DisplayBlocked(f"{self.url}/screenshot: {reply.message()}")
        if reply.status != 200:
            raise self.client.error("/screenshot", reply)
        return screen_array(reply.body, reply.content_type, reply.headers, self.url + SCREENSHOT_PATH)

    def settle(self, before: np.ndarray | None = None) -> Settled:
        """Polled every `interval`, or at growing intervals on a guest whose screenshots are counted."""
        backoff = Backoff() if self.shots.cap is not None else None
        return wait_stable(self.screenshot, self._settle, self.masks, before, changes=backoff)

    def cursor_position(self) -> tuple[int, int]:
        reply = self.client.request("GET", "/cursor_position")
        data = reply.json()
        if reply.status == 200 and isinstance(data, dict):
            data = [data.get("x"), data.get("y")]
        if reply.status != 200:
            raise self.client.error("/cursor_position", reply)
        if not isinstance(data, list) or len(data) != 2:
            raise EnvError(f"{self.url}/cursor_position: unexpected answer {reply.body[:200]!r}")
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
            raise self.client.error("/task_cpu", reply)
        return float(data["seconds"])

    # -- processes ------------------------------------------------------------------------------
    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """A shell command in the guest's home, as the guest server's user; a timeout is exit status 124
        (coreutils ``timeout`` on the guest: OSWorld's server has no timeout field of its own)."""
        script = 'cd ~ 2>/dev/null; exec /bin/sh -c "$1"'
        argv = ["timeout", "-k", "2", f"{timeout:g}", "/bin/sh", "-c", script, "sh", command]
        if self.windows:
            argv = [self.python, "-c", win.command_program(command, timeout, self.windows_shell)]
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
        if code in (137, -9) and time.monotonic() - started >= timeout and not self.windows:
            code = 124  # SIGTERM ignored, so `timeout -k` killed the group, itself included: still a timeout
        if code == 124:
            stderr += f"\nretrace: timed out after {timeout:g} s"
        return CommandResult(code, stdout, stderr)

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        argv = [home_relative(a) for a in argv]
        before = self.screenshot() if window is not None and not self.window_tool else None
        reply = self.client.post_json("/setup/launch", {"command": argv, "shell": False}, idempotent=False)
        if reply.status != 200:
            raise self.client.error("/setup/launch", reply, f"cannot launch {shlex.join(argv)}")
        if window is None:
            return
        deadline = time.monotonic() + timeout
        backoff = Backoff(_WINDOW_POLL) if before is not None and self.shots.cap is not None else None
        while time.monotonic() < deadline:
            if before is not None:
                if not np.array_equal(self.screenshot(), before):
                    return
            elif self.find_windows(window):
                return
            if backoff is None or not backoff.wait(deadline - time.monotonic()):
                time.sleep(_WINDOW_POLL)
        raise EnvError(f"no window matching {window!r} within {timeout} s after launching {argv[0]}")
