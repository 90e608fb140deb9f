"""The work behind the OSWorld endpoints that go beyond files, commands and the screen (guest/osworld_routes.py):
Python and bash scripts, verified commands, windows, the wallpaper, directory trees. Blocking (run in
starlette's thread pool), and made of `GuestBackend` calls only (mostly shell scripts through ``run``), so the
local guest and an Environment's behave alike.

Each function returns ``(status, body)``: a JSON-able body with OSWorld's keys, a message, or bytes for a file.
The routes check the requests' fields before calling them.
"""

from __future__ import annotations

import io
import posixpath
import re
import shlex
import time
import uuid
from typing import Any

from pytest_retrace.envs.steps import ActivateStep
from pytest_retrace.envs.xdotool import activate_command
from pytest_retrace.guest.backend import GuestBackend
from pytest_retrace.guest.requests import expand_home

PYTHON_TIMEOUT = 30.0  # OSWorld's /run_python limit
BASH_TIMEOUT = 100.0  # OSWorld's /run_bash_script default when the request gives none
VERIFY_COMMAND_TIMEOUT = 5.0  # OSWorld's limit for a verification's command_success
_WINDOW_NOT_FOUND = 3  # activate_command's exit status when no window matches
_NO_TOOL = 127

# gsettings reaches dconf through the session bus; a desktop without one (Xvfb here) keeps the value in the
# home's keyfile instead, so it lives exactly as long as the task's home
_GSETTINGS = ('[ -n "$DBUS_SESSION_BUS_ADDRESS" ] || export GSETTINGS_BACKEND="${GSETTINGS_BACKEND:-keyfile}"\n'
              'command -v gsettings >/dev/null 2>&1 || { echo "gsettings is not installed" >&2; exit 127; }\n'
              'exec gsettings "$@"\n')
_WALLPAPER_KEY = ["org.gnome.desktop.background", "picture-uri"]

# every client window (_NET_CLIENT_LIST, as OSWorld reads it): its id, WM_CLASS line and own size
_CLIENTS = r"""
command -v xprop >/dev/null 2>&1 && command -v xwininfo >/dev/null 2>&1 || { echo "needs xprop and xwininfo (x11-utils)" >&2; exit 127; }
for id in $(xprop -root _NET_CLIENT_LIST 2>/dev/null | sed -n 's/^.*# //p' | tr -d ','); do
  printf 'window %s\n' "$id"
  xprop -id "$id" WM_CLASS 2>/dev/null
  xwininfo -id "$id" 2>/dev/null | grep -E '^ *(Width|Height):'
done
"""

# the titles of visible windows (xdotool), or wmctrl's list: what a window_exists verification searches
_TITLES = r"""
if command -v xdotool >/dev/null 2>&1; then
  for id in $(xdotool search --onlyvisible --name . 2>/dev/null); do xdotool getwindowname "$id" 2>/dev/null; done
elif command -v wmctrl >/dev/null 2>&1; then wmctrl -l
else echo "neither xdotool nor wmctrl is installed" >&2; exit 127; fi
"""


def _sh(backend: GuestBackend, script: str, args: list[str], timeout: float = 30.0) -> dict[str, Any]:
    return backend.run("sh -c " + shlex.quote(script) + " sh " + shlex.join(args), True, timeout)


def _timed_out(res: dict[str, Any]) -> bool:
    return res["returncode"] == 124 and "timed out after" in res["error"]


def _scratch(backend: GuestBackend, suffix: str, text: str) -> str:
    """Write `text` to a new file in the desktop's /tmp; its path."""
    path = f"/tmp/retrace-guest-{uuid.uuid4().hex}{suffix}"
    backend.write(path, io.BytesIO(text.encode()))
    return path


def run_python(backend: GuestBackend, code: str) -> tuple[int, dict[str, Any]]:
    """OSWorld's /run_python: the code as a file run by python3, at most 30 s; a failing script is a 200 with
    ``status`` error, a timeout a 500."""
    path = _scratch(backend, ".py", code)
    try:
        res = backend.run(["python3", path], False, PYTHON_TIMEOUT)
    finally:
        backend.run(["rm", "-f", path], False, 10)
    if _timed_out(res):
        return 500, {"status": "error", "message": "Execution timeout: Code took too long to execute",
                     "error": "TimeoutExpired", "need_more": False, "output": None}
    out, err, code_ = res["output"], res["error"], res["returncode"]
    if code_ != 0 and not err:
        err = f"Process exited with code {code_}"
    message = "\n".join(part for part in (out, err) if part)
    return 200, {"status": "success" if code_ == 0 else "error", "message": message, "need_more": False,
                 "output": out, "error": err, "return_code": code_}


