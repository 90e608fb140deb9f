"""The desktop under a task: its Xvfb server (on a display number claimed for the desktop's life), its
openbox window manager, and the harness's X connections (screenshots, DAMAGE), with their logs and health.

`XDesktop` is the xvfb environment's base class: environment.py adds the task (sandbox, files, commands,
input) on top of it.

Two layouts. By default the X server and the window manager are the worker's children, outside the task's
namespaces, and the display's socket is bound into the task. With ``in_task`` (checkpoints on, checkpoint.py)
the task's sandbox init starts both inside the task's namespaces, as root: the whole desktop is one process tree
that CRIU can dump and restore; the harness reaches the display through a link to the socket in the task's /tmp.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image

from pytest_retrace.envs import DisplayBlocked, EnvError
from pytest_retrace.envs.desktop import OPENBOX_RC, menu_xml, xvfb_argv
from pytest_retrace.envs.procfs import start_time
from pytest_retrace.envs.xvfb.damage import DamageWatch
from pytest_retrace.envs.xvfb.keymap import Keymap
from pytest_retrace.envs.xvfb.lifetime import dying_with_parent
from pytest_retrace.envs.xvfb.sandbox import WM_HOME, Sandbox, x_server_argv
from pytest_retrace.envs.xvfb.tree import root_processes
from pytest_retrace.envs.xvfb.xthread import XThread

_FIRST_DISPLAY = 10  # leave :0.. to a machine's own desktops


class XDesktop:
    """Xvfb + openbox + the harness's connections to them. `sandbox` is set by the environment before the
    window manager starts (the desktop menu launches apps into it)."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = (int(size[0]), int(size[1]))
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
        self.in_task = False  # the X server and window manager live in the task's namespaces (module docstring)

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

    def _in_task_display(self) -> Path:
        """In-task layout: where the display's socket is as the host sees it (in the task's /tmp); the host's
        /tmp/.X11-unix/X<n> links to it, so every X client of the harness connects as usual."""
        assert self.root is not None
        return self.root / "tmp" / ".X11-unix" / f"X{self.display.lstrip(':')}"

    def _desktop_script(self) -> Path:
        """In-task layout: the script the task's sandbox init runs (as root, inside its namespaces, before the
        harness's trees are hidden; the window manager's home is bound in at WM_HOME by then) to start the X
        server and the window manager. They leave the task's control
        group first, as outside: a task that exhausts its memory must not take the X server with it. Their
        output goes nowhere: a checkpoint restores a file a process writes only at the size it had. The window
        manager starts once a client has been served: the socket exists from Xvfb's bind, before its listen, and
        a connection in between is refused (at a load of 30, openbox then exited at start once in 753 tests)."""
        assert self.root is not None and self.sandbox is not None
        script = self.root / "desktop.sh"
        if script.exists():
            return script
        number = self.display.lstrip(":")
        wm = WM_HOME
        leave = " ".join(shlex.quote(str(Path(f).parent.parent / "cgroup.procs")) for f in self.sandbox.group.join_files)
        xvfb = shlex.join(["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
                           *xvfb_argv(int(number), self.size, None)])
        openbox = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in self._wm_env(Path(wm)).items()),
                              "openbox", "--config-file", f"{wm}/rc.xml"])
        script.write_text(f"""set -eu
display=$1
for f in {leave}; do echo $$ > "$f"; done
{xvfb} </dev/null >/dev/null 2>&1 &
i=0
until xprop -display ":$display" -root _XKB_RULES_NAMES >/dev/null 2>&1; do
  i=$((i + 1)); if [ $i -gt 1500 ]; then echo "Xvfb did not start within 15 s" >&2; exit 1; fi
  sleep 0.01
done
{openbox} </dev/null >/dev/null 2>&1 &
""")
        return script

    def _wm_env(self, home: Path) -> dict[str, str]:
        return {**self._host_env(), "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local/share")}

    def _adopt_desktop(self) -> None:
        """In-task layout, after the sandbox started (or a checkpoint was restored): find the X server and the
        window manager among the task's processes, wait for the window manager, connect."""
        assert self.sandbox is not None
        deadline = time.monotonic() + 10  # started in the background: each is `env` until it has exec'd
        while True:
            found = {name: pid for pid, name in root_processes(self.sandbox)}
            if "Xvfb" in found and "openbox" in found:
                break
            if time.monotonic() > deadline:
                raise EnvError(f"the X server and window manager did not start in the task's namespaces "
                               f"(found: {', '.join(sorted(found)) or 'none'})")
            time.sleep(0.01)
        self._xvfb, self._wm = _Foreign(found["Xvfb"]), _Foreign(found["openbox"])
        self._connect()
        self._wait_for_wm()

    def _restart_display(self) -> None:
        """A fresh X server for every task. Any X client can change server state that no process holds:
        key and modifier mappings (xmodmap), the pointer's button map, held keys and buttons, Caps Lock,
        autorepeat (xset), the root window's colour and properties, the screen saver. Restoring a list of
        them would miss the next one; a new server has none of it (measured cost in benchmarks/bench_env.py)."""
        self._stop_display()
        self._launch_xvfb(int(self.display.lstrip(":")))
        self._connect()
        self._start_wm()

    def _xvfb_pid(self) -> int | None:
        return self._xvfb.pid if self._xvfb is not None and self.sandbox is not None and self.sandbox.enabled else None

    def _start_wm(self) -> None:
        assert self.root is not None and self.sandbox is not None
        wm_home = self.root / "wm-home"  # the WM runs outside the sandbox: give it a home of its own
        if not wm_home.exists():
            self._write_wm_home(wm_home)
        self._wm = subprocess.Popen(  # stdout too: openbox prints its fatal messages there
            dying_with_parent(["openbox", "--config-file", str(OPENBOX_RC)]), env=self._wm_env(wm_home),
            stdout=self._log("openbox"), stderr=subprocess.STDOUT,
        )
        self._wait_for_wm()

    def _write_wm_home(self, wm_home: Path) -> None:
        """The window manager's home: its root menu, whose entries start apps through a launcher that makes them
        part of the current task (in its sandbox, with its environment), exactly like a setup launch step. In the
        in-task layout the home is seen inside the task at WM_HOME (root's only), with its own rc.xml."""
        assert self.root is not None and self.sandbox is not None
        seen = Path(WM_HOME) if self.in_task else wm_home
        (wm_home / "bin").mkdir(parents=True)
        wm_home.chmod(0o700)
        log = Path("/dev/null") if self.in_task else self.root / "logs" / "menu.log"
        self.sandbox.write_launcher(wm_home / "bin" / "retrace-launch", log=log, in_task=self.in_task)
        menu = wm_home / ".config" / "openbox" / "menu.xml"
        menu.parent.mkdir(parents=True)
        menu.write_text(menu_xml([str(seen / "bin" / "retrace-launch")]))
        if self.in_task:
            (wm_home / "rc.xml").write_bytes(OPENBOX_RC.read_bytes())

    def _claim_number(self) -> None:
        """In-task layout: a display number claimed as _claim_display does, without starting a server (the task's
        sandbox starts it). The host's lock file names this worker, so an X server of anyone else's leaves the
        number alone; the socket's name links into the task's /tmp."""
        for number in range(_FIRST_DISPLAY, _FIRST_DISPLAY + 1000):
            claim = open(f"/tmp/.retrace-X{number}.lock", "a")  # noqa: SIM115 - held until close()
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                claim.close()
                continue
            socket, lock = Path(f"/tmp/.X11-unix/X{number}"), Path(f"/tmp/.X{number}-lock")
            if lock.exists() or socket.exists() or socket.is_symlink():
                claim.close()
                continue
            try:
                with open(lock, "x") as fh:
                    fh.write(f"{os.getpid():10d}\n")
            except FileExistsError:
                claim.close()
                continue
            self._claim, self.display = claim, f":{number}"
            Path("/tmp/.X11-unix").mkdir(mode=0o1777, exist_ok=True)
            socket.symlink_to(self._in_task_display())
            return
        raise EnvError(f"no free X display number in {_FIRST_DISPLAY}..{_FIRST_DISPLAY + 999}")

    def _release_number(self) -> None:
        if self.in_task and self.display:
            number = self.display.lstrip(":")
            Path(f"/tmp/.X11-unix/X{number}").unlink(missing_ok=True)
            Path(f"/tmp/.X{number}-lock").unlink(missing_ok=True)

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
            dying_with_parent(x_server_argv(xvfb_argv(number, self.size, write_fd))),  # its IPC namespace is the
            pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=self._log("Xvfb"),  # task's (sandbox.py)
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RETRACE_ENV": self.tag},
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
        """Until openbox announces itself (``_NET_SUPPORTING_WM_CHECK`` on the root window), read on the harness's
        own connection: connected first (Xvfb answers from its -displayfd on, and -noreset keeps it up)."""
        assert self._x is not None and self._damage is not None, "connect first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._x.call(self._damage.root_has, "_NET_SUPPORTING_WM_CHECK", what="window manager check"):
                return
            if self._wm is not None and self._wm.poll() is not None:
                raise EnvError(f"openbox exited with {self._wm.returncode}: {self._tail('openbox')}")
            time.sleep(0.02)
        raise EnvError("openbox did not start within 10 s")

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

    def screenshot(self) -> np.ndarray:
        self._check_alive()
        assert self._x is not None
        return self._x.call(self._grab, what="screenshot")

    def _grab(self) -> np.ndarray:
        shot = self._grabber.grab(self._grabber.monitors[1])  # type: ignore[union-attr]
        # BGRX -> RGB by Pillow's unpacker: 2.2 ms of CPU where numpy's strided copy took 3.7 (settling grabs
        # every 30 ms, so at -n 16 this conversion was a large share of the machine)
        return np.array(Image.frombuffer("RGB", shot.size, shot.raw, "raw", "BGRX", 0, 1))

    def _changes(self) -> _Damage:
        """What settling waits on between grabs (settle.Changes): the DAMAGE watch, on the X thread."""
        return _Damage(self._x, self._damage)


class _Damage:
    """The DAMAGE watch's calls on the X thread, with its deadlines (settle.Changes)."""

    def __init__(self, x: XThread | None, watch: DamageWatch | None) -> None:
        assert x is not None and watch is not None
        self._x, self._watch = x, watch

    def clear(self) -> None:
        self._x.call(self._watch.clear, what="DAMAGE request")

    def wait(self, timeout: float) -> bool:
        return self._x.call(self._watch.wait, timeout, what="DAMAGE wait", extra=max(0.0, timeout))


class _Foreign:
    """The X server or window manager of the in-task layout: a process of the task's tree, not the worker's
    child, so its exit status is not ours to read (``returncode`` stays None once it is gone)."""

    returncode = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = start_time(pid)

    def poll(self) -> int | None:
        return None if self._start is not None and start_time(self.pid) == self._start else _GONE

    def terminate(self) -> None:
        pass  # ends with the task's namespace (Sandbox.kill)

    kill = terminate

    def wait(self, timeout: float | None = None) -> int:
        return _GONE


_GONE = 256  # _Foreign.poll() of a process that is gone: not an exit status any process can have


def _exit_status(code: int) -> str:
    if code == _GONE:
        return "its exit status unknown: a process of the task's tree"
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
