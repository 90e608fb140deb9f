"""The per-task sandbox every app and every shell of a task runs in.

An agent under test types into a real terminal, so everything a task starts is treated as hostile:
- **One PID namespace per task** (plus a mount namespace, and a network namespace unless the network is
  on). Its init is root's ``tini``; apps join with ``nsenter``. Killing the init makes the kernel kill every
  process of the namespace, whatever it did to hide (``nohup``, ``setsid``, a cleared environment, a double
  fork), and the init is killed when the worker dies (``PR_SET_PDEATHSIG`` through ``unshare --kill-child``),
  even by SIGKILL.
- **An unprivileged user**: uid ``1900000000 + display number``, one per desktop, so a task's processes
  cannot signal or read another worker's, or root's. ``no_new_privs`` and an empty capability bounding set
  make set-uid programs useless; the process limit (per uid, so per worker) stops a fork bomb at its own desk.
  Inside, ``/etc/passwd`` names it ``user``: apps that look the name up find one.
- **Private trees**: ``/home/user`` (restored from the template for each task) and ``/tmp`` are directories
  of this desktop bound in; ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` (the other world-writable places) are
  fresh memory file systems. So nothing written outside the home survives the task, and no other worker's
  home or the harness's own files (the project, its cases and agents, the virtualenv: the ``hide`` list) can be
  seen.
- **The display** is reached through its one socket, bound into the private ``/tmp/.X11-unix``. The X server
  listens on nothing else (no TCP, no abstract socket), so another worker's display is out of reach even with
  the network on.
- **SysV IPC** (shared memory, semaphores, message queues; POSIX message queues) lives in an IPC namespace of
  the X server's, which the task joins: a new one with every X server, so with every reset. Not a namespace of
  the task's own: GTK apps (cairo) draw through SysV MIT-SHM segments the X server attaches by id, and an id
  means a segment only in the namespace it was made in. UTS and cgroup namespaces of its own too (the host's
  hostname, unchanged; its control group as the root of its cgroup tree). docs/sandbox.md has the full list.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import GUEST_PROGRAMS, GUEST_USER, task_environment, write_programs
from pytest_retrace.envs.guestfs import GuestFS
from pytest_retrace.envs.steps import GUEST_HOME
from pytest_retrace.envs.xvfb.cgroups import TaskGroup
from pytest_retrace.envs.xvfb.lifetime import die_with_parent, dying_with_parent
from pytest_retrace.envs.xvfb.runner import Commands

WM_HOME = "/home/.retrace-wm"  # the window manager's home inside a task whose desktop runs in it (xserver.py)
UID_BASE = 1_900_000_000  # far above any account (system, login, or container sub-uid ranges)
NPROC_LIMIT = 2048  # processes *and threads* of one desktop's user; LibreOffice alone runs ~30 threads
MEMORY_LIMIT = 4 << 30  # of all a task's processes together (cgroups.py); LibreOffice needs ~0.5 GiB
FSIZE_LIMIT = 1 << 30  # the largest file a task's process may write
# The init of a task's namespaces (a shell script, with its own comments on its arguments)
_INIT = Path(__file__).with_name("sandbox_init.sh").read_text()
# Never hidden: the trees the sandbox itself is built from.
_SYSTEM = frozenset(("/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/dev", "/proc", "/sys", "/var", "/run",
                     "/home", "/tmp", GUEST_HOME))


def available() -> str | None:
    """Why the sandbox cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "it needs root (to create namespaces and switch to the sandbox user)"
    missing = [t for t in ("unshare", "nsenter", "setpriv", "prlimit", "mount") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux and mount)"
    return None


def x_server_argv(argv: Sequence[str]) -> list[str]:
    """The X server's command line, in a new IPC namespace, which the task started on it joins
    (``Sandbox.start(ipc_of=<its pid>)``). Without the sandbox (no root) the server runs as it is."""
    return ["unshare", "--ipc", "--", *argv] if available() is None else list(argv)


