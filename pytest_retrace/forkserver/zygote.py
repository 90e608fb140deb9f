"""The fork server: one process that imports the workers' heavy modules once and forks an xdist worker per request.

Run by path (``python zygote.py SOCKET MODULE...``), so that it imports ``pytest_retrace`` only as it preloads it:
pytest warns in every worker that it cannot rewrite the asserts of a module of a distribution with a ``pytest11``
entry point imported before it started, so those are never preloaded (:func:`rewritable`), except this plugin's
own short of its test functions (:func:`preload`).

A request (client.py) carries the caller's stdin, stdout and stderr (SCM_RIGHTS), its argv, cwd and environment.
The forked child becomes that process (``python -u -c CODE``, as execnet starts a worker) and returns out of
:func:`serve` to run the code at the top level, so the interpreter ends it as it ends any ``python -c``: atexit
handlers, non-daemon threads and its exit status. This process answers ``pid N``, later ``exit N``; it kills a
child whose client went away (xdist kills the client to kill a worker) and every child when the controller closes
its stdin or dies. The child ends as the interpreter would, short of tearing its heap down (:func:`run`).
"""

from __future__ import annotations

import array
import atexit
import gc
import importlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import types
from importlib import metadata

MAX_REQUEST = 4 << 20  # bytes: an environment of a few hundred variables is far below


# This plugin's package may be preloaded, but never the modules whose asserts a user reads, which pytest must
# rewrite: the test functions (their `assert result == recovered` calls pytest_assertrepr_compare) and the helpers
# of the project's own tests. Collection imports plugin/suite.py itself; preload() checks that nothing else did.
OWN = "pytest_retrace"
REWRITTEN = ("pytest_retrace.plugin.suite", "pytest_retrace.testing")


def rewritable() -> set[str]:
    """Top-level modules of every distribution with a pytest11 entry point: pytest marks them for assertion
    rewriting when it starts and warns about each one imported before."""
    names: set[str] = set()
    for dist in metadata.distributions():
        if not any(ep.group == "pytest11" for ep in dist.entry_points):
            continue
        for f in dist.files or ():
            top = f.parts[0]
            if top.endswith(".py"):
                names.add(top[:-3])
            elif "." not in top and f.suffix in (".py", ".so"):
                names.add(top)
    return names


def preload(modules: list[str]) -> list[str]:
    """Import what may be imported; returns what was. A module that fails is left to the worker, which reports it.

    A module of a plugin's distribution is not imported (pytest must rewrite its asserts), except this plugin's
    own (:data:`OWN`, short of :data:`REWRITTEN`): its asserts are invariants no user reads. One a preloaded
    module imports (the SDKs import anyio, whose distribution has a pytest11 entry point) is not rewritten either,
    as it would not be had the worker imported it before pytest; each such module's docstring then carries
    pytest's own marker for a module not to rewrite, PYTEST_DONT_REWRITE, which is all pytest's warning about an
    already imported module checks (for the names it marks: a distribution's top level, or a ``-p`` module)."""
    skip = rewritable()
    before = set(sys.modules)
    done = []
    for name in modules:
        top = name.partition(".")[0]
        if (top in skip and top != OWN) or name.startswith(REWRITTEN):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the worker imports it again and shows the error where it matters
            continue
        done.append(name)
    dragged = [name for name in REWRITTEN if name in sys.modules and name not in before]
    if dragged:  # a preloaded module imports one at its top: it would run unrewritten in every worker
        raise RuntimeError(f"preloading {done} imported {dragged}, whose asserts pytest must rewrite")
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if module is not None and name.partition(".")[0] in skip:
            module.__doc__ = f"{module.__doc__ or ''}\n\nPYTEST_DONT_REWRITE: imported by pytest-retrace's fork server"
    return done


def warm() -> None:
    """Work every worker would do again, done once before the forks. inspect's map of module files: pytest's
    traceback of a failed test scans every loaded module's path once per process (0.18 CPU-s with the SDKs
    loaded). And the garbage collector's view of the preloaded heap, frozen (gc.freeze, as Python's docs advise
    before a fork): a child's collections skip it, where a full one took 0.12-0.16 CPU-s and pytest makes
    several at its end (looking for unraisable exceptions), besides those its allocations trigger."""
    import inspect

    inspect.getmodule(compile("", "<retrace fork server>", "exec"))
    gc.freeze()


