"""Gnumeric's ``ssconvert --recalc``, run on untrusted spreadsheet bytes to compute their formulas.

It runs **on the host that runs the evaluator**, on a temporary copy in a private temp directory, without
network (a network namespace where the host allows one), as an unprivileged user when we are root, under
CPU/memory/file-size limits and a timeout. A conversion that fails or hangs raises :class:`ConversionFailed`,
a failed check (the file is the agent's). Only a host without ``ssconvert`` raises :class:`ToolMissing`,
which is not the agent's fault and propagates as an error of the run.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import tempfile

from pytest_retrace.evaluators.base import CheckFailed, EvaluatorError


class ConversionFailed(CheckFailed):
    """The application's own converter could not compute the file's values: the file fails the check."""


class ToolMissing(EvaluatorError):
    """This host lacks the converter a check needs: an error of the run, never the agent's failure."""


SSCONVERT_TIMEOUT = 30.0  # seconds; a real workbook of the suite converts in well under one
_NOBODY = 65534
_LIMITS = (
    (resource.RLIMIT_AS, 2 << 30),  # memory
    (resource.RLIMIT_FSIZE, 256 << 20),  # the largest file it may write
    (resource.RLIMIT_CPU, int(SSCONVERT_TIMEOUT) + 5),
    (resource.RLIMIT_CORE, 0),
)


def _limit_child() -> None:  # preexec_fn, in the child before exec
    import ctypes

    for limit, value in _LIMITS:
        resource.setrlimit(limit, (value, value))
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the worker


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[str, ...]:
    """The prefix that runs the converter without network (and, as root, as nobody), the strongest this
    host supports: network + PID namespace with privileges dropped when root, a user + network namespace
    otherwise, else nothing (a container without namespaces; ssconvert opens no sockets for a conversion)."""
    if shutil.which("unshare") is None:
        return ()
    candidates: list[tuple[str, ...]] = []
    if os.geteuid() == 0 and shutil.which("setpriv"):
        candidates.append(("unshare", "--net", "--pid", "--fork", "--kill-child",
                           "setpriv", f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups",
                           "--no-new-privs", "--"))
    candidates.append(("unshare", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def ssconvert(data: bytes, suffix: str, out_suffix: str) -> bytes:
    """Convert ``data`` with Gnumeric's ssconvert (recalculating every formula) on a temporary copy."""
    exe = shutil.which("ssconvert")
    if exe is None:
        raise ToolMissing("computing a Gnumeric file's formulas needs Gnumeric's ssconvert on this host "
                          "(apt-get install gnumeric)")
    prefix = _isolation()
    # dropped to nobody, the converter must reach its directory: TMPDIR may lie below a directory only we
    # can enter (pytest's and xdist's temp dirs are 0700), so the world-traversable /tmp when there is one
    shared = "/tmp" if "setpriv" in prefix and os.stat("/tmp").st_mode & 0o1777 == 0o1777 else None
    with tempfile.TemporaryDirectory(prefix="retrace-ssconvert-", dir=shared) as tmp:
        src, dst = os.path.join(tmp, "in" + suffix), os.path.join(tmp, "out" + out_suffix)
        with open(src, "wb") as fh:
            fh.write(data)
        if "setpriv" in prefix:
            for path in (tmp, src):
                os.chown(path, _NOBODY, _NOBODY)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "GSETTINGS_BACKEND": "memory", "NO_AT_BRIDGE": "1"}
        argv = [*prefix, exe, "--recalc", src, dst]
        try:
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_limit_child)  # noqa: PLW1509 - as envs/xvfb/sandbox.py: async-signal-safe calls only
        except OSError as exc:
            raise ToolMissing(f"cannot start ssconvert: {exc}") from exc
        try:
            output, _ = proc.communicate(timeout=SSCONVERT_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise ConversionFailed(f"ssconvert did not finish within {SSCONVERT_TIMEOUT:g} s") from None
        finally:
            _kill(proc)
        produced = os.path.isfile(dst) and os.path.getsize(dst) > 0
        if proc.returncode != 0 or not produced:
            lines = [ln for ln in output.decode("utf-8", "replace").splitlines() if ln.strip()]
            why = f"exit status {proc.returncode}" if proc.returncode else "no output"
            raise ConversionFailed(f"ssconvert could not read it ({why}{': ' + lines[-1][:200] if lines else ''})")
        with open(dst, "rb") as fh:
            return fh.read()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: unshare, and with --kill-child its namespace
        except ProcessLookupError:
            pass
        proc.wait()
