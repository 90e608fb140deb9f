"""The task's command runner: the process inside a task's sandbox that starts the harness's commands there.

Run as ``python3 -I -S -c SOURCE FD`` by runner.py through the sandbox's own chain (join the task's group,
nsenter, prlimit, setpriv, env), so it is already the task's user, in its namespaces, group and limits, with its
environment and home; a command it starts inherits exactly those, at the cost of one vfork and exec instead of the
chain's six execs. The standard library only: the virtualenv is hidden in the task.

FD is a socket to the worker. A request is a JSON list (the command's argv) sent with three file descriptors (its
stdin, stdout, stderr); the answer is ``started`` once it runs, then ``exit N`` (N as subprocess reports it:
negative for a signal). ``kill`` (a line) while it runs ends its process group; one that crossed the command's
exit is ignored. The socket's end ends this process, and the command's group with it.

The task's own processes run as the same user and could signal this one (the worker then falls back to the chain)
but not read or steer it: it makes itself non-dumpable, which denies their ptrace and its /proc files.
"""

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys

PR_SET_DUMPABLE, PR_SET_NAME = 4, 15


def environment() -> dict[str, str]:
    """The environment this process was started with: os.environ is not quite it (Python's locale coercion
    adds LC_CTYPE where the locale is C)."""
    with open("/proc/self/environ", "rb") as fh:
        pairs = [entry.decode().split("=", 1) for entry in fh.read().split(b"\0") if b"=" in entry]
    return dict(pairs)


def spawn(argv: list[str], fds: list[int], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start `argv` in a process group of its own with `fds` as its standard streams. In this process's session,
    as a command the chain starts is in nsenter's: a session begun outside the task's pid namespace, which a
    process of the task sees as session 0 (a `process` probe leaves out the processes of the probe's session).
    subprocess, not os.posix_spawn: glibc's leaves its internal signals (32, 33) ignored in the command; and
    subprocess gives a command the SIGPIPE and SIGXFSZ that Python ignores for itself back."""
    return subprocess.Popen(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], env=env, process_group=0)


def wait(sock: socket.socket, proc: subprocess.Popen[bytes]) -> int:
    """The exit status of `proc`, ending its group on ``kill`` or when the worker is gone."""
    pid = proc.pid
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, sock], [], [])
            if sock in ready:
                said = sock.recv(64)  # "kill\n", or b"": the worker is gone
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if not said:
                    proc.wait()
                    raise SystemExit(0)
            if pidfd in ready:
                return proc.wait()
    finally:
        os.close(pidfd)


def main() -> None:
    if sys.version_info < (3, 11):
        raise SystemExit("retrace-run: needs Python 3.11 (subprocess's process_group)")  # the worker uses the chain
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    env = environment()  # first: a non-dumpable process cannot read its own /proc files
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_DUMPABLE, 0)
    libc.prctl(PR_SET_NAME, b"retrace-run")
    sock.sendall(b"ready\n")
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not message:
            return
        while message.startswith(b"kill\n"):  # a kill that crossed its command's exit: nothing to end
            message = message[5:]
        if not message and not fds:
            continue
        for fd in fds:  # the command gets them as 0, 1 and 2 only
            os.set_inheritable(fd, False)
        try:
            argv = json.loads(message)
            if len(fds) != 3 or not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("a request is an argv and three file descriptors")
            proc = spawn(argv, fds, env)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            sock.sendall(f"error {type(exc).__name__}: {exc}\n".encode())
            continue
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(b"started\n")
        sock.sendall(f"exit {wait(sock, proc)}\n".encode())


if __name__ == "__main__":
    main()
