"""The desktop image's entry point (``python -m pytest_retrace.guest.container``): the task's desktop exactly
as the xvfb provider builds it (envs/desktop.py: the same Xvfb arguments, openbox configuration, menu, home
template and task environment), then ``retrace guest`` serving it on port 5000 to the docker provider.

The container *is* the task's sandbox: one container per case, recreated from the image at every reset, so
nothing here restarts or cleans anything. Xvfb, openbox and the server run as the container's root; every
command, app and action of the task runs as the unprivileged ``user`` (a uid of its own), as in the xvfb provider's
sandbox: the agent cannot kill the server or the X server and so turn its own failure into an infrastructure
error. The container's capabilities, memory and process count are limited by the provider (envs/docker/environment.py).

``--accessibility`` (a task whose judge reads the AT-SPI tree, ``Task.accessibility``): the task environment with
accessibility on, and the task's session and AT-SPI buses started as its user before the guest serves
(envs/accessibility.py, as the xvfb provider's reset does). The tree is read with the desktop's python3 and
pyatspi (guest/accessibility.py), which only the ``osworld`` image variant has: without it, or with a bus that
does not answer, the container exits with the reason on stderr, which the provider reports at reset.

``--exit-on-stdin-eof``: the docker provider creates the container with stdin open and attached once
(``StdinOnce``); when the worker that owns it goes away, however it ends (SIGKILL included), the engine
closes stdin, this process exits, and the container (created with auto-remove) is gone. Without the flag a
container started by hand (``docker run`` with no ``-i``) would see EOF at once and stop.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.accessibility import start_buses
from pytest_retrace.envs.desktop import OPENBOX_RC, menu_xml, task_environment, xvfb_argv
from pytest_retrace.envs.steps import GUEST_HOME
from pytest_retrace.guest.config import GuestConfig, GuestError
from pytest_retrace.guest.server import read_token, serve
from pytest_retrace.screen.frames import DEFAULT_SCREEN, park_point

DISPLAY_NUMBER = 0
PORT = 5000
TOKEN_VARIABLE = "RETRACE_GUEST_TOKEN"
WM_HOME = Path("/root")  # the window manager's own home: the task's stays as the template made it
IMAGE_UID = 1000  # the image's `user` (envs/docker/image.py)
# The task's uid, RETRACE_TASK_UID when the provider gives one: a process limit counts the processes of a uid
# in every container of the machine (containers share the kernel's user namespace), so each container's task
# has a uid of its own, or a fork bomb in one would stop the apps of every other worker's case.
UID_VARIABLE = "RETRACE_TASK_UID"
NPROC_LIMIT = 2048  # processes and threads of the task's user, as envs/xvfb/sandbox.py
FSIZE_LIMIT = 1 << 30  # the largest file a task's process may write, as envs/xvfb/sandbox.py


def _as_user(uid: int) -> list[str]:
    """How a menu entry starts an app as the task's user (util-linux), first in the OOM killer's line."""
    return ["prlimit", f"--nproc={NPROC_LIMIT}", f"--fsize={FSIZE_LIMIT}", "--", "setpriv", f"--reuid={uid}",
            f"--regid={uid}", "--clear-groups", "--", "choom", "-n", "1000", "--"]


def _become(uid: int) -> None:
    """Give the image's `user` the uid `uid`: its account lines and its home."""
    if uid == IMAGE_UID:
        return
    for path in ("/etc/passwd", "/etc/group"):
        lines = Path(path).read_text().splitlines()
        fixed = [re.sub(r"^user:x:1000:(1000:)?", lambda m: f"user:x:{uid}:" + (f"{uid}:" if m.group(1) else ""), line)
                 for line in lines]
        Path(path).write_text("\n".join(fixed) + "\n")
    for root, dirs, files in os.walk(GUEST_HOME):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
    os.chown(GUEST_HOME, uid, uid)


def _start_xvfb(size: tuple[int, int]) -> subprocess.Popen[bytes]:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(xvfb_argv(DISPLAY_NUMBER, size, write_fd), pass_fds=[write_fd],
                            stdout=subprocess.DEVNULL, stderr=sys.stderr)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        if not pipe.readline().strip():  # blocks until Xvfb accepts connections, or EOF when it exited
            raise SystemExit(f"retrace container: Xvfb exited with {proc.wait()}")
    return proc