class Sandbox:
    """The task sandbox of one desktop. ``start()`` per task (after ``kill()``), ``argv()`` for every process.

    With ``enabled=False`` (not root) there is no isolation at all: processes run as the caller with
    HOME pointing at the home directory on the host; kept so the package stays usable for development."""

    def __init__(self, root: Path, display: str, template: Path, *, hide: Sequence[Path] = (),
                 enabled: bool = True, memory: int = MEMORY_LIMIT,
                 program_scripts: Mapping[str, str] = GUEST_PROGRAMS) -> None:
        self.root = root
        self.program_scripts = program_scripts  # name -> script, written once per desktop into `programs`
        self.display = display
        self.template = template
        self.enabled = enabled
        self.uid = self.gid = UID_BASE + int(display.lstrip(":"))
        dirs = (p if p.is_dir() else p.parent for p in (Path(h).resolve() for h in (*hide, root)))
        self.hide = tuple(str(p) for p in dict.fromkeys(dirs) if str(p) not in _SYSTEM)
        self._unshare: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None  # the namespace's init, as the host numbers it
        self._ns: tuple[int, int] | None = None  # (st_dev, st_ino) of the task's PID namespace
        self._children: list[subprocess.Popen[bytes]] = []
        self.commands = Commands(self.popen, root / "logs" / "runner.log", runner=enabled)  # run(), write_file()
        self.accessibility = False  # the current task's: its processes get the accessibility environment
        self.flag_files = [root / "task.a11y"]  # where the menu's launcher reads it (write_launcher)
        self.group = TaskGroup(f"retrace-X{display.lstrip(':')}", memory=memory, pids=NPROC_LIMIT)
        if enabled and not self.group.create():
            import warnings

            warnings.warn(f"retrace sandbox: no memory limit for tasks ({self.group.problem}): a task that "
                          f"exhausts memory can make the kernel kill other processes", RuntimeWarning, stacklevel=2)

    def _preexec(self) -> None:
        """A preexec_fn for a task process not started by popen (CRIU's restore): die with the worker, join the
        task's group."""
        die_with_parent()
        self.group.join()

    # -- paths ---------------------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def guest_home(self) -> str:
        return GUEST_HOME if self.enabled else str(self.home)

    @property
    def fs(self) -> GuestFS:
        roots = {GUEST_HOME: self.home, "/tmp": self.tmp} if self.enabled else {str(self.home): self.home}
        return GuestFS(roots, self.guest_home)

    def env(self, accessibility: bool | None = None) -> dict[str, str]:
        """The environment of every process of a task (with `accessibility`, or the current task's)."""
        user = GUEST_USER if self.enabled else pwd.getpwuid(os.getuid()).pw_name
        runtime = "/tmp/.runtime-user" if self.enabled else str(self.tmp / ".runtime-user")
        env = task_environment(self.display, self.guest_home, user, runtime, tag=str(self.root),
                               accessibility=self.accessibility if accessibility is None else accessibility)
        if not self.enabled:  # no overlay on /usr/local/bin (_INIT): the desktop's own programs come first
            env["PATH"] = f"{self.programs}:{env['PATH']}"
        return env

    @property
    def programs(self) -> Path:
        """The desktop's own programs (desktop.py GUEST_PROGRAMS), seen in the task as /usr/local/bin/NAME."""
        return self.root / "programs"

    @property
    def netns(self) -> str | None:
        """The current task's network namespace, as a path the harness can open (None: no sandbox)."""
        if not self.enabled:
            return None
        if self.init_pid is None:
            raise EnvError("sandbox: no task is running (reset first)")
        return f"/proc/{self.init_pid}/ns/net"

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, *, network: bool, ipc_of: int | None = None, accessibility: bool = False,
              desktop: Path | None = None) -> None:
        """A fresh task: a home from the template, an empty /tmp, new namespaces, the environment of env().

        `ipc_of`: the X server's pid (started with ``x_server_argv``): the task shares its IPC namespace, so
        MIT-SHM works as on any desktop, and that namespace is as fresh as the server, new at every reset.
        None: an IPC namespace of the task's own, in which no SysV segment can be shown to the X server.

        `desktop`: a script the init runs as root inside the new namespaces, after the mounts and before the
        hiding ones, which starts the X server and the window manager there (a checkpointable desktop,
        envs/xvfb/checkpoint.py): the whole desktop is then one process tree, in one IPC namespace."""
        if self._unshare is not None:
            raise EnvError("sandbox: start() while the previous task's namespace is alive; kill() it first")
        self.accessibility = accessibility
        for flag in self.flag_files:  # for the menu's launcher
            flag.write_text("1" if accessibility else "")
        for tree in (self.home, self.tmp):
            shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(self.template, self.home, symlinks=True)
        (self.tmp / ".X11-unix").mkdir(parents=True)
        (self.tmp / ".runtime-user").mkdir(mode=0o700)
        self.tmp.chmod(0o1777)
        if not self.programs.exists():
            write_programs(self.programs, self.program_scripts)  # once per desktop, like the accounts
        if not self.enabled:
            return
        for path in (self.home, *self.home.rglob("*"), self.tmp / ".runtime-user"):
            os.chown(path, self.uid, self.gid, follow_symlinks=False)
        self.home.chmod(0o700)
        if not (self.root / "etc").exists():
            self._write_accounts()  # once per desktop: the accounts never change
        number = self.display.lstrip(":")
        if desktop is not None and any(c in str(self.root) for c in ":,\\="):
            raise EnvError(f"sandbox: the desktop's directory {self.root} has a character overlayfs reads as a "
                           f"separator: a checkpointable desktop cannot be made there (set TMPDIR)")
        if desktop is None:
            (self.tmp / ".X11-unix" / f"X{number}").touch()  # the mount point of the display's socket
        join_ipc = self._join_ipc(ipc_of)
        # With the desktop inside, the init leads a session of its own (a tree whose session leader is outside
        # its pid namespace cannot be checkpointed), and there is no cgroup namespace: the X server and window
        # manager leave the task's group (whose limits are the task's), and CRIU cannot dump a process in a
        # group above its cgroup namespace's root.
        argv = [*join_ipc, "unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
                "--mount-proc", "--uts", *([] if desktop else ["--cgroup"]), *([] if join_ipc else ["--ipc"]),
                *([] if network else ["--net"]), "--", *(["setsid"] if desktop else []),
                "/bin/sh", "-c", _INIT, "retrace-sandbox", str(self.root), number,
                "" if network else "isolated", shutil.which("tini") or "", str(desktop or ""), WM_HOME, *self.hide]
        with open(self.root / "logs" / "sandbox.log", "ab") as log:
            # stdout is the readiness channel: the init says "ready" once every mount is in place
            self._unshare = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                             preexec_fn=self._preexec)
        assert self._unshare.stdout is not None
        with self._unshare.stdout:
            ready = _read_line(self._unshare.stdout.fileno(), timeout=15.0)
        if ready != "ready":
            self.kill()
            tail = (self.root / "logs" / "sandbox.log").read_bytes()[-600:].decode(errors="replace").strip()
            raise EnvError(f"sandbox did not start ({ready or 'no answer'}): {tail}")
        self.init_pid = _child_of(self._unshare.pid)
        info = os.stat(f"/proc/{self.init_pid}/ns/pid")
        self._ns = (info.st_dev, info.st_ino)
        (self.root / "task.pid").write_text(f"{self.init_pid}\n")

    @staticmethod
    def _join_ipc(pid: int | None) -> list[str]:
        """The nsenter prefix that puts the task's namespaces into the IPC namespace of process `pid`."""
        if pid is None:
            return []
        try:
            theirs = os.stat(f"/proc/{pid}/ns/ipc")
        except OSError:
            raise EnvError(f"sandbox: the X server (pid {pid}) is gone; its IPC namespace cannot be joined") from None
        ours = os.stat("/proc/self/ns/ipc")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            # joining it would hand the task the host's SysV IPC, and every other desktop's
            raise EnvError(f"sandbox: the X server (pid {pid}) runs in the harness's own IPC namespace; "
                           f"start it with sandbox.x_server_argv()")
        return ["nsenter", f"--ipc=/proc/{pid}/ns/ipc", "--"]

    def _write_accounts(self) -> None:
        etc = self.root / "etc"
        etc.mkdir(exist_ok=True)
        passwd = Path("/etc/passwd").read_text()
        group = Path("/etc/group").read_text()
        (etc / "passwd").write_text(passwd.rstrip("\n") + f"\n{GUEST_USER}:x:{self.uid}:{self.gid}::{GUEST_HOME}:/bin/bash\n")
        (etc / "group").write_text(group.rstrip("\n") + f"\n{GUEST_USER}:x:{self.gid}:\n")

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` as part of the current task, in its home, with its environment."""
        if self.enabled and self.init_pid is None:
            raise EnvError("sandbox: no task is running (reset first)")
        return [*self._prefix(str(self.init_pid)), *argv]

    def _prefix(self, target: str | None, accessibility: bool | None = None) -> list[str]:
        """`target`: the pid of the task's init to enter, or None from inside the task's namespaces already."""
        env = ["env", "-i", *(f"{k}={v}" for k, v in self.env(accessibility).items())]
        if not self.enabled:
            return env
        # the home is entered by env -C, inside the namespace: nsenter's --wd=DIR opens DIR *before* it enters
        # the mount namespace, so it failed where the machine has no /home/user and, where it has one, left
        # the app's working directory on the machine's /home/user instead of the task's home
        enter = [] if target is None else ["nsenter", "--target", target, "--pid", "--mount", "--net", "--ipc",
                                           "--uts", "--cgroup", "--"]
        return [*enter, "prlimit", f"--nproc={NPROC_LIMIT}", f"--fsize={FSIZE_LIMIT}", "--",
                "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--", env[0], env[1], "-C", GUEST_HOME, *env[2:]]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """A task process: in the task's group, dying with the worker (as _preexec, without forking the worker)."""
        proc = subprocess.Popen(dying_with_parent(self.group.joining(self.argv(argv))), cwd=self.home, **kwargs)
        self._children.append(proc)
        return proc

    def write_launcher(self, path: Path, log: Path, in_task: bool = False) -> None:
        """A script the window manager's menu runs: it starts an app inside whichever task is current. With
        `in_task` the window manager runs in the task's namespaces itself (xserver.py), and the script, beside
        it in its home, reads the task's flags there."""
        # an app opened from the menu gets the current task's environment (task.a11y: start())
        if in_task:
            head, flag = "#!/bin/sh\n", '"$(dirname "$0")/../task.a11y"'
            on, off = (shlex.join(self._prefix(None, a11y)) for a11y in (True, False))
            self.flag_files.append(path.parent.parent / "task.a11y")
        else:
            pid_file = shlex.quote(str(self.root / "task.pid"))
            head, flag = f"#!/bin/sh\npid=$(cat {pid_file} 2>/dev/null) || exit 1\n", shlex.quote(str(self.root / "task.a11y"))
            on, off = (shlex.join(self._prefix("TASKPID", a11y)).replace("TASKPID", '"$pid"') for a11y in (True, False))
        join = "".join(f"echo $$ >{shlex.quote(f)} || exit 1\n" for f in self.group.join_files)
        out = f'"$@" >>{shlex.quote(str(log))} 2>&1'
        path.write_text(f"{head}{join}if [ -s {flag} ]; then exec {on} {out}; fi\nexec {off} {out}\n")
        path.chmod(0o755)

    def kill(self, timeout: float = 10.0) -> None:
        """End every process of the task: the kernel kills the namespace's members when its init dies."""
        (self.root / "task.pid").unlink(missing_ok=True)
        self.commands.stop()
        if not self.enabled:
            self._kill_tagged(timeout)
        elif self._unshare is not None:
            if self.init_pid is not None:
                try:
                    os.kill(self.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                self._unshare.kill()
            try:
                # unshare waits for its child, and the init exits only once every member has been reaped
                self._unshare.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise EnvError(f"sandbox: the task's namespace did not end within {timeout} s") from None
        deadline = time.monotonic() + timeout
        for proc in self._children:  # nsenter exits as soon as the process it entered is gone
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise EnvError(f"sandbox: process {proc.pid} outlived its task") from None
        self._children.clear()
        self._unshare = None
        self.init_pid = None
        self._ns = None

    def close(self) -> None:
        self.kill()
        self.group.remove()

    def _kill_tagged(self, timeout: float) -> None:
        """Without namespaces, the task's processes are found by the tag in their environment (best effort:
        a process that clears its environment escapes; this mode is for development, not measurement)."""
        from pytest_retrace.envs.procfs import tagged_pids

        deadline = time.monotonic() + timeout
        while pids := tagged_pids(f"RETRACE_TASK={self.root}".encode() + b"\0"):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for proc in self._children:
                proc.poll()
            if time.monotonic() > deadline:
                raise EnvError(f"processes {pids} survived SIGKILL for {timeout} s")
            time.sleep(0.005)

    def adopt(self, keeper: subprocess.Popen[bytes], init_pid: int) -> None:
        """Make a restored tree (checkpoint.py) the current task: `keeper` is the process whose end ends it
        (CRIU, the tree's parent, as unshare is for a started one), `init_pid` its init."""
        self._unshare, self.init_pid = keeper, init_pid
        info = os.stat(f"/proc/{init_pid}/ns/pid")
        self._ns = (info.st_dev, info.st_ino)
        (self.root / "task.pid").write_text(f"{init_pid}\n")

    def pids(self, with_root: bool = False) -> list[int]:
        """Every live process the current task started (the members of its PID namespace but its own init
        and the init's keeper, root's ``sleep``), as the host numbers them."""
        if not self.enabled:
            from pytest_retrace.envs.procfs import tagged_pids

            return tagged_pids(f"RETRACE_TASK={self.root}".encode() + b"\0")
        if self._ns is None:
            return []
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in (self.init_pid, self.commands.runner_pid):
                continue  # the init, and the harness's command runner
            try:  # every desktop's processes are in /proc: the namespace first, the status of ours only
                info = os.stat(f"/proc/{entry.name}/ns/pid")
                if (info.st_dev, info.st_ino) != self._ns:
                    continue
                status = Path(f"/proc/{entry.name}/status").read_text()
            except OSError:
                continue  # exited meanwhile
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (not with_root and fields.get("Uid", "").split()[:1] == ["0"]
                    and fields.get("PPid", "").strip() == str(self.init_pid)):
                continue  # the keeper, and in the in-task layout the X server and window manager (xserver.py)
            found.append(int(entry.name))
        return found


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    buf = b""
    os.set_blocking(fd, False)
    while not buf.endswith(b"\n") and time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 64)
        except BlockingIOError:
            time.sleep(0.002)
            continue
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def _child_of(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise EnvError(f"sandbox: unshare has children {children}, expected its one init")
    return int(children[0])