def run_bash_script(backend: GuestBackend, script: str, timeout: float, working_dir: str | None) -> tuple[int, dict[str, Any]]:
    """OSWorld's /run_bash_script: stdout and stderr merged in ``output``, ``error`` always empty."""
    if working_dir is not None:
        working_dir = expand_home(working_dir, backend.home)
        if backend.run(["test", "-d", working_dir], False, 10)["returncode"] != 0:
            return 400, {"status": "error", "output": f"Working directory does not exist: {working_dir}",
                         "error": "", "returncode": -1}
    if "#!/bin/bash" not in script:
        script = "#!/bin/bash\n\n" + script
    path = _scratch(backend, ".sh", script)
    try:
        cd = f"cd -- {shlex.quote(working_dir)} && " if working_dir else ""
        res = backend.run(f"{cd}exec /bin/bash {shlex.quote(path)} 2>&1", True, timeout)
    finally:
        backend.run(["rm", "-f", path], False, 10)
    if _timed_out(res):
        return 500, {"status": "error", "output": f"Script execution timed out after {timeout:g} seconds",
                     "error": "", "returncode": -1}
    return 200, {"status": "success" if res["returncode"] == 0 else "error", "output": res["output"],
                 "error": "", "returncode": res["returncode"]}


def execute_with_verification(backend: GuestBackend, command: list[str] | str, shell: bool, timeout: float,
                              verification: dict[str, str], max_wait: float, interval: float) -> tuple[int, dict[str, Any]]:
    """OSWorld's /setup/execute_with_verification: run the command, then check the verification every
    `interval` s for up to `max_wait` s (a window whose title holds ``window_exists``, ignoring case; a shell
    command ``command_success`` exiting 0)."""
    res = backend.run(command, shell, timeout)
    if not verification:
        return 200, res
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        if _verified(backend, verification):
            return 200, {**res, "verification": "passed", "wait_time": time.monotonic() - start}
        time.sleep(interval)
    return 500, {**res, "status": "verification_failed", "verification": "failed", "wait_time": max_wait}


def _verified(backend: GuestBackend, verification: dict[str, str]) -> bool:
    if "window_exists" in verification:
        titles = _sh(backend, _TITLES, [])
        if titles["returncode"] != 0 or verification["window_exists"].lower() not in titles["output"].lower():
            return False
    if "command_success" in verification:
        if backend.run(verification["command_success"], True, VERIFY_COMMAND_TIMEOUT)["returncode"] != 0:
            return False
    return True


def window_name(name: str, by_class: bool) -> str:
    """The window OSWorld's step means, on our desktops: OSWorld's VMs run Google Chrome, whose windows are titled
    "… - Google Chrome" (WM_CLASS Google-chrome); ours run Debian's chromium as `google-chrome` (desktop.py's
    launcher), titled "… - Chromium" (WM_CLASS chromium)."""
    if by_class:
        return re.sub(r"(?i)google-chrome", "chromium", name)
    return re.sub(r"(?i)google chrome", "Chromium", name)


def activate_window(backend: GuestBackend, name: str, strict: bool, by_class: bool) -> tuple[int, str]:
    """OSWorld's /setup/activate_window, once (OSWorld runs ``wmctrl -a`` once): envs/xdotool.py's activate
    script, which matches as wmctrl does (xdotool first, else wmctrl itself), given about a second."""
    step = ActivateStep(type="activate", window=window_name(name, by_class), exact=strict, by_class=by_class,
                        timeout=1.0)
    res = backend.run(activate_command(step), True, 20)
    if res["returncode"] == 0:
        return 200, "Window activated successfully"
    if res["returncode"] == _WINDOW_NOT_FOUND:
        return 404, f"Window {name} not found"
    return (501 if res["returncode"] == _NO_TOOL else 500), f"cannot activate {name}: {res['error'].strip()[-300:]}"


def close_window(backend: GuestBackend, name: str, strict: bool, by_class: bool) -> tuple[int, str]:
    """OSWorld's /setup/close_window: ``wmctrl -c`` with its flags (a polite close, as the window's own close
    button); without wmctrl on the desktop a 501."""
    flags = ("x" if by_class else "") + ("F" if strict else "") + "c"
    script = ('command -v wmctrl >/dev/null 2>&1 || { echo "wmctrl is not installed on this desktop" >&2; exit 127; }\n'
              'exec wmctrl "$@"\n')
    res = _sh(backend, script, [f"-{flags}", window_name(name, by_class)])
    if res["returncode"] == 0:
        return 200, "Window closed successfully."
    if res["returncode"] == _NO_TOOL:
        return 501, f"cannot close {name}: {res['error'].strip()}"
    return 404, f"Window {name} not found"


