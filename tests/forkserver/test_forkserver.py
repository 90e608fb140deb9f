"""The fork server (pytest_retrace/forkserver) as execnet uses it: a client started as ``python -u -c CODE`` that
behaves like that interpreter, on a process forked from a server that imported modules once."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_retrace.forkserver import CLIENT, ForkServer
from pytest_retrace.forkserver.zygote import preload, rewritable


@pytest.fixture
def server() -> Iterator[ForkServer]:
    server = ForkServer(["colorsys", "xdist", "no_such_module_here"])
    server.start()
    yield server
    server.close()


def client(server: ForkServer, code: str, *extra: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*shlex.split(server.python()), "-u", "-c", code, *extra], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_forked_worker_is_the_interpreter_it_replaces(server: ForkServer, tmp_path: Path) -> None:
    code = ("import os, sys; line = sys.stdin.readline(); print(line.strip()[::-1], os.getcwd(), os.environ['ASKED'], "
            "sys.argv, sys.path[0] == '', 'colorsys' in sys.modules, __name__, os.getppid() != PARENT); "
            "print('to stderr', file=sys.stderr); sys.exit(3)").replace("PARENT", str(os.getpid()))
    proc = client(server, code, cwd=tmp_path, env={**os.environ, "ASKED": "yes"})
    out, err = proc.communicate("abc\n", timeout=60)
    assert proc.returncode == 3, err
    assert out.split(" ", 2)[:2] == ["cba", str(tmp_path)]
    assert out.rstrip().endswith("yes ['-c'] True True __main__ True"), out
    assert err == "to stderr\n"


def test_a_forked_worker_inherits_a_frozen_heap_and_inspects_module_files(server: ForkServer) -> None:
    """What the server warmed is not paid again: a collection skips the preloaded heap (gc.freeze) and a
    traceback's source lookup finds the preloaded modules' files already mapped."""
    code = ("import gc, inspect, sys; frozen = gc.get_freeze_count(); "
            "print(frozen > 1000, inspect.modulesbyfile.get(inspect.getabsfile(sys.modules['colorsys'])))")
    out, err = client(server, code).communicate(timeout=60)
    assert out.split() == ["True", "colorsys"], err


def test_a_signal_that_ends_the_worker_ends_the_client_the_same_way(server: ForkServer) -> None:
    proc = client(server, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM


def test_killing_the_client_kills_the_worker_and_closing_the_server_kills_the_rest(server: ForkServer) -> None:
    """xdist ends a worker by killing the process it started (the client); the controller ending closes the server."""
    workers = []
    for _ in range(2):
        proc = client(server, "import os, time; print(os.getpid(), flush=True); time.sleep(120)")
        assert proc.stdout is not None
        workers.append((proc, int(proc.stdout.readline())))
    (first, first_pid), (second, second_pid) = workers
    first.kill()
    first.wait()
    assert gone(first_pid) and not gone(second_pid, timeout=0.5)
    server.close()
    assert gone(second_pid)
    second.wait(timeout=10)


def test_closing_the_server_removes_its_socket_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    server = ForkServer([])
    server.start()
    assert server.socket.exists() and oct(server.socket.parent.stat().st_mode & 0o777) == "0o700"
    server.close()
    assert list(tmp_path.iterdir()) == []


def test_what_the_server_cannot_serve_runs_as_a_plain_interpreter(server: ForkServer, tmp_path: Path) -> None:
    # python -c CODE ARG: not execnet's command line, so the client execs the interpreter itself
    proc = client(server, "import os, sys; print(sys.argv, os.getppid() == PARENT)".replace("PARENT", str(os.getpid())),
                  "extra")
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out.strip()) == (0, "['-c', 'extra'] True"), err
    # no server at all (it ended, or never listened)
    server.close()
    proc = subprocess.run([sys.executable, "-I", "-S", str(CLIENT), str(tmp_path / "none.sock"), "-u", "-c", "print(7)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, "7\n"), proc.stderr


def test_modules_pytest_rewrites_are_never_preloaded() -> None:
    skip = rewritable()
    assert {"pytest_retrace", "xdist"} <= skip and "numpy" not in skip
    assert preload(["xdist", "colorsys", "no_such_module_here"]) == ["colorsys"]


def preloading(code: str) -> str:
    """What ``code`` prints in a new interpreter (nothing imported yet) that has the server's ``preload``."""
    setup = f"import sys; sys.path.insert(0, {str(CLIENT.parent)!r}); from zygote import preload; "
    proc = subprocess.run([sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_plugins_own_modules_are_preloaded_but_never_its_test_functions() -> None:
    """What a worker runs of this plugin is imported once (its asserts are invariants), marked for pytest not to
    warn about, for a ``-p`` module too; the test functions, whose asserts pytest must rewrite, never are."""
    out = preloading("done = preload(['pytest_retrace.plugin', 'pytest_retrace.plugin.suite', 'pytest_retrace.testing']); "
                     "print(done, 'pytest_retrace.plugin.suite' in sys.modules, all('PYTEST_DONT_REWRITE' in "
                     "sys.modules[m].__doc__ for m in ('pytest_retrace', 'pytest_retrace.plugin')))")
    assert out == "['pytest_retrace.plugin'] False True"


def test_every_module_a_worker_is_given_imports_without_its_test_functions() -> None:
    out = preloading("from pytest_retrace.forkserver import modules_for; "
                     "wanted = modules_for(['anthropic', 'openai', 'openai-compat']); done = preload(wanted); "
                     "print(sorted(set(wanted) - set(done)), 'pytest_retrace.plugin.suite' in sys.modules)")
    assert out == "[] False"


def test_a_plugin_module_a_preload_drags_in_is_marked_not_to_rewrite() -> None:
    """The SDKs import anyio, and anyio's distribution is a pytest plugin: pytest warns about a
    module of a plugin's distribution imported before it started, unless the module says PYTEST_DONT_REWRITE."""
    assert preloading("preload(['anthropic']); print('PYTEST_DONT_REWRITE' in sys.modules['anyio'].__doc__)") == "True"


@pytest.mark.parametrize(("ending", "status", "err"), [
    ("", 0, ""),
    ("sys.exit(4)", 4, ""),
    ("sys.exit('bye')", 1, "bye\n"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
])
def test_a_forked_worker_ends_as_the_interpreter_would(server: ForkServer, tmp_path: Path, ending: str, status: int,
                                                       err: str) -> None:
    """It skips only the heap's teardown (a global's __del__ is not called): a non-daemon thread is joined, atexit
    handlers run, buffered output is flushed, and the exit status and an uncaught exception's traceback are the
    interpreter's."""
    done = tmp_path / "done"
    code = ("import atexit, sys, threading, time; "
            "threading.Thread(target=lambda: (time.sleep(0.3), open(DONE, 'w').write('thread'))).start(); "
            "atexit.register(lambda: print('atexit', open(DONE).read())); "
            "sys.stdout = open(1, 'w', buffering=65536, closefd=False); print('buffered'); "
            "kept = type('Kept', (), {'__del__': lambda self: print('teardown', file=sys.stderr)})(); ").replace(
        "DONE", repr(str(done))) + ending
    proc = client(server, code)
    out, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (status, "buffered\natexit thread\n"), stderr
    assert (err in stderr) if err else stderr == "", stderr
