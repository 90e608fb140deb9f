"""What a task's desktop is, in every provider that builds one itself (xvfb here, docker in its container):
the X server's arguments, the window manager's configuration and menu, the home template, the environment of
every process of a task. One definition, because a screenshot depends on all of it: a container whose desktop
differed in DPI, a menu entry or one variable would give other pixels than the desktop the cases were recorded
on, and so other verdicts.

Standard library only: the container's boot (guest/container.py) imports it without numpy or the SDKs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from pytest_retrace.envs.steps import GUEST_HOME

GUEST_USER = "user"
TEMPLATE = Path(__file__).with_name("home-template")
OPENBOX_RC = Path(__file__).with_name("openbox-rc.xml")
# the browser flags of the browser cases (rollouts/browser/gen.py) minus the DevTools port: no network fetches
# of its own, no first-run page, so what it draws depends only on the page
CHROMIUM_FLAGS = ("--no-first-run", "--no-default-browser-check", "--disable-gpu", "--force-device-scale-factor=1",
                  "--password-store=basic", "--disable-sync", "--disable-background-networking",
                  "--disable-component-update")
# The desktop's application menu (right-click on the desktop), as on any real desktop: without it an
# agent that closed the task's only window could never reopen it. Same arguments as the suite's tasks
# use, so a reopened app looks like the one the task started.
DESKTOP_MENU: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Terminal", ("xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black")),
    ("Text Editor", ("mousepad",)),
    ("Spreadsheet", ("gnumeric",)),
    ("File Manager", ("pcmanfm", "/home/user")),
    ("Office Spreadsheet", ("soffice", "--calc", "--norestore", "--nologo")),
    ("Office Writer", ("soffice", "--writer", "--norestore", "--nologo")),
    ("Web Browser", ("chromium", *CHROMIUM_FLAGS)),
)
# Programs of every task's desktop besides the machine's, on its PATH in /usr/local/bin (the xvfb sandbox lays
# them over that directory, the docker image installs them there). OSWorld's tasks and getters start
# `google-chrome` and read its profile under ~/.config/google-chrome; this desktop's browser is Debian's
# chromium, so the name runs it with the menu's flags and that profile. The task's own arguments come last:
# chromium takes the last of a repeated switch, so a task's --user-data-dir is the one used.
GUEST_PROGRAMS: dict[str, str] = {
    "google-chrome": "#!/bin/sh\n# pytest-retrace: Google Chrome as OSWorld's tasks start it, on Debian's chromium\n"
                     f"exec chromium {shlex.join(CHROMIUM_FLAGS)} --user-data-dir=\"$HOME/.config/google-chrome\""
                     ' "$@"\n',
}


# What turns each toolkit's accessibility on where the session has an AT-SPI bus: Chromium
# (ACCESSIBILITY_ENABLED), Gecko (Thunderbird), LibreOffice and Java (GNOME_ACCESSIBILITY), Qt (VLC). GTK's
# bridge needs only a session bus and no NO_AT_BRIDGE.
ACCESSIBILITY_ENV = {"ACCESSIBILITY_ENABLED": "1", "GNOME_ACCESSIBILITY": "1", "QT_ACCESSIBILITY": "1",
                     "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1"}


def write_programs(directory: Path, programs: Mapping[str, str] = GUEST_PROGRAMS) -> None:
    """`programs` (name -> script) as executable files in `directory` (the docker image's recipe calls it too)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, script in programs.items():
        (directory / name).write_text(script)
        (directory / name).chmod(0o755)


def xvfb_argv(number: int, size: tuple[int, int], ready_fd: int | None) -> list[str]:
    """Xvfb on display `number`, writing that number to `ready_fd` (if any) once it accepts connections.

    Its socket file is its only listener (no TCP, no abstract socket, which any process of the network
    namespace could reach); no cursor is drawn, 96 DPI, XTest for input; ``-noreset``: by default the server
    resets when its last client disconnects, and a connection arriving during that reset fails (measured:
    openbox then exited with "Failed to open the display" in 13 of 360 starts). ``-r``: no key autorepeat. With
    it, a key whose release reached the server more than 660 ms after its press typed twice, and under load
    (-n 16 on 2 cores) xdotool or the server itself can stall that long between the two: a replayed `tab`
    then skipped a form field, so how many keys an action typed depended on the machine's load."""
    w, h = size
    ready = [] if ready_fd is None else ["-displayfd", str(ready_fd)]
    return ["Xvfb", f":{number}", *ready, "-screen", "0", f"{w}x{h}x24",
            "-nolisten", "tcp", "-nolisten", "local", "-nocursor", "-dpi", "96", "+extension", "XTEST", "-noreset",
            "-r"]


def task_environment(display: str, home: str = GUEST_HOME, user: str = GUEST_USER,
                     runtime: str = "/tmp/.runtime-user", tag: str = "", accessibility: bool = False) -> dict[str, str]:
    """The environment of every process of a task: nothing of the harness's (no keys, no tokens). With
    `accessibility` (a task that asks for it: its judge reads the AT-SPI tree), the task's own session bus
    (``runtime``/bus, started with the task) and every toolkit's accessibility bridge on."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "DISPLAY": display, "HOME": home,
        "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
        "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_CACHE_HOME": f"{home}/.cache", "XDG_RUNTIME_DIR": runtime,
        # no session bus: apps fall back to single-instance-less mode, nothing outlives a reset
        "DBUS_SESSION_BUS_ADDRESS": "disabled:", "NO_AT_BRIDGE": "1", "GTK_A11Y": "none",
        "GSETTINGS_BACKEND": "keyfile", "GTK_OVERLAY_SCROLLING": "0",
        "XDG_SESSION_TYPE": "x11",
    }
    if accessibility:
        del env["NO_AT_BRIDGE"], env["GTK_A11Y"]
        env.update(ACCESSIBILITY_ENV, DBUS_SESSION_BUS_ADDRESS=f"unix:path={runtime}/bus")
    if tag:
        env["RETRACE_TASK"] = tag  # lets a leak check find strays
    return env


def menu_xml(launcher: Sequence[str]) -> str:
    """openbox's root menu: each entry runs ``launcher + argv`` (the launcher makes the app part of the task)."""
    items = "".join(f'<item label={quoteattr(label)}><action name="Execute"><command>'
                    f"{escape(shlex.join([*launcher, *argv]))}</command></action></item>"
                    for label, argv in DESKTOP_MENU)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<openbox_menu xmlns="http://openbox.org/3.4/menu">'
            f'<menu id="root-menu" label="Applications">{items}</menu></openbox_menu>\n')