def change_wallpaper(backend: GuestBackend, path: str) -> tuple[int, str]:
    """OSWorld's /setup/change_wallpaper: GNOME's picture-uri set to the file (gsettings)."""
    full = expand_home(path, backend.home)
    if backend.run(["test", "-e", full], False, 10)["returncode"] != 0:
        return 404, f"File not found: {full}"
    res = _sh(backend, _GSETTINGS, ["set", *_WALLPAPER_KEY, f"file://{full}"])
    if res["returncode"] != 0:
        return (501 if res["returncode"] == _NO_TOOL else 500), f"Failed to change wallpaper. Error: {res['error'].strip()}"
    return 200, "Wallpaper changed successfully"


def wallpaper(backend: GuestBackend) -> tuple[int, bytes | str]:
    """OSWorld's /wallpaper: the file GNOME's picture-uri names (a file the file API may read)."""
    res = _sh(backend, _GSETTINGS, ["get", *_WALLPAPER_KEY])
    if res["returncode"] != 0:
        return (501 if res["returncode"] == _NO_TOOL else 500), f"cannot read the wallpaper setting: {res['error'].strip()}"
    path = res["output"].strip().replace("file://", "").replace("'", "")
    data = backend.read(path) if path else None
    if data is None:
        return 404, "Wallpaper file not found"
    return 200, data


def window_size(backend: GuestBackend, app_class: str) -> tuple[int, dict[str, Any]]:
    """OSWorld's /window_size: the size of the first client window one of whose WM_CLASS names is
    `app_class` (ignoring case)."""
    res = _sh(backend, _CLIENTS, [])
    if res["returncode"] != 0:
        status = 501 if res["returncode"] == _NO_TOOL else 500
        return status, {"error": f"cannot list the windows: {res['error'].strip()}"}
    for names, size in _clients(res["output"]):
        if app_class.lower() in (n.lower() for n in names) and len(size) == 2:
            return 200, {"width": size["Width"], "height": size["Height"]}
    return 404, {"error": f"no window of class {app_class}"}


def _clients(listing: str) -> list[tuple[list[str], dict[str, int]]]:
    windows: list[tuple[list[str], dict[str, int]]] = []
    for line in listing.splitlines():
        line = line.strip()
        if line.startswith("window "):
            windows.append(([], {}))
        elif windows and line.startswith("WM_CLASS(") and " = " in line:
            windows[-1][0].extend(part.strip().strip('"') for part in line.split(" = ", 1)[1].split(", "))
        elif windows and line.split(":")[0] in ("Width", "Height"):
            key, _, value = line.partition(":")
            windows[-1][1][key] = int(value)
    return windows


def desktop_path(backend: GuestBackend) -> tuple[int, dict[str, str]]:
    path = posixpath.join(backend.home, "Desktop")
    if backend.run(["test", "-d", path], False, 10)["returncode"] == 0:
        return 200, {"desktop_path": path}
    return 404, {"error": "Unsupported operating system or desktop path not found"}


def directory_tree(backend: GuestBackend, path: str) -> tuple[int, dict[str, Any]]:
    """OSWorld's /list_directory: ``{"directory_tree": {"type": "directory", "name", "children": [...]}}``,
    links followed as OSWorld's os.path.isdir does (a loop is listed once, not followed)."""
    res = backend.run(["find", "-L", path, "-mindepth", "1", "-printf", r"%y %P\0"], False, 60)
    if res["returncode"] not in (0, 1):  # 1: some entry could not be read, as OSWorld lists what it can
        return 500, {"error": f"cannot list {path}: {res['error'].strip()[-300:]}"}
    if res["output"] and not res["output"].endswith("\0"):  # cut at the command output's limit
        return 413, {"error": f"the directory tree of {path} is over the {len(res['output'])}-byte output limit"}
    root: dict[str, Any] = {"type": "directory", "name": posixpath.basename(path.rstrip("/")), "children": []}
    dirs = {"": root}
    for entry in filter(None, res["output"].split("\0")):  # find lists a directory before what it holds
        kind, _, rel = entry.partition(" ")
        parent = dirs.get(posixpath.dirname(rel))
        if parent is None:
            continue  # below a directory that could not be listed
        name = posixpath.basename(rel)
        if kind == "d":
            node = dirs[rel] = {"type": "directory", "name": name, "children": []}
        else:
            node = {"type": "file", "name": name}
        parent["children"].append(node)
    return 200, {"directory_tree": root}

