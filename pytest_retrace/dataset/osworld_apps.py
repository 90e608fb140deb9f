"""The apps an OSWorld task needs, and whether an environment provider has them: the difference between "the
harness supports this task" (OSWorld's own code can set it up and judge it, dataset/osworld_check.py) and
"this provider can run it" (the desktop has Chrome, GIMP, VLC, ... as OSWorld's VM has).

A task's needs are read from its config and postconfig (the program each launch / execute / command step
runs, the app an ``open`` step's file opens in) and from its getters (a Chrome getter talks to Chrome's
DevTools port, a VLC getter to VLC's HTTP interface). A provider has an app when:

- ``xvfb``: its programs are on the PATH every task's process gets (envs/desktop.py ``task_environment``),
  or among the programs the desktop adds (``GUEST_PROGRAMS``: ``google-chrome`` runs Debian's chromium);
  a Python module, when the task's ``python3`` finds it;
- ``docker``: its Debian packages are in the image's package lists (envs/docker/desktop-image/packages*.txt,
  the ``osworld`` variant included); a Python module, when a listed ``python3-<module>`` package has it (the
  image's requirements.txt goes into the guest server's /opt/retrace venv, and the tasks' ``python3`` is
  /usr/bin's);
- ``remote``: an OSWorld VM, which has OSWorld's apps.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pytest_retrace.envs.desktop import GUEST_PROGRAMS, task_environment
from pytest_retrace.osworld import package
from pytest_retrace.osworld.evaluate import getter_blocks, reads_tree

Provider = Literal["xvfb", "docker", "remote"]
PROVIDERS: tuple[Provider, ...] = ("xvfb", "docker", "remote")
IMAGE = Path(__file__).resolve().parents[1] / "envs" / "docker" / "desktop-image"


@dataclass(frozen=True)
class App:
    """What a provider must have for an app: programs (xvfb), Debian packages (docker), a Python module."""

    programs: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    module: str | None = None  # a Python module the task's python3 must import
    debian: bool = True  # False: no Debian package provides it, so only an OSWorld VM has it


# OSWorld's apps, by the name a report gives them. Each LibreOffice part has its own Debian package and program.
APPS: dict[str, App] = {
    "chrome": App(("google-chrome", "chromium"), ("chromium",)),
    "libreoffice calc": App(("libreoffice", "localc"), ("libreoffice-calc",)),
    "libreoffice writer": App(("libreoffice", "lowriter"), ("libreoffice-writer",)),
    "libreoffice impress": App(("libreoffice", "loimpress"), ("libreoffice-impress",)),
    "libreoffice": App(("libreoffice",), ("libreoffice-core",)),
    "gimp": App(("gimp",), ("gimp",)),
    "vlc": App(("vlc",), ("vlc",)),
    "thunderbird": App(("thunderbird",), ("thunderbird",)),
    "nautilus": App(("nautilus",), ("nautilus",)),
    "vs code": App(("code",), debian=False),
    "pyautogui": App(("python3",), ("python3",), module="pyautogui"),
    # a judge reading the AT-SPI tree: the task's own buses (envs/accessibility.py: dbus-daemon, and at-spi2-core's
    # bus launcher) and pyatspi in its python3 (guest/accessibility.py); the docker image's lists have both
    # (python3-pyatspi in the osworld variant's), and its container starts the buses for such a task
    "accessibility tree": App(("dbus-daemon", "dbus-send"), ("python3-pyatspi", "at-spi2-core"), module="pyatspi"),
}
# A program a step runs -> the app it is (the rest are plain programs, checked by name).
PROGRAM_APPS = {"google-chrome": "chrome", "chromium": "chrome", "code": "vs code", "thunderbird": "thunderbird",
                "gimp": "gimp", "vlc": "vlc", "nautilus": "nautilus", "libreoffice": "libreoffice",
                "soffice": "libreoffice", "localc": "libreoffice calc", "lowriter": "libreoffice writer",
                "loimpress": "libreoffice impress"}
# The Debian package of a plain program OSWorld's steps run, for the docker provider's lists; the programs of
# Debian's required set (coreutils, tar, sed, grep, bash, diffutils, apt, ...) are in every image.
PROGRAM_PACKAGES = {"socat": "socat", "wmctrl": "wmctrl", "unzip": "unzip", "gsettings": "libglib2.0-bin",
                    "gio": "libglib2.0-bin", "pkill": "procps", "pip": "python3-pip", "xdg-open": "xdg-utils",
                    "update-desktop-database": "desktop-file-utils", "python3": "python3",
                    "xdotool": "xdotool"}
BASE_PROGRAMS = frozenset({"bash", "sh", "mkdir", "tar", "chmod", "echo", "cp", "rm", "touch", "sed", "ls",
                           "grep", "mv", "cat", "find", "sleep", "true", "test", "[", "gzip", "ln", "diff",
                           "apt"})
# Words a shell runs itself (a step with shell true): no program to look for.
SHELL_BUILTINS = frozenset({"cd", "export", "source", ".", "set", "unset", "alias"})
# The app a file opens in, by its suffix (OSWorld's VM opens office files in LibreOffice, media in VLC).
SUFFIX_APPS = {**dict.fromkeys((".xlsx", ".xls", ".ods", ".csv"), "libreoffice calc"),
               **dict.fromkeys((".docx", ".doc", ".odt", ".rtf"), "libreoffice writer"),
               **dict.fromkeys((".pptx", ".ppt", ".odp"), "libreoffice impress"),
               **dict.fromkeys((".mp4", ".mp3", ".avi", ".mkv", ".wav", ".webm"), "vlc")}
GETTER_APPS = {"chrome": "chrome", "vlc": "vlc", "vscode": "vs code", "gimp": "gimp"}  # getters/<module>.py


def needs(task: dict[str, Any]) -> list[str]:
    """The apps and programs a task's steps and getters need, sorted."""
    evaluator = task.get("evaluator") if isinstance(task.get("evaluator"), dict) else {}
    steps = [*_list(task.get("config")), *_list(evaluator.get("postconfig"))]
    found = {need for step in steps if isinstance(step, dict) for need in _step_needs(step)}
    for getter in _getters(evaluator):
        entry = package.entry("getter", str(getter.get("type")))
        if entry is not None and (app := GETTER_APPS.get(entry.module.rpartition(".")[2])):
            found.add(app)
        if reads_tree(getter):
            found.add("accessibility tree")
    return sorted(found)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _getters(evaluator: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (getter for _, getter in getter_blocks(evaluator))


def _step_needs(step: dict[str, Any]) -> set[str]:
    params = step.get("parameters") if isinstance(step.get("parameters"), dict) else {}
    if step.get("type") == "open" and isinstance(params.get("path"), str):
        app = SUFFIX_APPS.get(PurePosixPath(params["path"]).suffix.lower())
        return {app} if app else set()
    if step.get("type") not in ("launch", "execute", "command"):
        return set()
    command = params.get("command")
    argv = _argv(command)
    if not argv:
        return set()
    program = PurePosixPath(argv[0]).name
    if "/" in argv[0] and program not in PROGRAM_APPS:  # a script of the task's own (./setup.sh), or /bin/bash
        return set()
    if program in ("python", "python3"):  # the guest runs `python` as python3; OSWorld's steps use pyautogui
        return {"pyautogui"} if "pyautogui" in " ".join(argv) else {"python3"}
    if program in ("libreoffice", "soffice"):
        parts = {SUFFIX_APPS.get(PurePosixPath(a).suffix.lower()) for a in argv[1:]} - {None}
        return {p for p in parts if p} or {"libreoffice"}
    return {PROGRAM_APPS.get(program, program)}


def _argv(command: Any) -> list[str]:
    """The words of a step's command, its leading VAR=value assignments left out (``VLC_VERBOSE=-1 vlc``)."""
    if isinstance(command, list):
        words = [str(w) for w in command]
        if len(words) == 1:
            words = _split(words[0])
    elif isinstance(command, str):
        words = _split(command)
    else:
        return []
    while words and "=" in words[0] and not words[0].startswith(("/", "-")):
        words = words[1:]
    return words


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a shell string: its first word is still the program
        return text.split()


# --- what a provider has --------------------------------------------------------------------------


def lacking(provider: Provider, wanted: list[str]) -> list[str]:
    """The needs among ``wanted`` that ``provider`` does not have."""
    return [need for need in wanted if not has(provider, need)]


def has(provider: Provider, need: str) -> bool:
    app = APPS.get(need)
    if provider == "remote" or need in SHELL_BUILTINS:
        return True  # an OSWorld VM: OSWorld's tasks were written for its apps
    if provider == "xvfb":
        path = task_environment(":0")["PATH"]
        if app is None:
            return _on_path(need, path)
        return all(_on_path(p, path) for p in app.programs) and (app.module is None or _python_has(app.module, path))
    if app is None:
        return need in BASE_PROGRAMS or PROGRAM_PACKAGES.get(need) in _image_packages()
    if not app.debian:
        return False
    return all(_listed(p) for p in app.packages) and (app.module is None or _listed(f"python3-{app.module}")
                                                       or app.module in IMAGE_PYTHON_MODULES)


# Modules the image's Dockerfile copies from the guest's venv into the tasks' python3 (no Debian package has them)
IMAGE_PYTHON_MODULES = frozenset({"pyautogui"})


@cache
def _on_path(program: str, path: str) -> bool:
    return program in GUEST_PROGRAMS or shutil.which(program, path=path) is not None


@cache
def _python_has(module: str, path: str) -> bool:
    """Whether the tasks' python3 (on their PATH, not this process's virtualenv) imports ``module``."""
    python = shutil.which("python3", path=path)
    if python is None:
        return False
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False).returncode == 0


def _listed(name: str) -> bool:
    listed = _image_packages()
    if name == "libreoffice-core":  # every libreoffice-<part> package depends on it
        return any(p.startswith("libreoffice-") for p in listed)
    return name in listed


@cache
def _image_packages() -> frozenset[str]:
    """Every package of the docker image's lists (packages.txt and its variants, as packages-osworld.txt)."""
    return frozenset(word for path in sorted(IMAGE.glob("packages*.txt")) for word in _words(path))


def _words(path: Path) -> list[str]:
    return [line.split("#")[0].split()[0] for line in path.read_text(encoding="utf-8").splitlines()
            if line.split("#")[0].strip()]


__all__ = ["APPS", "PROVIDERS", "App", "Provider", "has", "lacking", "needs"]
