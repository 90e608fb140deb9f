"""The worker's end of the task's command runner (runner_guest.py), and the one way a command runs in a task.

A command started through the sandbox's chain (setpriv, a shell joining the task's group, nsenter, prlimit,
setpriv, env) costs about 10 ms of CPU before it runs (benchmarks/bench_spawn.py), and a test runs a dozen: the
runner pays the chain once per task and starts each command with one vfork and exec. Whatever goes wrong with it
(no python3 on the machine, the task's processes killing or stopping it: they run as the same user) sends the
command through the chain instead, as it ran before, so the runner changes the cost of a command, never its result.
Only one thing it cannot undo: a command that started and whose runner ended before it did has an unknown exit
status, which is the task's doing (nothing but the task's own processes can end the runner): code 125.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

PYTHON = "/usr/bin/python3"  # the machine's: the task cannot see the virtualenv
SOURCE = Path(__file__).with_name("runner_guest.py").read_text()
ANSWER = 10.0  # seconds for the runner to start, to start a command, to end one it was told to kill
LOST = 125  # the exit status of a command whose runner ended while it ran


class Gone(Exception):
    """The runner cannot run this command, and did not start it: the chain runs it."""


class Lost(Exception):
    """The runner ended after it started the command."""


class Runner:
    """One task's runner: started by :meth:`start`, ended with the task (its namespace) or by :meth:`close`."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, pid: int) -> None:
        self.proc, self.sock, self.pid = proc, sock, pid  # pid: the runner's, as the host numbers it
        self._buffer = b""

    @classmethod
    def start(cls, popen: Any, log: IO[bytes]) -> Runner | None:
        """A runner for the current task (`popen`: the sandbox's), or None where none starts."""
        if not os.access(PYTHON, os.X_OK):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = popen([PYTHON, "-I", "-S", "-c", SOURCE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        finally:
            theirs.close()
        runner = cls(proc, ours, 0)
        try:
            if runner._line(time.monotonic() + ANSWER, eof=Gone) != "ready":
                raise Gone
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            runner.pid = int(children[0])  # nsenter's one child (it enters the pid namespace by forking)
        except (Gone, Lost, OSError, IndexError):
            runner.close()
            return None
        return runner

    def call(self, argv: list[str], stdin: int, stdout: int, stderr: int, timeout: float) -> int | None:
        """Run `argv` in a process group of its own: its exit status, None once killed after `timeout` seconds.
        Raises Gone (nothing was started) or Lost (it was, and the runner ended)."""
        deadline = time.monotonic() + timeout
        try:
            socket.send_fds(self.sock, [json.dumps(argv).encode()], [stdin, stdout, stderr])
            said = self._line(time.monotonic() + ANSWER)
        except (OSError, Gone):
            if self._end() == "started":  # it had started the command, and sent so, before it ended
                raise Lost from None
            raise Gone from None
        if said != "started":
            raise Gone  # it could not start it ("error ..."): the chain says why
        try:
            return self._exit(deadline)
        except Gone:
            pass
        try:  # its time is up: the runner ends the command's group
            self.sock.sendall(b"kill\n")
            self._exit(time.monotonic() + ANSWER)
        except (OSError, Gone, Lost):
            self._end()
        return None

    def _exit(self, deadline: float) -> int:
        """The started command's exit status (Gone: not by `deadline`; Lost: the runner ended)."""
        line = self._line(deadline, eof=Lost)
        if not line.startswith("exit "):
            self._end()
            raise Lost
        return int(line[5:])

    def _line(self, deadline: float, eof: type[Exception] = Gone) -> str:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise Gone
            try:
                chunk = self.sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                raise eof
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace")

    def _end(self) -> str:
        """End the runner: the first line it had sent and we had not read ("" if none)."""
        self._kill()
        if self.sock.fileno() >= 0:  # not yet closed
            self.sock.setblocking(False)
            try:
                while chunk := self.sock.recv(4096):
                    self._buffer += chunk
            except OSError:
                pass
            self.sock.close()
        return self._buffer.split(b"\n", 1)[0].decode(errors="replace") if b"\n" in self._buffer else ""

    def _kill(self) -> None:
        # nsenter waits for the runner, its child: while nsenter lives, the runner's pid is not anyone else's
        if self.pid and self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid = 0
        if self.proc.poll() is None:
            self.proc.kill()  # before the runner was known: it ends at the socket's end
        try:
            self.proc.wait(timeout=ANSWER)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """End the runner: its socket's end, and it exits (SIGKILL if it does not within a second)."""
        self.sock.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        self._kill()


class Commands:
    """A task's commands: through its runner where it has one, else through the sandbox's chain (`popen`)."""

    def __init__(self, popen: Any, log: Path, runner: bool = True) -> None:
        self.popen, self.log, self.enabled = popen, log, runner
        self.runner: Runner | None = None
        self._tried = not runner  # for this task: a runner that failed is not started again
        self._busy = threading.Lock()  # a runner runs one command at a time; another thread's goes by the chain

    @property
    def runner_pid(self) -> int | None:
        return self.runner.pid if self.runner is not None else None

    def call(self, argv: list[str], stdin: int, stdout: int, stderr: int, timeout: float) -> tuple[int | None, str]:
        """Run `argv` as a task process in a process group of its own: (its exit status, None once killed after
        `timeout` seconds; a line for its stderr)."""
        if self._busy.acquire(blocking=False):
            try:
                done = self._through_runner(argv, stdin, stdout, stderr, timeout)
            finally:
                self._busy.release()
            if done is not None:
                return done
        proc = self.popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, ""

    def _through_runner(self, argv: list[str], stdin: int, stdout: int, stderr: int,
                        timeout: float) -> tuple[int | None, str] | None:
        """As call(), through the task's runner; None where it has none (left to the chain)."""
        if self.runner is None and not self._tried:
            self._tried = True
            with open(self.log, "ab") as log:
                self.runner = Runner.start(self.popen, log)
        runner = self.runner  # stop() may end it meanwhile, from the thread that resets the task
        if runner is None:
            return None
        try:
            return runner.call(argv, stdin, stdout, stderr, timeout), ""
        except Lost:
            runner.close()
            self.runner = None
            return LOST, "\nretrace: the task's command runner ended while the command ran"
        except Gone:
            runner.close()
            self.runner = None  # the chain for the rest of this task
            return None

    def stop(self) -> None:
        """End the runner (with its task, or for a checkpoint, which cannot take its socket to the worker); the
        next command starts another."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        self._tried = not self.enabled
