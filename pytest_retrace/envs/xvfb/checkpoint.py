"""Checkpoints of a whole xvfb desktop with CRIU: ``--retrace-restore=checkpoint`` (docs/checkpoints.md).

A case's error state is reached by replaying its ground-truth prefix and perturbation, and that costs more the
longer the prefix. With checkpoints, the first test of a case on a desktop replays as always; once s_error is
verified, the desktop's whole process tree (X server, window manager, every app, in the task's namespaces) is
dumped with CRIU and the task's files (its home and /tmp) are copied, and that test goes on from its own desktop;
every later test of the case on that desktop restores the tree instead of replaying, and the restored screen and
probes are checked as a replayed one.

What it takes, each found by measurement (benchmarks/bench_restore.py):
- **One tree.** CRIU dumps a process and its descendants. The desktop is built in the in-task layout
  (xserver.py): the sandbox's init starts the X server and window manager, and an app started by a setup
  step is handed to the init before a dump (its launcher, a shell inside the task, is ended: the app's new
  parent is the init). A process started from outside that is still running, or in a session led from
  outside, cannot be dumped: the test replays, with that reason.
- **No connection from outside.** The harness's X connections are closed around a dump ("External socket is
  used" otherwise) and opened again after it.
- **Files are not processes.** CRIU restores what processes hold, not what is on disk, and refuses a file whose
  size changed since the dump: the task's home and /tmp are copied by CRIU's post-dump action, while the dumped
  tree is still stopped (nothing writes in between), and put back before every restore.
- **A recent CRIU.** Debian 12's criu 3.17 fails on kernels from 6.13 ("Unexpected rt vDSO area bounds"); 4.1
  works. Found as ``$RETRACE_CRIU`` (a command), a Debian trixie root holding criu (``$RETRACE_CRIU_ROOT``, by
  default the checkout's ``.tools/criu-root``, which scripts/bootstrap builds with mmdebstrap) run through its
  own loader, or ``criu`` on the PATH; ``criu check`` must pass.
- **No pid namespace of an app's own.** CRIU cannot dump nested pid namespaces, and chromium's sandbox puts
  its renderers in one: on a checkpointable desktop ``chromium`` (the task's /usr/local/bin) runs Debian's with
  ``--no-sandbox`` (its renderers then run as the task's user in the task's namespaces, which stay the boundary)
  and ``--test-type``, without which it draws a warning bar about that flag; and with ``--no-zygote
  --in-process-gpu`` (which need no sandbox): two zygotes and the GPU process fewer to dump and restore, a
  dump 250 -> 201 MB, the 40 browser cases x 3 baselines at -n 16 with checkpoints 2607-2700 -> 2462
  test-seconds. Measured: the same pixels on the built-in browser cases, whose replayed states are checked
  against the recorded screens as always (120 of 120 restored, every verdict as recorded).
- Where root lacks CAP_SYS_RESOURCE (some container hosts), CRIU cannot read the limits of processes of
  another user, and on kernels from 6.16 CRIU 4.1 cannot read two options of a TCP socket: criu_preload.c,
  compiled here, answers both refusals (it says how).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_retrace import cachedir
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import GUEST_PROGRAMS
from pytest_retrace.envs.xvfb.sandbox import available
from pytest_retrace.envs.xvfb.tree import hand_to_init, root_processes
from pytest_retrace.screen.frames import Rect

MAX_KEPT = 4  # checkpoints kept per desktop, least recently used dropped: each is 30-260 MB of images
MIN_VERSION = (4, 1)
_CAP_SYS_RESOURCE = 24
_CHECKOUT = Path(__file__).resolve().parents[3]
# both at the dump and at every restore: LibreOffice and chromium hold file locks
_OPTIONS = ("--file-locks",)
# Files deleted while open are kept in the images up to this size ("ghost files"; CRIU's default is 1 MB):
# chromium keeps its 4 MB BrowserMetrics file open after deleting it. Larger ones fail the dump, and replay.
_DUMP_OPTIONS = ("--ghost-limit", str(64 << 20))
# The task's programs on a checkpointable desktop (the sandbox's /usr/local/bin, before /usr/bin on its PATH):
# the desktop's own, and chromium without the pid namespaces of its sandbox (see the docstring).
PROGRAMS = {**GUEST_PROGRAMS,
            "chromium": "#!/bin/sh\n# pytest-retrace: chromium, checkpointable (envs/xvfb/checkpoint.py)\n"
                        'exec /usr/bin/chromium --no-sandbox --test-type --no-zygote --in-process-gpu "$@"\n'}


def _has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


class Criu:
    """How to run CRIU here: its command line and environment."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env

    @classmethod
    def find(cls, work: Path) -> Criu:
        """A working CRIU, or EnvError saying why there is none (`work`: where to build the preload)."""
        argv = cls._command()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
        if needs := _preload_needed():
            env["LD_PRELOAD"] = str(_build_preload(work, needs))
        criu = cls(argv, env)
        try:
            out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=30, env=env,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvError(f"criu ({argv[-1]}) does not run: {exc}") from None
        found = re.search(r"Version:\s*(\d+)\.(\d+)", out.stdout)
        if found is None or (int(found[1]), int(found[2])) < MIN_VERSION:
            raise EnvError(f"criu {found[0] if found else '(no version)'} at {argv[-1]}: version "
                           f"{'.'.join(map(str, MIN_VERSION))} or newer is needed (older ones fail on kernels "
                           f"from 6.13); scripts/bootstrap builds one in .tools/criu-root")
        ok, errors = criu.run(["check"], timeout=60)
        if not ok:
            raise EnvError(f"criu check failed: {errors}")
        return criu

    @staticmethod
    def _command() -> list[str]:
        if command := os.environ.get("RETRACE_CRIU"):
            return [command]
        root = Path(os.environ.get("RETRACE_CRIU_ROOT") or _CHECKOUT / ".tools" / "criu-root")
        if (root / "usr/sbin/criu").exists():
            libs = f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"
            return [f"{root}/lib64/ld-linux-x86-64.so.2", "--library-path", libs, f"{root}/usr/sbin/criu"]
        if found := shutil.which("criu"):
            return [found]
        raise EnvError(f"no criu: none on the PATH and no {root}/usr/sbin/criu (scripts/bootstrap builds one)")

    def run(self, args: list[str], log: Path | None = None, timeout: float = 120) -> tuple[bool, str]:
        """(succeeded, its error lines)."""
        logging = ["-o", str(log), "-v2"] if log else []
        try:
            proc = subprocess.run([*self.argv, *args, *logging], capture_output=True, text=True, timeout=timeout,
                                  env=self.env, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return False, f"criu {args[0]} did not finish within {timeout:g} s"
        return proc.returncode == 0, errors(proc.stdout + proc.stderr + _read(log))

    def dump(self, pid: int, images: Path, log: Path, copies: Sequence[tuple[Path, Path]]) -> tuple[bool, str]:
        """Dump the tree of `pid` into `images` and leave it running; each (source, target) of `copies` is
        copied (``cp -a``) while the tree is still stopped for the dump, so the files are those of the dumped
        processes. CRIU runs its action script at ``post-dump``, after the images are written and before it
        lets the tree go on (a script that fails lets it go on too, and fails the dump)."""
        script = log.with_name("post-dump.sh")
        copy = " && ".join(shlex.join(copy_argv(a, b)) for a, b in copies)
        script.write_text(f'#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" != post-dump ] || {{ {copy}; }}\n')
        script.chmod(0o700)
        return self.run(["dump", "-t", str(pid), "-D", str(images), "--leave-running", "--action-script",
                         str(script), *_OPTIONS, *_DUMP_OPTIONS], log=log)

    def restore(self, images: Path, pidfile: Path, log: Path, preexec: Any) -> subprocess.Popen[bytes]:
        """CRIU restoring `images`, in the foreground: it stays the tree's parent until the tree ends, so the
        tree ends with the worker as a started one does (the init's parent-death signal is CRIU's)."""
        with open(log.with_suffix(".out"), "wb") as out:  # what CRIU says before its log is open
            return subprocess.Popen([*self.argv, "restore", "-D", str(images), "--pidfile", str(pidfile),
                                     "--root", "/", "--manage-cgroups=ignore", *_OPTIONS, "-o", str(log), "-v2"],
                                    env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    preexec_fn=preexec, cwd="/")


def errors(text: str) -> str:
    """CRIU's error lines (the last few): what a record's reason shows."""
    # criu 4.1 logs "Can't setup RLIMIT_NOFILE for self" as an error where it may not raise its own limit:
    # harmless; and "Address already assigned" as it restores the loopback address of a task's network
    lines = [line.strip() for line in text.splitlines() if "Error" in line and "RLIMIT_NOFILE" not in line
             and "already assigned" not in line]
    return "; ".join(lines[-4:]) or text.strip()[-400:]


def _read(path: Path | None) -> str:
    try:
        return path.read_text(errors="replace") if path else ""
    except OSError:
        return ""


def _preload_needed() -> str | None:
    """Why CRIU needs criu_preload.c here (its comment says what it answers), or None."""
    needs = []
    if not _has_capability(_CAP_SYS_RESOURCE):
        needs.append("root here lacks CAP_SYS_RESOURCE")
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if release and (int(release[1]), int(release[2])) >= (6, 16):
        needs.append(f"kernel {os.uname().release} refuses CRIU 4.1's reads of a TCP socket's SO_PASSCRED")
    return " and ".join(needs) or None


def _build_preload(work: Path, needs: str) -> Path:
    """criu_preload.so, built once per version of its source: kept in the user's private cache (every worker
    built its own before, a compiler run each), else in `work`."""
    source = Path(__file__).with_name("criu_preload.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = (cachedir.private_dir("criu") or work) / f"criu_preload-{digest}.so"
    if not target.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise EnvError(f"{needs}, so criu needs criu_preload.c built, and there is no C compiler (install gcc)")
        partial = target.with_name(f".{target.name}.{os.getpid()}")  # workers build at once: each its own file
        proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(source), "-ldl"],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            raise EnvError(f"building {source.name} failed: {proc.stderr.strip()[-400:]}")
        os.replace(partial, target)
    return target


@dataclass
class Checkpoint:
    """One case's dumped desktop: CRIU's images and the task's files, and what the caller keeps with it."""

    key: str
    dir: Path
    payload: Any  # the replay layer's (the prefix's screenshots, for strategies that show them)
    task: Any  # the task's setup (TaskSetup): a restore takes its settling rules
    restores: int = 0  # so far: each names its own pid file

    @property
    def images(self) -> Path:
        return self.dir / "images"

    @property
    def files(self) -> Path:
        return self.dir / "files"


class Checkpoints:
    """A desktop's checkpoints, by key, the last MAX_KEPT used."""

    def __init__(self) -> None:
        self.criu: Criu | None = None  # set by enable(): checkpoints are on
        self._kept: OrderedDict[str, Checkpoint] = OrderedDict()
        self._dir: Path | None = None

    def enable(self) -> None:
        """Find CRIU (EnvError if there is none that works); the images go in a private directory until close()."""
        self._dir = Path(tempfile.mkdtemp(prefix="retrace-checkpoints-"))  # mode 0700
        try:
            self.criu = Criu.find(self._dir)
        except EnvError:
            self.close()
            raise

    def new_dir(self) -> Path:
        assert self._dir is not None
        return Path(tempfile.mkdtemp(dir=self._dir))

    def get(self, key: str) -> Checkpoint | None:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def add(self, checkpoint: Checkpoint) -> None:
        self.drop(checkpoint.key)
        self._kept[checkpoint.key] = checkpoint
        while len(self._kept) > MAX_KEPT:
            self.drop(next(iter(self._kept)))

    def drop(self, key: str) -> None:
        old = self._kept.pop(key, None)
        if old is not None:
            shutil.rmtree(old.dir, ignore_errors=True)

    def close(self) -> None:
        for key in list(self._kept):
            self.drop(key)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def copy_argv(source: Path, target: Path) -> list[str]:
    """How a tree is copied with its owners, modes and special files (`cp -a`: the task's files are its user's)."""
    return ["cp", "-a", "--", str(source), str(target)]


def copy_tree(source: Path, target: Path) -> None:
    proc = subprocess.run(copy_argv(source, target), capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise EnvError(f"copying {source} failed: {proc.stderr.strip()[-300:]}")


def remove_sockets(tree: Path) -> None:
    """A copied tree's unix socket files: CRIU binds each listening socket to its path again on restore."""
    for dirpath, _dirs, names in os.walk(tree):
        for name in names:
            path = Path(dirpath) / name
            if path.is_socket():
                path.unlink()


def wait_pidfile(proc: subprocess.Popen[bytes], pidfile: Path, timeout: float) -> int | None:
    """The restored tree's init, once CRIU wrote it; None if CRIU ended first or the time ran out."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while time.monotonic() < deadline:
        try:
            text = pidfile.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit():
            return int(text)
        if proc.poll() is not None:
            return None
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)  # a restore takes 0.3 s alone, seconds under load: 5 ms polls cost CPU
    return None


class CheckpointMethods:
    """XvfbEnvironment's checkpoint methods (kept here, by job): the replay layer calls ``has_checkpoint``,
    ``take_checkpoint``, ``restore_checkpoint`` and ``drop_checkpoint`` (replay/reconstruct.py)."""

    # set by XvfbEnvironment and XDesktop
    checkpoints: Checkpoints
    sandbox: Any
    root: Path | None
    in_task: bool
    _task: Any
    _relays: Any

    def enable_checkpoints(self) -> None:
        """Before start(): build every desktop in the in-task layout and take checkpoints (checkpoint.py); an
        EnvError says why they cannot be had here."""
        if self.root is not None:
            raise EnvError("enable_checkpoints() after start()")
        if (why := available()) is not None:
            raise EnvError(f"checkpoints need the task sandbox, and {why}")
        self.checkpoints.enable()
        self.in_task = True

    def take_checkpoint(self, key: str, payload: object = None) -> str | None:
        """Dump the current task's desktop as `key`'s checkpoint; None once it is taken, else why not. Either way
        the desktop goes on as it was (CRIU stops the tree for the dump only), reconnected."""
        criu = self.checkpoints.criu
        if criu is None or not self.in_task or self.sandbox is None or self.sandbox.init_pid is None:
            return "checkpoints are not enabled on this desktop"
        if self._task is not None and self._task.accessibility:
            return "the task's accessibility buses are started from outside its tree"
        self.sandbox.commands.stop()  # its socket to the worker cannot be dumped
        why = hand_to_init(self.sandbox)
        if why is not None:
            return why
        self._relays.close()
        self._disconnect()
        where = self.checkpoints.new_dir()
        copies = [(tree, where / "files" / tree.name) for tree in (self.sandbox.home, self.sandbox.tmp)]
        for attempt in range(5):
            for path in (where / "images", where / "files"):
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir()
            ok, problem = criu.dump(self.sandbox.init_pid, where / "images", where / "dump.log", copies)
            if ok or "External socket" not in problem:
                break
            time.sleep(0.05 * (attempt + 1))  # the X server has not yet seen our connections close
        self._adopt_desktop()  # the tree runs on, taken or not
        if not ok:
            shutil.rmtree(where, ignore_errors=True)
            return f"criu dump failed: {problem}"
        self.checkpoints.add(Checkpoint(key, where, payload, self._task))
        return None

    def has_checkpoint(self, key: str) -> bool:
        return self.checkpoints.get(key) is not None

    def drop_checkpoint(self, key: str) -> None:
        self.checkpoints.drop(key)

    def restore_checkpoint(self, key: str, masks: Sequence[Rect] = ()) -> tuple[object, str | None]:
        """Replace the desktop by `key`'s checkpoint: (its payload, None), or (None, why not); after a failure
        the desktop is gone and must be reset."""
        found = self.checkpoints.get(key)
        criu = self.checkpoints.criu
        if found is None or criu is None or self.sandbox is None:
            return None, "no checkpoint of this case on this desktop"
        self._relays.close()
        self._disconnect()
        self.sandbox.kill()
        for tree in (self.sandbox.home, self.sandbox.tmp):
            shutil.rmtree(tree, ignore_errors=True)
            copy_tree(found.files / tree.name, tree)
            remove_sockets(tree)
        pidfile = found.dir / f"restored-{found.restores}.pid"
        found.restores += 1
        log = found.dir / "restore.log"
        proc = criu.restore(found.images, pidfile, log, self.sandbox._preexec)
        pid = wait_pidfile(proc, pidfile, timeout=60)
        if pid is None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            said = "".join(f.read_text(errors="replace") for f in (log.with_suffix(".out"), log) if f.exists())
            self.checkpoints.drop(key)
            return None, f"criu restore failed: {errors(said)}"
        self.sandbox.adopt(proc, pid)
        for root_pid, _name in root_processes(self.sandbox):
            self.sandbox.group.leave(root_pid)  # the X server and window manager, out of the task's group as at start
        self._adopt_desktop()
        self.masks = masks
        self._task = found.task  # the checkpointed task's, whatever ran on this desktop last
        self._settle = self.settle_cfg.at_least(found.task.settle_quiet) if found.task else self.settle_cfg
        self.sandbox.accessibility = False  # a task with accessibility is never checkpointed
        return found.payload, None
