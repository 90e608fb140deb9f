"""The default environment: a real X desktop (Xvfb + openbox) with real Debian apps.

Isolation and determinism choices, each because a screenshot must be reproducible bit for bit:
- ``Xvfb -displayfd`` picks a free display number itself, so parallel xdist workers never race.
- ``Xvfb -noreset``: by default the server resets when its last client disconnects. The first
  ``xprop`` that polls for the window manager could be that client, and a connection that arrives
  during the reset fails: openbox then exited with "Failed to open the display" (measured: 13 of
  360 starts with 3 desktops starting at once).
- Every app runs in a private mount namespace where the environment's own home directory is mounted at
  ``/home/user``: window titles and file dialogs show the same path in every worker (``/tmp/xyz``
  would differ per worker and break SSIM against the recorded target).
- Every process started for a task carries ``RETRACE_SESSION=<tag>`` in its environment; reset kills
  exactly the processes with that tag (daemons that re-parent away included), without a process tree.
- Xvfb and the window manager die with the worker even on SIGKILL (PR_SET_PDEATHSIG), and every
  other process we started dies with Xvfb's display.
- GTK cursor blink and animations are off; D-Bus is disabled and GSettings writes a keyfile in HOME,
  so an app's settings are plain files that reset restores (and evaluators can read).
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..actions import Action
from ..cases import CommandStep, FileStep, LaunchStep, Task
from ..evaluators import CommandResult
from ..settle import Rect, SettleConfig, wait_stable
from . import ActionFailed, EnvError
from .inputs import release_all
from .keymap import Keymap
from .procfs import tagged_pids

GUEST_HOME = "/home/user"
_TEMPLATE = Path(__file__).with_name("home-template")
_OPENBOX_RC = Path(__file__).with_name("openbox-rc.xml")
# The desktop's application menu (right-click on the desktop), as on any real desktop: without it an
# agent that closed the task's only window could never reopen it. Same arguments as the suite's tasks
# use, so a reopened app looks like the one the task started.
DESKTOP_MENU: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Terminal", ("xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black")),
    ("Text Editor", ("mousepad",)),
    ("Spreadsheet", ("gnumeric",)),
)

# pyautogui key names -> X keysyms understood by xdotool
_KEYSYMS = {
    "enter": "Return", "esc": "Escape", "tab": "Tab", "space": "space", "backspace": "BackSpace",
    "delete": "Delete", "insert": "Insert", "home": "Home", "end": "End", "pageup": "Prior",
    "pagedown": "Next", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "ctrl": "ctrl", "shift": "shift", "alt": "alt", "win": "super", "capslock": "Caps_Lock",
    "numlock": "Num_Lock", "printscreen": "Print", "menu": "Menu", "pause": "Pause",
    "scrolllock": "Scroll_Lock", "ctrlleft": "Control_L", "ctrlright": "Control_R",
    "shiftleft": "Shift_L", "shiftright": "Shift_R", "altleft": "Alt_L", "altright": "Alt_R",
    "winleft": "Super_L", "winright": "Super_R",
    "-": "minus", "=": "equal", ",": "comma", ".": "period", "/": "slash", ";": "semicolon",
    "'": "apostrophe", "[": "bracketleft", "]": "bracketright", "\\": "backslash", "`": "grave",
    "+": "plus", "*": "asterisk", "!": "exclam", "@": "at", "#": "numbersign", "$": "dollar",
    "%": "percent", "^": "asciicircum", "&": "ampersand", "(": "parenleft", ")": "parenright",
    "_": "underscore", ":": "colon", '"': "quotedbl", "<": "less", ">": "greater", "?": "question",
    "{": "braceleft", "}": "braceright", "|": "bar", "~": "asciitilde",
} | {f"f{i}": f"F{i}" for i in range(1, 25)}
_BUTTONS = {"left": "1", "middle": "2", "right": "3"}
# Between keys, as a person types; characters the keymap lacks go through keymap.py, not a delay.
_TYPE_DELAY_MS = "25"
# Time limits of one xdotool call: a base plus the time the action itself asks for (typing speed, wheel
# clicks, key presses, a held chord). The caps on Action keep every accepted action well inside them.
_BASE_TIMEOUT = 15.0


def _keysym(key: str) -> str:
    return _KEYSYMS.get(key, key)


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the worker that started it dies, however it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _namespaces_work() -> bool:
    if shutil.which("mount") is None:
        return False
    try:
        res = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


class XvfbEnvironment:
    name = "xvfb"

    def __init__(self, size: tuple[int, int] = (1280, 800), settle: SettleConfig | None = None,
                 masks: Sequence[Rect] = ()) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.settle_cfg = settle or SettleConfig()
        self.masks: Sequence[Rect] = masks  # set per case by the replay (regions ignored by settling)
        self.root: Path | None = None
        self.display = ""
        self.tag = ""
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._wm: subprocess.Popen[bytes] | None = None
        self._grabber = None
        self._keymap: Keymap | None = None  # connected on the first character the keymap lacks
        self._use_ns = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        for tool in ("Xvfb", "openbox", "xdotool"):
            if shutil.which(tool) is None:
                raise EnvError(f"{tool} not found: install the desktop packages (scripts/bootstrap)")
        self.root = Path(tempfile.mkdtemp(prefix="retrace-xvfb-"))
        self.tag = str(self.root)  # unique, and tells a leak hunter which run a process belongs to
        (self.root / "logs").mkdir()
        self._use_ns = os.geteuid() == 0 and _namespaces_work()
        if self._use_ns:
            os.makedirs(GUEST_HOME, exist_ok=True)
        else:
            import warnings

            warnings.warn(f"retrace xvfb: no private mount namespace (needs root, unshare and mount): apps see "
                          f"HOME={self.home}, not {GUEST_HOME}; recorded screens that show paths will not match",
                          RuntimeWarning, stacklevel=2)
        read_fd, write_fd = os.pipe()
        w, h = self.size
        self._xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", f"{w}x{h}x24", "-nolisten", "tcp", "-nocursor",
             "-dpi", "96", "+extension", "XTEST", "-noreset"],
            pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=self._log("Xvfb"),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RETRACE_ENV": self.tag},
            preexec_fn=_die_with_parent,
        )
        os.close(write_fd)
        try:
            self.display = ":" + self._read_display(read_fd)
        finally:
            os.close(read_fd)
        self._restore_home()
        wm_home = self.root / "wm-home"  # the WM runs outside the namespace: give it a home of its own
        self._write_menu(wm_home / ".config" / "openbox" / "menu.xml")
        wm_env = {**self._env(session=False), "HOME": str(wm_home), "XDG_CONFIG_HOME": str(wm_home / ".config"),
                  "XDG_CACHE_HOME": str(wm_home / ".cache"), "XDG_DATA_HOME": str(wm_home / ".local/share")}
        self._wm = subprocess.Popen(  # stdout too: openbox prints its fatal messages there
            ["openbox", "--config-file", str(_OPENBOX_RC)], env=wm_env,
            stdout=self._log("openbox"), stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )
        self._wait_for_wm()
        import mss

        factory = getattr(mss, "MSS", None) or mss.mss
        self._grabber = factory(display=self.display)

    def _write_menu(self, path: Path) -> None:
        """The root menu, whose entries start apps through a launcher that makes them part of the current
        task (tagged, in the namespace, with the task's environment), exactly like a setup launch step:
        reset kills them and they see /home/user."""
        from xml.sax.saxutils import escape, quoteattr

        assert self.root is not None
        launcher = self.root / "bin" / "retrace-launch"
        launcher.parent.mkdir()
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self._env().items())
        launcher.write_text(f"#!/bin/sh\ncd {shlex.quote(str(self.home))} || exit 1\n"
                            f"exec env -i {env} {shlex.join(self._wrap([]))} \"$@\" "
                            f">>{shlex.quote(str(self.root / 'logs' / 'menu.log'))} 2>&1\n")
        launcher.chmod(0o755)
        items = "".join(f'<item label={quoteattr(label)}><action name="Execute"><command>'
                        f"{escape(shlex.join([str(launcher), *argv]))}</command></action></item>"
                        for label, argv in DESKTOP_MENU)
        path.parent.mkdir(parents=True)
        path.write_text(f'<?xml version="1.0" encoding="UTF-8"?>\n<openbox_menu xmlns="http://openbox.org/3.4/menu">'
                        f'<menu id="root-menu" label="Applications">{items}</menu></openbox_menu>\n')

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
            res = subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=self._env(session=False),
                                 capture_output=True, text=True)
            if "window id" in res.stdout:
                return
            if self._wm is not None and self._wm.poll() is not None:
                raise EnvError(f"openbox exited with {self._wm.returncode}: {self._tail('openbox')}")
            time.sleep(0.02)
        raise EnvError("openbox did not start within 10 s")

    def reset(self, task: Task, case_dir: Path) -> None:
        self._check_alive()
        self.kill_session()
        if self._keymap is not None:
            self._keymap.clear()  # safe now: no app is left that could still translate a bound key
        release_all(self.display)  # keys, buttons and locks an agent left held live in the X server
        self._restore_home()
        # the pointer outlives apps: park it so hover effects never depend on the previous case
        self._xdotool(["mousemove", str(self.size[0] - 1), str(self.size[1] - 1)])
        for i, step in enumerate(task.setup):
            try:
                self._setup_step(step, case_dir)
            except EnvError as exc:
                raise EnvError(f"task {task.id}: setup[{i}] ({step.type}): {exc}") from None
        self.settle()

    def close(self) -> None:
        if self.root is None:
            return
        try:
            self.kill_session()
        finally:
            for proc in (self._wm, self._xvfb):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
            for conn in (self._grabber, self._keymap):
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # the display is gone already; nothing left to release
                        pass
            self._grabber = self._keymap = None
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- processes ---------------------------------------------------------------------------------
    def _env(self, session: bool = True) -> dict[str, str]:
        assert self.root is not None
        home = GUEST_HOME if self._use_ns else str(self.home)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "DISPLAY": self.display,
            "HOME": home,
            "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
            "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_RUNTIME_DIR": str(self.root / "runtime"),
            # no session bus: apps fall back to single-instance-less mode, nothing outlives a reset
            "DBUS_SESSION_BUS_ADDRESS": "disabled:", "NO_AT_BRIDGE": "1", "GTK_A11Y": "none",
            "GSETTINGS_BACKEND": "keyfile", "GTK_OVERLAY_SCROLLING": "0",
            "XDG_SESSION_TYPE": "x11", "RETRACE_ENV": self.tag,
        }
        if session:
            env["RETRACE_SESSION"] = self.tag
        return env

    def _wrap(self, argv: list[str]) -> list[str]:
        """Run argv with the environment's home mounted at /home/user (see module docstring)."""
        if not self._use_ns:
            return argv
        script = 'mount --bind "$0" /home/user && cd /home/user && exec "$@"'
        return ["unshare", "-m", "--propagation", "private", "--", "/bin/sh", "-c", script, str(self.home), *argv]

    def _log(self, name: str):  # noqa: ANN202 - a file object for Popen
        assert self.root is not None
        return open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - Popen keeps it

    def _tail(self, name: str, n: int = 600) -> str:
        assert self.root is not None
        try:
            return (self.root / "logs" / f"{name}.log").read_bytes()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if self._xvfb is None or self._xvfb.poll() is not None:
            raise EnvError("the X server is not running")
        if self._wm is None or self._wm.poll() is not None:
            raise EnvError("the window manager is not running")

    def session_pids(self) -> list[int]:
        """Every live process started for the current task (tagged RETRACE_SESSION=<tag>)."""
        return tagged_pids(f"RETRACE_SESSION={self.tag}".encode() + b"\0")

    def kill_session(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while pids := self.session_pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)  # HOME is thrown away next, so nothing needs a clean exit
                except ProcessLookupError:
                    pass
            # reap our own children so they don't linger as zombies (still listed in /proc)
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG) == (0, 0):
                        break
                except ChildProcessError:
                    break
            if time.monotonic() > deadline:
                raise EnvError(f"processes {pids} survived SIGKILL for {timeout} s")
            time.sleep(0.005)

    # -- home directory ----------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        assert self.root is not None
        return self.root / "home"

    def _restore_home(self) -> None:
        assert self.root is not None
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.copytree(_TEMPLATE, self.home, symlinks=True)
        runtime = self.root / "runtime"
        shutil.rmtree(runtime, ignore_errors=True)
        runtime.mkdir(mode=0o700)

    def host_path(self, path: str) -> Path:
        """Where a guest path (``~/x``, ``/home/user/x`` or absolute) lives on this machine."""
        if path == "~" or path.startswith("~/"):
            return self.home / path[2:]
        if path == GUEST_HOME or path.startswith(GUEST_HOME + "/"):
            return self.home / path[len(GUEST_HOME) + 1 :]
        if not path.startswith("/"):
            return self.home / path
        return Path(path)

    def guest_path(self, path: str) -> str:
        home = GUEST_HOME if self._use_ns else str(self.home)
        if path == "~" or path.startswith("~/"):
            return home + path[1:]
        return path

    def read_file(self, path: str) -> bytes | None:
        try:
            return self.host_path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write_file(self, path: str, data: bytes) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        self._check_alive()
        # files, not pipes: a command that backgrounds a process must not hang us on an open pipe
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                res = subprocess.run(self._wrap(["/bin/sh", "-c", command]), env=self._env(), stdout=out,
                                     stderr=err, stdin=subprocess.DEVNULL, timeout=timeout, cwd=self.home,
                                     start_new_session=True)
            except subprocess.TimeoutExpired:
                raise EnvError(f"command timed out after {timeout} s: {command}") from None
            out.seek(0)
            err.seek(0)
            return CommandResult(res.returncode, out.read().decode(errors="replace"),
                                 err.read().decode(errors="replace"))

    # -- setup steps -------------------------------------------------------------------------------
    def _setup_step(self, step: LaunchStep | FileStep | CommandStep, case_dir: Path) -> None:
        if isinstance(step, FileStep):
            data = step.content.encode() if step.content is not None else (case_dir / str(step.src)).read_bytes()
            self.write_file(step.path, data)
        elif isinstance(step, CommandStep):
            res = self.run(step.command, timeout=step.timeout)
            if res.returncode != 0:
                raise EnvError(f"`{step.command}` exited {res.returncode}: {res.stderr.strip()[-300:]}")
        else:
            self.launch(step.command, window=step.window, timeout=step.timeout)

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        argv = [self.guest_path(a) for a in argv]
        if shutil.which(argv[0]) is None:
            raise EnvError(f"{argv[0]} is not installed")
        name = Path(argv[0]).name
        with self._log(name) as log:
            proc = subprocess.Popen(self._wrap(argv), env=self._env(), cwd=self.home, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
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
            res = subprocess.run(["xdotool", "search", "--onlyvisible", field, pattern], env=self._env(False),
                                 capture_output=True, text=True)
            found += res.stdout.split()
        return sorted(set(found))

    # -- input and output --------------------------------------------------------------------------
    def screenshot(self) -> np.ndarray:
        self._check_alive()
        shot = self._grabber.grab(self._grabber.monitors[1])  # type: ignore[union-attr]
        # BGRA -> RGB without a copy per channel
        return np.asarray(shot, dtype=np.uint8)[..., 2::-1].copy()

    def settle(self) -> float:
        return wait_stable(self.screenshot, self.settle_cfg, self.masks).seconds

    def cursor_position(self) -> tuple[int, int]:
        res = subprocess.run(["xdotool", "getmouselocation", "--shell"], env=self._env(False), capture_output=True,
                             text=True, timeout=_BASE_TIMEOUT)
        values = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        try:
            return int(values["X"]), int(values["Y"])
        except (KeyError, ValueError):
            raise EnvError(f"xdotool getmouselocation failed: {res.stderr.strip()}") from None

    def execute(self, action: Action) -> float:
        self._check_alive()
        w, h = self.size
        for x, y in ((action.x, action.y), (action.x2, action.y2)):
            if x is not None and (x >= w or y >= h):
                raise ActionFailed(f"{action.describe()}: ({x}, {y}) is outside the {w}x{h} screen")
        if action.kind == "wait":
            time.sleep(action.seconds)
        elif action.kind == "type":
            # xdotool drops "\n" inside `type` text: newlines go as Return key presses
            for i, line in enumerate(action.text.split("\n")):
                if i:
                    self._xdotool(["key", "Return"])
                if line.isascii() and line.isprintable():
                    self._xdotool(["type", "--delay", _TYPE_DELAY_MS, "--", line], timeout=_BASE_TIMEOUT + 0.05 * len(line))
                elif line:
                    if self._keymap is None:
                        self._keymap = Keymap(self.display)
                    self._keymap.type(line, lambda keys: self._xdotool(["key", "--delay", _TYPE_DELAY_MS, *keys],
                                                                       timeout=_BASE_TIMEOUT + 0.05 * len(keys)),
                                      self.settle)
        elif not action.terminal:
            a = action
            work = 0.05 * len(a.keys) * a.presses + 0.05 * (abs(a.dx) + abs(a.dy)) + a.seconds * a.presses
            self._xdotool(self._xdotool_args(a), timeout=_BASE_TIMEOUT + work)
        return self.settle()

    def _xdotool(self, args: list[str], timeout: float = _BASE_TIMEOUT) -> None:
        try:
            res = subprocess.run(["xdotool", *args], env=self._env(False), capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            self._check_alive()  # a dead desktop is an infrastructure error, whatever the action was
            raise ActionFailed(f"xdotool {' '.join(args)[:200]} did not finish within {timeout:.0f} s") from None
        if res.returncode != 0:
            self._check_alive()
            raise ActionFailed(f"xdotool {' '.join(args)[:200]} failed: {res.stderr.strip()[:300]}")

    def _xdotool_args(self, a: Action) -> list[str]:
        """One xdotool command chain for `a`, with the keys of `a.hold` held around pointer actions."""
        hold = "+".join(_keysym(k) for k in a.hold)
        pointer = self._pointer_args(a)
        if pointer is not None:
            return [*(["keydown", hold] if hold else []), *pointer, *(["keyup", hold] if hold else [])]
        if a.kind == "key":
            return ["key", "--delay", "40", "--repeat", str(a.presses), "--", *(_keysym(k) for k in a.keys)]
        if a.kind == "hotkey":
            chord = "+".join(_keysym(k) for k in a.keys)
            if a.seconds:  # Claude's hold_key: the chord stays down for `seconds`
                return [arg for _ in range(a.presses) for arg in ("keydown", chord, "sleep", str(a.seconds),
                                                                   "keyup", chord)]
            return ["key", "--repeat", str(a.presses), "--", chord]
        if a.kind in ("key_down", "key_up"):
            return [a.kind.replace("_", ""), "--", *(_keysym(k) for k in a.keys)]
        raise EnvError(f"action {a.kind!r} is not supported by the xvfb environment")

    @staticmethod
    def _pointer_args(a: Action) -> list[str] | None:
        move = ["mousemove", str(a.x), str(a.y)] if a.x is not None else []
        button = _BUTTONS[a.button]
        if a.kind == "click":
            return [*move, "click", "--repeat", str(a.clicks), "--delay", "80", button]
        if a.kind == "move":
            return move
        if a.kind == "mouse_down":
            return [*move, "mousedown", button]
        if a.kind == "mouse_up":
            return [*move, "mouseup", button]
        if a.kind == "drag":
            # intermediate motion so toolkits see a real drag, not a teleport
            return [*move, "mousedown", button, "sleep", "0.05", "mousemove", str(a.x2), str(a.y2),
                    "sleep", "0.05", "mouseup", button]
        if a.kind == "scroll":
            steps = []
            if a.dy:
                steps += ["click", "--repeat", str(abs(a.dy)), "--delay", "30", "4" if a.dy > 0 else "5"]
            if a.dx:
                steps += ["click", "--repeat", str(abs(a.dx)), "--delay", "30", "7" if a.dx > 0 else "6"]
            return [*move, *steps]
        return None
