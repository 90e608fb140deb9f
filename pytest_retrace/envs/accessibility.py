"""The accessibility buses of a task that asks for them (``Task.accessibility``: its judge reads the desktop's
AT-SPI tree, as 33 of OSWorld's Linux tasks do), in every provider that builds its desktop itself: the xvfb
provider's reset starts them in the task's sandbox, the docker image's entry point (guest/container.py
``--accessibility``) in the task's container before its guest serves.

Every other task runs with no session bus and every bridge off (envs/desktop.py ``task_environment``), so its
screens and timings stay those the cases were recorded with. For this one: a session bus of its own
(``dbus-daemon`` at ``$XDG_RUNTIME_DIR/bus``, a process of the task, as its user, so it ends with the task), and
through it the AT-SPI bus (``org.a11y.Bus``, which the session bus starts on demand: at-spi-bus-launcher, its
own dbus-daemon and at-spi2-registryd). It is asked for once here, so a bus that cannot start is the harness's
error when the task's desktop is made, not a tree that silently lacks every app when the task is judged.

Standard library only: the container's boot imports it without numpy or the SDKs.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_retrace.envs import EnvError

BUS_DEADLINE = 30.0  # seconds for both buses to answer, on a loaded machine
LAUNCHER = Path("/usr/libexec/at-spi-bus-launcher")
PACKAGES = "dbus-daemon, dbus-bin and at-spi2-core (scripts/bootstrap)"  # the host's, for the xvfb provider
_ASK = ["dbus-send", "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus", "org.a11y.Bus.GetAddress"]

# Starts argv as a process of the task (its user, its environment: the one given to start_buses), with Popen's
# keyword arguments: the xvfb sandbox's ``popen``, or the container's run-as-user prefix.
TaskPopen = Callable[..., "subprocess.Popen[bytes]"]


def problem(packages: str = PACKAGES) -> str | None:
    """Why the buses cannot run on this machine, or None; `packages`: what to install."""
    missing = [tool for tool in ("dbus-daemon", "dbus-send") if shutil.which(tool) is None]
    if not LAUNCHER.exists():
        missing.append(str(LAUNCHER))
    return f"{', '.join(missing)} not found: install {packages}" if missing else None


def start_buses(popen: TaskPopen, env: Mapping[str, str], log: Path, packages: str = PACKAGES) -> float:
    """Start the current task's session bus and its AT-SPI bus (module docstring); the seconds it took.

    `popen` starts a process of the task with `env`, the task's environment (its ``DBUS_SESSION_BUS_ADDRESS``
    is where the session bus listens); the bus's own output goes to `log`. EnvError, with why, when either bus
    does not answer within BUS_DEADLINE."""
    if (why := problem(packages)) is not None:
        raise EnvError(f"accessibility: {why}")
    start = time.monotonic()
    with open(log, "ab") as out:
        daemon = popen(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                        f"--address={env['DBUS_SESSION_BUS_ADDRESS']}"],
                       stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    last = ""
    while True:
        if daemon.poll() is not None:
            raise EnvError(f"accessibility: the task's session bus exited with {daemon.returncode}: "
                           f"{_tail(log)}")
        ask = popen(_ASK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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

