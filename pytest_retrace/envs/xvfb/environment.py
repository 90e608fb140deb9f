"""The default environment: a real X desktop (Xvfb + openbox) with real Debian apps.

Isolation and determinism choices, each because a screenshot must be reproducible bit for bit or because
the agent under test is untrusted:
- ``Xvfb -displayfd`` picks a free display number itself, so parallel xdist workers never race.
- ``Xvfb -noreset``: by default the server resets when its last client disconnects. The first
  ``xprop`` that polls for the window manager could be that client, and a connection that arrives
  during the reset fails: openbox then exited with "Failed to open the display" (measured: 13 of
  360 starts with 3 desktops starting at once).
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

import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image

from pytest_retrace.actions import Action
from pytest_retrace.envs import ActionFailed, CommandResult, DisplayBlocked, EnvError, check_on_screen
from pytest_retrace.envs.desktop import OPENBOX_RC, TEMPLATE, menu_xml, xvfb_argv
from pytest_retrace.envs.guestfs import MAX_READ
from pytest_retrace.envs.procfs import cpu_seconds
from pytest_retrace.envs.setup import apply_setup
from pytest_retrace.envs.steps import TaskSetup
from pytest_retrace.envs.xdotool import BASE_TIMEOUT, TYPE_DELAY_MS, commands, typable, type_command
from pytest_retrace.envs.xvfb.damage import DamageWatch
from pytest_retrace.envs.xvfb.keymap import Keymap
from pytest_retrace.envs.xvfb.sandbox import (
    GUEST_HOME,
    MEMORY_LIMIT,
    Sandbox,
    available,
    die_with_parent,
    x_server_argv,
)
from pytest_retrace.envs.xvfb.xthread import XThread
from pytest_retrace.screen.settle import Rect, SettleConfig, Settled, wait_stable

NETWORK_MODES = ("none", "host")
MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr, as an evaluator reads it
_FIRST_DISPLAY = 10  # leave :0.. to a machine's own desktops


class XvfbEnvironment:
    name = "xvfb"

    def __init__(self, size: tuple[int, int] = (1280, 800), settle: SettleConfig | None = None,
                 network: str = "none", hide: Sequence[Path | str] = (), memory_limit: int = MEMORY_LIMIT) -> None:
        if network not in NETWORK_MODES:
            raise ValueError(f"network: {network!r} is not one of {', '.join(NETWORK_MODES)}")
        self.size = (int(size[0]), int(size[1]))
        self.settle_cfg = settle or SettleConfig()
        self._settle = self.settle_cfg  # the current task's (reset)
        self.masks: Sequence[Rect] = ()  # regions settling ignores: the case's, from reset()
        self.network = network  # for tasks that do not ask for the network themselves
        self.hide = tuple(Path(p) for p in hide)
        self.memory_limit = memory_limit  # bytes, for all processes of a task together
        self.root: Path | None = None
        self.display = ""
        self.tag = ""
        self.sandbox: Sandbox | None = None
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._wm: subprocess.Popen[bytes] | None = None
        self._grabber = None
        self._damage: DamageWatch | None = None  # what settling waits on between grabs (damage.py)
        self._x: XThread | None = None  # the thread both connections live on, each call with a deadline
        self._keymap: Keymap | None = None  # connected on the first character the keymap lacks
        self._claim: IO[str] | None = None  # the lock on our display number

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
        self._claim_display()
        self.sandbox = Sandbox(self.root, self.display, TEMPLATE, hide=self.hide, enabled=why is None,
                               memory=self.memory_limit)
        self._start_wm()
        self._connect()
        self.sandbox.start(network=self.network == "host", ipc_of=self._xvfb_pid())  # empty until the first reset

    def _connect(self) -> None:
        import mss

        factory = getattr(mss, "MSS", None) or mss.mss
        self._x = XThread(self.display)

        def connect() -> None:  # on the X thread, which owns the connections from now on
            self._grabber = factory(display=self.display)
            self._damage = DamageWatch(self.display)

        self._x.call(connect, what="connection")

    def _disconnect(self) -> None:
        def release() -> None:
            for conn in (self._grabber, self._damage):
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # the display is gone already; nothing left to release
                        pass

        if self._x is not None:
            self._x.close(release)
        if self._keymap is not None:
            self._keymap.close()
        self._grabber = self._damage = self._keymap = self._x = None

    def _stop_display(self) -> None:
        self._disconnect()
        for proc in (self._wm, self._xvfb):
            if proc is not None and proc.poll() is None:
                proc.terminate()  # Xvfb removes its lock and socket files on SIGTERM
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

    def _restart_display(self) -> None:
        """A fresh X server for every task. Any X client can change server state that no process holds:
        key and modifier mappings (xmodmap), the pointer's button map, held keys and buttons, Caps Lock,
        autorepeat (xset), the root window's colour and properties, the screen saver. Restoring a list of
        them would miss the next one; a new server has none of it (measured cost in benchmarks/bench_env.py)."""
        self._stop_display()
        self._launch_xvfb(int(self.display.lstrip(":")))
        self._start_wm()
        self._connect()

    def _xvfb_pid(self) -> int | None:
        return self._xvfb.pid if self._xvfb is not None and self.sandbox is not None and self.sandbox.enabled else None

    def _start_wm(self) -> None:
        assert self.root is not None and self.sandbox is not None
        wm_home = self.root / "wm-home"  # the WM runs outside the sandbox: give it a home of its own
        if not wm_home.exists():
            self._write_menu(wm_home / ".config" / "openbox" / "menu.xml")
        wm_env = {**self._host_env(), "HOME": str(wm_home), "XDG_CONFIG_HOME": str(wm_home / ".config"),
                  "XDG_CACHE_HOME": str(wm_home / ".cache"), "XDG_DATA_HOME": str(wm_home / ".local/share")}
        self._wm = subprocess.Popen(  # stdout too: openbox prints its fatal messages there
            ["openbox", "--config-file", str(OPENBOX_RC)], env=wm_env,
            stdout=self._log("openbox"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )
        self._wait_for_wm()

    def _write_menu(self, path: Path) -> None:
        """The root menu, whose entries start apps through a launcher that makes them part of the current
        task (in its sandbox, with its environment), exactly like a setup launch step."""
        assert self.root is not None and self.sandbox is not None
        launcher = self.root / "bin" / "retrace-launch"
        launcher.parent.mkdir()
        self.sandbox.write_launcher(launcher, log=self.root / "logs" / "menu.log")
        path.parent.mkdir(parents=True)
        path.write_text(menu_xml([str(launcher)]))

    def _claim_display(self) -> None:
        """Xvfb on the first display number no other server (of ours or anyone's) holds.

        Xvfb listens on its socket file only (no TCP, no abstract socket, which any process of the host's
        network namespace could reach). Without the abstract socket nothing stops two servers from taking
        the same number (one unlinks the other's socket file: measured with 3 desktops starting at once), so
        a number is claimed first with a lock held for the desktop's life (released by the kernel however the
        worker ends), then by Xvfb's own lock file, which catches servers that are not ours."""
        for number in range(_FIRST_DISPLAY, _FIRST_DISPLAY + 1000):
            claim = open(f"/tmp/.retrace-X{number}.lock", "a")  # noqa: SIM115 - held until close()
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                claim.close()
                continue
            if Path(f"/tmp/.X{number}-lock").exists():  # another server's, or a stale one: skip either way
                claim.close()
                continue
            try:
                self._launch_xvfb(number)
            except EnvError:
                claim.close()
                if "already active" in self._tail("Xvfb"):
                    continue  # lost a race with a server that is not ours: try the next number
                raise
            self._claim = claim
            return
        raise EnvError(f"no free X display number in {_FIRST_DISPLAY}..{_FIRST_DISPLAY + 999}")

    def _launch_xvfb(self, number: int) -> None:
        read_fd, write_fd = os.pipe()
        self._xvfb = subprocess.Popen(
            x_server_argv(xvfb_argv(number, self.size, write_fd)),  # its IPC namespace is the task's (sandbox.py)
            pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=self._log("Xvfb"),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RETRACE_ENV": self.tag},
            preexec_fn=die_with_parent,
        )
        os.close(write_fd)
        try:
            self.display = ":" + self._read_display(read_fd)
        finally:
            os.close(read_fd)

    def _read_display(self, fd: int, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        buf = b""
        os.set_blocking(fd, False)
        while not buf.endswith(b"\n"):
            if self._xvfb is not None and self._xvfb.poll() is not None:
                raise EnvError(f"Xvfb exited with {self._xvfb.returncode}: {self._tail('Xvfb')}")
            if time.monotonic() > deadline:
                raise EnvError("Xvfb did not report a display within 15 s")
            try:
                buf += os.read(fd, 32)
            except BlockingIOError:
                time.sleep(0.01)
        return buf.decode().strip()

    def _wait_for_wm(self, timeout: float = 10.0) -> None:
        # openbox announces itself by setting _NET_SUPPORTING_WM_CHECK on the root window
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                res = subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=self._host_env(),
                                     capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                break
            if "window id" in res.stdout:
                return
            if self._wm is not None and self._wm.poll() is not None:
                raise EnvError(f"openbox exited with {self._wm.returncode}: {self._tail('openbox')}")
            time.sleep(0.02)
        raise EnvError("openbox did not start within 10 s")

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        if self.root is None:
            raise EnvError("the environment is not started")
        self.kill_session()
        self._restart_display()
        assert self.sandbox is not None
        self.sandbox.start(network=task.network or self.network == "host", ipc_of=self._xvfb_pid())
        self.masks = masks
        self._settle = self.settle_cfg.at_least(task.settle_quiet)
        # the pointer outlives apps: park it so hover effects never depend on the previous case
        self._xdotool(["mousemove", str(self.size[0] - 1), str(self.size[1] - 1)])
        apply_setup(self, task, files, masks)
        self.settle()

    def close(self) -> None:
        if self.root is None:
            return
        try:
            if self.sandbox is not None:
                self.sandbox.close()  # its processes, then its control group
        finally:
            self._stop_display()
            if self._claim is not None:
                self._claim.close()  # after the server is gone: the number is free again
                self._claim = None
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- processes ---------------------------------------------------------------------------------
    def _host_env(self) -> dict[str, str]:
        """For the harness's own X clients (xdotool, xprop): outside the sandbox, never given to a task."""
        return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "DISPLAY": self.display,
                "RETRACE_ENV": self.tag}

    def _log(self, name: str):
        assert self.root is not None
        return open(self.root / "logs" / f"{name}.log", "ab")

    def _tail(self, name: str, n: int = 600) -> str:
        assert self.root is not None
        try:
            return (self.root / "logs" / f"{name}.log").read_bytes()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def _check_alive(self) -> None:
        # Only the X server: the window manager is an X client a task can kill, and reset restarts it.
        if self._xvfb is None or self._xvfb.poll() is not None:
            raise EnvError("the X server is not running")
        if self._x is not None and self._x.blocked is not None:
            raise DisplayBlocked(self._x.blocked)  # at once: a held grab would make every X client wait

    def harness_fault(self) -> str | None:
        """The X server dead, or the window manager ended by a signal: only the host sends those (the task's
        processes run as another user in namespaces of their own, and cannot signal either). A window manager
        that exited by itself lost its X connection, which any X client can cut (XKillClient): the task's doing.
        A display blocked by a grab is alive: the grab is the task's."""
        if self._xvfb is None:
            return "the X server was never started"
        if (code := self._xvfb.poll()) is not None:
            return f"the X server exited ({_exit_status(code)}): {self._tail('Xvfb', 300)}"
        if self._wm is not None and (code := self._wm.poll()) is not None and code < 0:
            return f"the window manager was ended by the host ({_exit_status(code)}): {self._tail('openbox', 300)}"
        return None

    def session_pids(self) -> list[int]:
        """Every live process of the current task."""
        return self.sandbox.pids() if self.sandbox is not None else []

    def task_cpu_seconds(self) -> float:
        return cpu_seconds(self.session_pids())

    def kill_session(self) -> None:
        if self.sandbox is not None:
            self.sandbox.kill()

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
        with tempfile.TemporaryFile() as err:
            proc = self.sandbox.popen(["/bin/sh", "-c", script, "sh", guest], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=err)
            try:
                proc.communicate(data, timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise EnvError(f"writing {path} did not finish within 30 s") from None
            if proc.returncode != 0:
                err.seek(0)
                raise EnvError(f"cannot write {path}: {err.read(600).decode(errors='replace').strip()}")

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """Run a shell command in the task's sandbox. A timeout is an outcome (exit status 124, as
        coreutils' timeout): what a command waits on inside the sandbox is the task's state."""
        self._check_alive()
        assert self.sandbox is not None
        # files, not pipes: a command that backgrounds a process must not hang us on an open pipe
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = self.sandbox.popen(["/bin/sh", "-c", command], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
            try:
                code = proc.wait(timeout=timeout)
                note = ""
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code, note = 124, f"\nretrace: timed out after {timeout:g} s"
            out.seek(0)
            err.seek(0)
            return CommandResult(code, out.read(MAX_OUTPUT).decode(errors="replace"),
                                 err.read(MAX_OUTPUT).decode(errors="replace") + note)

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        assert self.sandbox is not None
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        argv = [self.guest_path(a) for a in argv]
        if shutil.which(argv[0]) is None:
            raise EnvError(f"{argv[0]} is not installed")
        name = Path(argv[0]).name
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
    def screenshot(self) -> np.ndarray:
        self._check_alive()
        assert self._x is not None
        return self._x.call(self._grab, what="screenshot")

    def _grab(self) -> np.ndarray:
        shot = self._grabber.grab(self._grabber.monitors[1])  # type: ignore[union-attr]
        # BGRX -> RGB by Pillow's unpacker: 2.2 ms of CPU where numpy's strided copy took 3.7 (settling grabs
        # every 30 ms, so at -n 16 this conversion was a large share of the machine)
        return np.array(Image.frombuffer("RGB", shot.size, shot.raw, "raw", "BGRX", 0, 1))

    def settle(self, before: np.ndarray | None = None) -> Settled:
        return wait_stable(self.screenshot, self._settle, self.masks, before,
                           _Damage(self._x, self._damage) if self._settle.signal == "damage" else None)

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


class _Damage:
    """The DAMAGE watch's calls on the X thread, with its deadlines (settle.Changes)."""

    def __init__(self, x: XThread | None, watch: DamageWatch | None) -> None:
        assert x is not None and watch is not None
        self._x, self._watch = x, watch

    def clear(self) -> None:
        self._x.call(self._watch.clear, what="DAMAGE request")

    def wait(self, timeout: float) -> bool:
        return self._x.call(self._watch.wait, timeout, what="DAMAGE wait", extra=max(0.0, timeout))


def _exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