def _start_openbox(env: dict[str, str], uid: int) -> subprocess.Popen[bytes]:
    menu = WM_HOME / ".config" / "openbox" / "menu.xml"
    menu.parent.mkdir(parents=True, exist_ok=True)
    # a menu entry runs the app with the task's environment, as a setup launch step does
    menu.write_text(menu_xml([*_as_user(uid), "env", "-i", *(f"{k}={v}" for k, v in env.items())]))
    wm_env = {**env, "HOME": str(WM_HOME), "XDG_CONFIG_HOME": str(WM_HOME / ".config"),
              "XDG_CACHE_HOME": str(WM_HOME / ".cache"), "XDG_DATA_HOME": str(WM_HOME / ".local/share")}
    proc = subprocess.Popen(["openbox", "--config-file", str(OPENBOX_RC)], env=wm_env, cwd=WM_HOME,
                            stdout=sys.stderr, stderr=sys.stderr)
    deadline = time.monotonic() + 20
    while "window id" not in subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=env,
                                            capture_output=True, text=True, check=False).stdout:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("retrace container: openbox did not start")
        time.sleep(0.02)
    return proc


def _start_buses(env: dict[str, str], uid: int) -> None:
    """The task's accessibility buses, as its user with its environment (envs/accessibility.py)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pyatspi') is None)"
    if subprocess.run(["python3", "-c", probe], env=env, check=False).returncode != 0:
        raise SystemExit("retrace container: --accessibility: this image's python3 has no pyatspi "
                         "(python3-pyatspi), which GET /accessibility reads the tree with: use the docker "
                         "provider's image variant that has it, option variant=osworld")
    prefix = [*_as_user(uid), "env", "-i", *(f"{k}={v}" for k, v in env.items())]

    def popen(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*prefix, *argv], cwd=GUEST_HOME, **kwargs)  # type: ignore[call-overload]

    try:
        seconds = start_buses(popen, env, WM_HOME / "buses.log", packages="dbus-x11 and at-spi2-core (the image's "
                              "packages.txt)")
    except EnvError as exc:
        raise SystemExit(f"retrace container: {exc}") from None
    print(f"retrace container: the accessibility buses answered in {seconds:.2f} s", file=sys.stderr, flush=True)


def _exit_on_stdin_eof() -> None:
    def watch() -> None:
        while os.read(0, 65536):
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down; tini then ends every other process

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_retrace.guest.container")
    parser.add_argument("--size", default="{}x{}".format(*DEFAULT_SCREEN), help="the screen, WxH")
    parser.add_argument("--exit-on-stdin-eof", action="store_true")
    parser.add_argument("--accessibility", action="store_true", help="the task's AT-SPI buses, bridges on")
    args = parser.parse_args(argv)
    width, _, height = args.size.partition("x")
    size = (int(width), int(height))
    uid = int(os.environ.pop(UID_VARIABLE, IMAGE_UID))
    _become(uid)
    env = task_environment(f":{DISPLAY_NUMBER}", GUEST_HOME, accessibility=args.accessibility)
    runtime = Path(env["XDG_RUNTIME_DIR"])
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.chown(runtime, uid, uid)
    _start_xvfb(size)
    _start_openbox(env, uid)
    if args.accessibility:
        _start_buses(env, uid)
    # the pointer parked by the corner, as the xvfb provider's reset leaves it (hover effects never differ)
    subprocess.run(["xdotool", "mousemove", *map(str, park_point(size))], env=env, check=True)
    if args.exit_on_stdin_eof:
        _exit_on_stdin_eof()
    try:
        token = read_token(TOKEN_VARIABLE)
        config = GuestConfig(home=Path(GUEST_HOME), token=token, display=env["DISPLAY"], env=env, run_as=(uid, uid),
                             nproc_limit=NPROC_LIMIT, fsize_limit=FSIZE_LIMIT)
        return serve(config, host="0.0.0.0", port=PORT)  # noqa: S104 - the container's own interface, token required
    except GuestError as exc:
        print(f"retrace container: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
