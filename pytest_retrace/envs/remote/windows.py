"""What the remote provider sends a guest whose ``/platform`` says ``Windows`` (WindowsAgentArena's VMs run
OSWorld's server): paths with backslashes under ``%USERPROFILE%``, commands through ``cmd /c`` or PowerShell
with a timeout of their own, the window list, and text beyond ASCII typed through ``SendInput``.

Every command is a Python program run through ``/execute`` (the guest has Python for pyautogui): the program,
not a shell, starts the command, so quoting has one layer only. ``cmd`` gets its command line verbatim
(``cmd /d /s /c "COMMAND"``: with ``/s`` cmd drops the outer quotes and runs the rest as written, its own
quoting rules untouched); PowerShell gets it as ``-EncodedCommand`` (base64 of UTF-16LE), so no character of
it is ever quoted. A timeout ends the command's whole process tree (``taskkill /T /F``) and exits 124, as
coreutils ``timeout`` does on Linux guests.

None of this has run on Windows here (there is no Windows VM on this machine): tests check the programs as
text and compile them (docs/environments.md).
"""

from __future__ import annotations

import base64
import ntpath

from pytest_retrace.envs.remote.client import home_relative

SHELLS = ("cmd", "powershell")
HOME = "%USERPROFILE%"  # expanded by OSWorld's /file and /setup/upload (os.path.expandvars)
TEMP = "%TEMP%"

_COMMAND = """\
import os, subprocess, sys
os.chdir(os.path.expanduser("~"))
proc = subprocess.Popen({argv!r}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                        creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0))
try:
    out, err = proc.communicate(timeout={timeout!r})
    code = proc.returncode
except subprocess.TimeoutExpired:
    subprocess.run(["taskkill", "/T", "/F", "/PID", str(proc.pid)], capture_output=True)
    out, err = proc.communicate()
    code = 124
sys.stdout.buffer.write(out)
sys.stderr.buffer.write(err)
sys.exit(code)
"""

# Windows: characters pyautogui cannot type (it knows the keyboard's ASCII keys only) as Unicode key events
UNICODE_TYPING = """\
import ctypes
from ctypes import wintypes
class _KeyInput(ctypes.Structure):
    _fields_ = [("wVk", wintypes.WORD), ("wScan", wintypes.WORD), ("dwFlags", wintypes.DWORD),
                ("time", wintypes.DWORD), ("dwExtraInfo", ctypes.c_size_t)]
class _MouseInput(ctypes.Structure):  # the union's largest member: INPUT must have Windows' size
    _fields_ = [("dx", wintypes.LONG), ("dy", wintypes.LONG), ("mouseData", wintypes.DWORD),
                ("dwFlags", wintypes.DWORD), ("time", wintypes.DWORD), ("dwExtraInfo", ctypes.c_size_t)]
class _Union(ctypes.Union):
    _fields_ = [("ki", _KeyInput), ("mi", _MouseInput)]
class _Input(ctypes.Structure):
    _fields_ = [("type", wintypes.DWORD), ("u", _Union)]
def _unicode(text, interval):
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        unit = int.from_bytes(data[i:i + 2], "little")
        for flags in (0x0004, 0x0006):  # KEYEVENTF_UNICODE, then with KEYEVENTF_KEYUP
            event = _Input(1, _Union(ki=_KeyInput(0, unit, flags, 0, 0)))  # 1: INPUT_KEYBOARD
            if ctypes.windll.user32.SendInput(1, ctypes.byref(event), ctypes.sizeof(event)) != 1:
                sys.exit("retrace: SendInput refused a character (is the desktop locked?)")
        time.sleep(interval)
"""

WINDOW_TITLES = """\
import pygetwindow
for title in pygetwindow.getAllTitles():
    if title.strip():
        print(title)
"""


def is_windows(platform: str) -> bool:
    return platform.strip().lower() == "windows"


def windows_path(path: str) -> str:
    """A task's path on a Windows guest: the home (``~``, GUEST_HOME, relative paths) under %USERPROFILE%,
    /tmp under %TEMP%, a drive path as given; separators as backslashes."""
    path = home_relative(path)
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    elif path == "/tmp" or path.startswith("/tmp/"):
        path = TEMP + path[4:]
    elif not ntpath.splitdrive(path)[0] and not path.startswith("/"):
        path = f"{HOME}/{path}"
    return path.replace("/", "\\")


def shell_argv(command: str, shell: str) -> list[str] | str:
    """How the command program starts `command`: a cmd command line as one string (cmd's quoting is its
    author's), or PowerShell's argv with the command encoded."""
    if shell == "cmd":
        return f'cmd /d /s /c "{command}"'
    if shell == "powershell":
        encoded = base64.b64encode(command.encode("utf-16-le")).decode()
        return ["powershell", "-NoLogo", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass",
                "-EncodedCommand", encoded]
    raise ValueError(f"shell: {shell!r} is not one of {', '.join(SHELLS)}")


def command_program(command: str, timeout: float, shell: str = "cmd") -> str:
    """The Python program that runs `command` in the home with `shell`, its output passed on as bytes, its
    exit status the command's, or 124 after `timeout` seconds (the process tree killed)."""
    return _COMMAND.format(argv=shell_argv(command, shell), timeout=float(timeout))


__all__ = ["HOME", "SHELLS", "TEMP", "UNICODE_TYPING", "WINDOW_TITLES", "command_program", "is_windows",
           "shell_argv", "windows_path"]
