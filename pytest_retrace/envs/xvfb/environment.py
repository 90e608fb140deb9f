"""The default environment: a real X desktop (Xvfb + openbox) with real Debian apps.

Isolation and determinism choices, each because a screenshot must be reproducible bit for bit or because
the agent under test is untrusted:
- ``Xvfb -displayfd`` picks a free display number itself, so parallel xdist workers never race.
- ``Xvfb -noreset``: by default the server resets when its last client disconnects. A client that
  comes and goes before openbox connects (the ``xprop`` that polled for the window manager did) could be
  that client, and a connection that arrives during the reset fails: openbox then exited with "Failed to
  open the display" (measured: 13 of 360 starts with 3 desktops starting at once).
- Every app and shell of a task runs in the task's sandbox (``sandbox.py``): its own PID, mount, network,
  UTS and cgroup namespaces, the IPC namespace of its own X server (new at every reset), an unprivileged user, ``/home/user`` and ``/tmp`` private to the task. Window titles
  and file dialogs therefore show the same paths in every worker, and reset ends every process of the task
  by ending its namespace.
- Xvfb and the window manager die with the worker even on SIGKILL (PR_SET_PDEATHSIG), and so does the
  task's namespace.
- GTK cursor blink and animations are off; D-Bus is disabled and GSettings writes a keyfile in HOME,
  so an app's settings are plain files that reset restores (and evaluators can read).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.envs import ActionFailed, CommandResult, EnvError, check_on_screen
from pytest_retrace.envs.accessibility import start_buses
from pytest_retrace.envs.desktop import TEMPLATE
from pytest_retrace.envs.guestfs import MAX_READ
from pytest_retrace.envs.ports import Relays
from pytest_retrace.envs.procfs import cpu_seconds
from pytest_retrace.envs.setup import apply_setup
from pytest_retrace.envs.steps import TaskSetup
from pytest_retrace.envs.xdotool import BASE_TIMEOUT, TYPE_DELAY_MS, commands, typable, type_command
from pytest_retrace.envs.xvfb.checkpoint import PROGRAMS as CHECKPOINTABLE_PROGRAMS
from pytest_retrace.envs.xvfb.checkpoint import CheckpointMethods, Checkpoints
from pytest_retrace.envs.xvfb.keymap import Keymap
from pytest_retrace.envs.xvfb.sandbox import GUEST_HOME, MEMORY_LIMIT, Sandbox, available
from pytest_retrace.envs.xvfb.tree import LAUNCH_SCRIPT
from pytest_retrace.envs.xvfb.xserver import XDesktop
from pytest_retrace.screen.frames import DEFAULT_SCREEN, Rect, park_point
from pytest_retrace.screen.settle import SettleConfig, Settled, wait_stable

NETWORK_MODES = ("none", "host")
MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr, as an evaluator reads it


class XvfbEnvironment(CheckpointMethods, XDesktop):
    name = "xvfb"

    def __init__(self, size: tuple[int, int] = DEFAULT_SCREEN, settle: SettleConfig | None = None,
                 network: str = "none", hide: Sequence[Path | str] = (), memory_limit: int = MEMORY_LIMIT) -> None:
        if network not in NETWORK_MODES:
            raise ValueError(f"network: {network!r} is not one of {', '.join(NETWORK_MODES)}")
        super().__init__(size)
        self.settle_cfg = settle or SettleConfig()
        self._settle = self.settle_cfg  # the current task's (reset)
        self.masks: Sequence[Rect] = ()  # regions settling ignores: the case's, from reset()
        self.network = network  # for tasks that do not ask for the network themselves
        self.hide = tuple(Path(p) for p in hide)
        self.memory_limit = memory_limit  # bytes, for all processes of a task together
        self._relays = Relays()  # forward(): the current task's ports
        self.bus_seconds: float | None = None  # what the last accessibility task's buses took to start
        self.checkpoints = Checkpoints()  # on with enable_checkpoints() (checkpoint.py)
        self._task: TaskSetup | None = None  # the current task's setup (a checkpoint keeps it: its settling rules)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        for tool in ("Xvfb", "openbox", "xdotool"):
            if shutil.which(tool) is None:
                raise EnvError(f"{tool} not found: install the desktop packages (scripts/bootstrap)")
        self.root = Path(tempfile.mkdtemp(prefix="retrace-xvfb-"))
        self.root.chmod(0o700)  # the sandbox user must not reach the harness's side of the desktop
        self.tag = str(self.root)  # unique, and tells a leak hunter which run a process belongs to
        (self.root / "logs").mkdir()
        if (why := available()) is not None:
            import warnings

            warnings.warn(f"retrace xvfb: NO SANDBOX, {why}: apps run as this user with HOME={self.root / 'home'}, "
                          f"not {GUEST_HOME}; recorded screens that show paths will not match, and an agent can "
                          f"reach everything this user can", RuntimeWarning, stacklevel=2)
        if self.in_task and why is not None:
            raise EnvError(f"retrace xvfb: checkpoints need the task sandbox, and {why}")
        if self.in_task:
            self._claim_number()
            self.sandbox = Sandbox(self.root, self.display, TEMPLATE, hide=self.hide, memory=self.memory_limit,
                                   program_scripts=CHECKPOINTABLE_PROGRAMS)
            self._write_wm_home(self.root / "wm-home")
            self._start_in_task(network=self.network == "host")  # empty until the first reset
            return
        self._claim_display()
        self.sandbox = Sandbox(self.root, self.display, TEMPLATE, hide=self.hide, enabled=why is None,
                               memory=self.memory_limit)
        self._connect()
        self._start_wm()
        self.sandbox.start(network=self.network == "host", ipc_of=self._xvfb_pid())  # empty until the first reset

    def _start_in_task(self, network: bool, accessibility: bool = False) -> None:
        """In-task layout: a new task whose init starts a new X server and window manager (xserver.py)."""
        assert self.sandbox is not None
        self._disconnect()
        self.sandbox.kill()
        self.sandbox.start(network=network, accessibility=accessibility, desktop=self._desktop_script())
        self._adopt_desktop()

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        if self.root is None:
            raise EnvError("the environment is not started")
        self._relays.close()
        assert self.sandbox is not None
        self._task = task
        if self.in_task:
            self._start_in_task(task.network or self.network == "host", task.accessibility)
        else:
            self.kill_session()
            self._restart_display()
            self.sandbox.start(network=task.network or self.network == "host", ipc_of=self._xvfb_pid(),
                               accessibility=task.accessibility)
        if task.accessibility:  # its judge reads the AT-SPI tree: the task's own buses (envs/accessibility.py)
            self.bus_seconds = start_buses(self.sandbox.popen, self.sandbox.env(), self.root / "logs" / "buses.log")
        self.masks = masks
        self._settle = self.settle_cfg.at_least(task.settle_quiet)
        # the pointer outlives apps: park it so hover effects never depend on the previous case
        self._xdotool(["mousemove", *map(str, park_point(self.size))])
        apply_setup(self, task, files, masks)
        self.settle()

    def close(self) -> None:
        if self.root is None:
            return
        try:
            self._relays.close()
            if self.in_task:
                self._disconnect()  # before the X server goes with the task's namespace
            if self.sandbox is not None:
                self.sandbox.close()  # its processes, then its control group
        finally:
            self._stop_display()
            self._release_number()
            self.checkpoints.close()
            if self._claim is not None:
                self._claim.close()  # after the server is gone: the number is free again
                self._claim = None
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- processes ---------------------------------------------------------------------------------
    def session_pids(self) -> list[int]:
        """Every live process of the current task."""
        return self.sandbox.pids() if self.sandbox is not None else []

    def task_cpu_seconds(self) -> float:
        return cpu_seconds(self.session_pids())

    def kill_session(self) -> None:
        if self.sandbox is not None:
            self.sandbox.kill()

    # -- ports -------------------------------------------------------------------------------------
    def forward(self, port: int) -> int:
        """The harness's loopback port relayed to TCP `port` of the task's own loopback (envs/ports.py), what
        OSWorld's chrome steps and getters connect to. Until the next reset or close."""
        if self.sandbox is None:
            raise EnvError("the environment is not started")
        return self._relays.forward(port, netns=self.sandbox.netns)

    # -- files -------------------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        """The task's home directory as the host sees it."""
        assert self.sandbox is not None
        return self.sandbox.home

    def guest_path(self, path: str) -> str:
        assert self.sandbox is not None
        return self.sandbox.fs.absolute(path) if path == "~" or path.startswith("~/") else path

    def read_file(self, path: str) -> bytes | None:
        """A regular file of the task (in its home or /tmp), None if missing; FileRefused if it is anything
        else (FIFO, device, a link out of those trees, over MAX_READ bytes)."""
        assert self.sandbox is not None
        return self.sandbox.fs.read(path, cap=MAX_READ)

    def write_file(self, path: str, data: bytes) -> None:
        """Write a file as the task's user, inside its sandbox: a link an earlier setup step left in the home
        is followed as that user would follow it, never with root's rights on the host."""
        assert self.sandbox is not None
        guest = self.sandbox.fs.absolute(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        with tempfile.TemporaryFile() as data_in, tempfile.TemporaryFile() as err, open(os.devnull, "wb") as null:
            data_in.write(data)
            data_in.seek(0)
            code, note = self.sandbox.commands.call(["/bin/sh", "-c", script, "sh", guest], data_in.fileno(),
                                                    null.fileno(), err.fileno(), timeout=30)
            if code is None:
                raise EnvError(f"writing {path} did not finish within 30 s")
            if code != 0:
                err.seek(0)
                raise EnvError(f"cannot write {path}: {err.read(600).decode(errors='replace').strip()}{note}")

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """Run a shell command in the task's sandbox. A timeout is an outcome (exit status 124, as
        coreutils' timeout): what a command waits on inside the sandbox is the task's state."""
        self._check_alive()
        assert self.sandbox is not None
        # files, not pipes: a command that backgrounds a process must not hang us on an open pipe
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as null:
            code, note = self.sandbox.commands.call(["/bin/sh", "-c", command], null.fileno(), out.fileno(),
                                                    err.fileno(), timeout)
            if code is None:
                code, note = 124, f"\nretrace: timed out after {timeout:g} s"
            out.seek(0)
            err.seek(0)
            return CommandResult(code, out.read(MAX_OUTPUT).decode(errors="replace"),
                                 err.read(MAX_OUTPUT).decode(errors="replace") + note)

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        assert self.sandbox is not None
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        argv = [self.guest_path(a) for a in argv]
        if shutil.which(argv[0]) is None and shutil.which(argv[0], path=self.sandbox.programs) is None:
            raise EnvError(f"{argv[0]} is not installed")
        name = Path(argv[0]).name
        if self.in_task:
            # under a shell of the task that a checkpoint can end (tree.hand_to_init), in a session of the task's own;
            # its output nowhere: CRIU restores a written file only at the size it had
            proc = self.sandbox.popen(["/bin/sh", "-c", LAUNCH_SCRIPT, "retrace-launch", *argv],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        else:
            with self._log(name) as log:
                proc = self.sandbox.popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        if window is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.find_windows(window):
                return
            if proc.poll() is not None:
                raise EnvError(f"{name} exited with {proc.returncode} before showing a window: {self._tail(name)}")
            time.sleep(0.02)
        raise EnvError(f"no window matching {window!r} within {timeout} s: {self._tail(name)}")

    def find_windows(self, pattern: str) -> list[str]:
        """Visible windows whose class or title matches the regex `pattern`."""
        found: list[str] = []
        for field in ("--class", "--name"):
            try:
                res = subprocess.run(["xdotool", "search", "--onlyvisible", field, pattern], env=self._host_env(),
                                     capture_output=True, text=True, timeout=BASE_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._check_alive()
                raise EnvError(f"xdotool search {field} {pattern!r} did not finish within {BASE_TIMEOUT:g} s") from None
            found += res.stdout.split()
        return sorted(set(found))

    # -- input and output --------------------------------------------------------------------------
    def settle(self, before: np.ndarray | None = None) -> Settled:
        return wait_stable(self.screenshot, self._settle, self.masks, before,
                           self._changes() if self._settle.signal == "damage" else None)

    def cursor_position(self) -> tuple[int, int]:
        self._check_alive()
        try:
            res = subprocess.run(["xdotool", "getmouselocation", "--shell"], env=self._host_env(),
                                 capture_output=True, text=True, timeout=BASE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._check_alive()
            raise EnvError(f"xdotool getmouselocation did not finish within {BASE_TIMEOUT:g} s") from None
        values = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        try:
            return int(values["X"]), int(values["Y"])
        except (KeyError, ValueError):
            raise EnvError(f"xdotool getmouselocation failed: {res.stderr.strip()}") from None

    def execute(self, action: Action) -> Settled:
        self._check_alive()
        check_on_screen(action, self.size)
        before = self.screenshot()
        if action.kind == "wait":
            time.sleep(action.seconds)
        elif action.kind == "type" and not typable(action.text):
            # characters the keymap lacks: mapped onto a spare keycode for a moment (keymap.py)
            for i, line in enumerate(action.text.split("\n")):
                if i:
                    self._xdotool(["key", "Return"])
                if typable(line):
                    self._xdotool(*type_command(line))
                elif line:
                    if self._keymap is None:
                        self._keymap = Keymap(self.display)
                    self._keymap.type(line, lambda keys: self._xdotool(["key", "--delay", TYPE_DELAY_MS, *keys],
                                                                       timeout=BASE_TIMEOUT + 0.05 * len(keys)),
                                      self.settle)
        else:
            for args, timeout in commands(action):
                self._xdotool(args, timeout=timeout)
        return self.settle(before)

    def _xdotool(self, args: list[str], timeout: float = BASE_TIMEOUT) -> None:
        self._check_alive()
        try:
            res = subprocess.run(["xdotool", *args], env=self._host_env(), capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            self._check_alive()  # a dead desktop is an infrastructure error, whatever the action was
            raise ActionFailed(f"xdotool {' '.join(args)[:200]} did not finish within {timeout:.0f} s") from None
        if res.returncode != 0:
            self._check_alive()
            raise ActionFailed(f"xdotool {' '.join(args)[:200]} failed: {res.stderr.strip()[:300]}")