class Request:
    def __init__(self, conn: socket.socket, fds: list[int], body: dict) -> None:
        self.conn, self.fds = conn, fds
        self.args: list[str] = body["args"]
        self.cwd: str = body["cwd"]
        self.env: dict[str, str] = body["env"]

    def code(self) -> tuple[str, bool] | None:
        """(code, dont_write_bytecode) of ``[-u] [-B] -c CODE``, the only command line served; else None."""
        args, bytecode = list(self.args), False
        while args and args[0] in ("-u", "-B"):
            bytecode |= args.pop(0) == "-B"
        if len(args) == 2 and args[0] == "-c":
            return args[1], bytecode
        return None


def receive(conn: socket.socket) -> Request | None:
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if len(data) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size <= MAX_REQUEST:
        chunk = conn.recv(size - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) != size:
        for fd in fds:
            os.close(fd)
        return None
    return Request(conn, list(fds), json.loads(body))


def serve(listener: socket.socket) -> Request:
    """Answer requests until stdin closes; returns only in a forked child, with the request it is to become."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "lifeline")
    children: dict[int, socket.socket] = {}  # pid -> its client's connection
    while True:
        for key, _ in sel.select(timeout=0.1):
            if key.data == "lifeline":
                if not os.read(sys.stdin.fileno(), 4096):
                    _end(children)
            elif key.data == "accept":
                conn, _ = listener.accept()
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                request = receive(conn) if uid == os.getuid() else None
                if request is None or request.code() is None:
                    for fd in request.fds if request is not None else ():
                        os.close(fd)  # the caller's pipes: held here, its reader would never see their end
                    conn.sendall(b"exec\n")  # the client starts the interpreter itself
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    return request
                for fd in request.fds:
                    os.close(fd)
                conn.sendall(f"pid {pid}\n".encode())
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a client's connection: it only ever closes (xdist killed it): kill its worker
                if not key.fileobj.recv(1):  # type: ignore[union-attr]
                    _kill(key.data)
        _reap(children, sel)


def _reap(children: dict[int, socket.socket], sel: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            sel.unregister(conn)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                conn.sendall(f"exit {code}\n".encode())
            except OSError:
                pass
            conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _end(children: dict[int, socket.socket]) -> None:
    for pid in children:
        _kill(pid)
    os._exit(0)


def become(request: Request) -> str:
    """In the child: the client's stdio, directory, environment and arguments, as ``python -u -c CODE`` has them."""
    code, bytecode = request.code()  # type: ignore[misc]
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
    for fd in request.fds:
        if fd > 2:
            os.close(fd)
    request.conn.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it; a worker is interrupted
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    sys.dont_write_bytecode = bytecode or sys.dont_write_bytecode
    sys.argv = ["-c"]
    sys.path[0] = ""  # python -c's first entry (this file's directory was)
    encoding = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = open(0, encoding=encoding, closefd=False)  # noqa: SIM115 - the process's stdin
    for name, fd in (("stdout", 1), ("stderr", 2)):  # -u: unbuffered, as execnet asks
        stream = io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), encoding=encoding,  # noqa: SIM115
                                  errors="backslashreplace" if fd == 2 else "strict", write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    return code


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the workers (same process group)
    path, modules = sys.argv[1], sys.argv[2:]
    sys.path[0] = ""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(256)  # workers that ask while the modules load wait in the backlog
    print("listening", flush=True)
    preload(modules)
    warm()
    request = serve(listener)
    run(become(request))


def run(code: str) -> None:
    """Run ``python -c CODE`` and end as the interpreter ends it (its exit status, an uncaught exception's
    traceback, non-daemon threads joined, atexit handlers, the standard streams flushed), but with os._exit
    instead of the interpreter's teardown: freeing every object of a heap this process shares with the
    server touches (copies) its pages, 0.2-0.3 CPU-s per worker, 16 workers at once when xdist ends them
    (as multiprocessing's forked children end for the same reason)."""
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), sys.modules["__main__"].__dict__)  # noqa: S102 - execnet's own bootstrap line, sent by its caller
    except SystemExit as exc:
        status = _status_of(exc)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter would print and exit with
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step: join non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if status < 0:  # ended by Ctrl-C, as an interpreter with an uncaught KeyboardInterrupt ends
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def _status_of(exc: SystemExit) -> int:
    """The status the interpreter exits with for an uncaught SystemExit (a non-int code is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
