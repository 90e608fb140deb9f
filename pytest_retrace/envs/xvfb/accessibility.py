"""The accessibility buses of a task that asks for them (``Task.accessibility``: its judge reads the desktop's
AT-SPI tree, as 33 of OSWorld's Linux tasks do).

Every other task runs with no session bus and every bridge off (envs/desktop.py ``task_environment``), so its
screens and timings stay those the cases were recorded with. For this one, at reset: a session bus of its own
(``dbus-daemon`` at ``$XDG_RUNTIME_DIR/bus``, a process of the task's sandbox, so it ends with the task), and
through it the AT-SPI bus (``org.a11y.Bus``, which the session bus starts on demand: at-spi-bus-launcher, its
own dbus-daemon and at-spi2-registryd). It is asked for once here, so a bus that cannot start is the harness's
error at reset, not a tree that silently lacks every app when the task is judged.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.xvfb.sandbox import Sandbox

BUS_DEADLINE = 30.0  # seconds for both buses to answer, on a loaded machine
LAUNCHER = Path("/usr/libexec/at-spi-bus-launcher")
PACKAGES = "dbus-daemon, dbus-bin and at-spi2-core (scripts/bootstrap)"
_ASK = ["dbus-send", "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus", "org.a11y.Bus.GetAddress"]


def problem() -> str | None:
    """Why the buses cannot run on this machine, or None."""
    missing = [tool for tool in ("dbus-daemon", "dbus-send") if shutil.which(tool) is None]
    if not LAUNCHER.exists():
        missing.append(str(LAUNCHER))
    return f"{', '.join(missing)} not found: install {PACKAGES}" if missing else None


def start_buses(sandbox: Sandbox, log: Path) -> float:
    """Start the current task's session bus and its AT-SPI bus (module docstring); the seconds it took."""
    if (why := problem()) is not None:
        raise EnvError(f"accessibility: {why}")
    env = sandbox.env()
    start = time.monotonic()
    with open(log, "ab") as out:
        daemon = sandbox.popen(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                                f"--address={env['DBUS_SESSION_BUS_ADDRESS']}"],
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    last = ""
    while True:
        if daemon.poll() is not None:
            raise EnvError(f"accessibility: the task's session bus exited with {daemon.returncode}: "
                           f"{_tail(log)}")
        ask = sandbox.popen(_ASK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            reply = ask.communicate(timeout=BUS_DEADLINE)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            ask.kill()
            ask.wait()
            reply = f"no answer within {BUS_DEADLINE:g} s"
        if ask.returncode == 0 and "unix:" in reply:
            return time.monotonic() - start
        last = reply.strip()
        if time.monotonic() - start > BUS_DEADLINE:
            raise EnvError(f"accessibility: the AT-SPI bus did not answer within {BUS_DEADLINE:g} s: "
                           f"{last[-300:]} {_tail(log)}")
        time.sleep(0.05)  # the session bus is not listening yet


def _tail(log: Path) -> str:
    return log.read_bytes()[-300:].decode(errors="replace").strip() if log.exists() else ""
