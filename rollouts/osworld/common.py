"""What the OSWorld-format tasks of this project share: their ids, where their files are said to come from, and
the config/evaluator pieces OSWorld's own task files use (written by gen_tasks.py, read by make_files.py and
record.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"
ACTIONS = HERE / "actions"
HOME = "/home/user"
# Nothing is downloaded here: a URL only names a file, which make_files.py writes into the cache under the name
# desktop-env's SetupController and cloud_file getter look for first. example.org is reserved (RFC 2606).
BASE_URL = "https://example.org/pytest-retrace/osworld"
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, BASE_URL)


def task_id(slug: str) -> str:
    """A task's OSWorld id: a UUID, as OSWorld's are, fixed by the task's short name."""
    return str(uuid.uuid5(_NAMESPACE, slug))


def url(domain: str, slug: str, name: str) -> str:
    return f"{BASE_URL}/{domain}/{task_id(slug)}/{name}"


def download_name(file_url: str, path: str) -> str:
    """The cache name of a download step's file (desktop-env's SetupController._download_setup)."""
    return f"{uuid.uuid5(uuid.NAMESPACE_URL, file_url)}_{os.path.basename(path)}"


def download(domain: str, slug: str, *names: str, into: str = HOME) -> dict[str, Any]:
    return {"type": "download", "parameters": {"files": [
        {"url": url(domain, slug, name), "path": f"{into}/{name}"} for name in names]}}


OFFICE_TYPES = {
    ".xlsx": ("libreoffice-calc.desktop", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
    ".docx": ("libreoffice-writer.desktop",
              "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    ".pptx": ("libreoffice-impress.desktop",
              "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
}


def office_default(path: str) -> dict[str, Any]:
    """LibreOffice made the default app of ``path``'s type, as on OSWorld's VMs, before an ``open`` step: with
    Gnumeric installed too, xdg-open's choice would depend on the desktop's MIME cache."""
    desktop, mime = OFFICE_TYPES[os.path.splitext(path)[1]]
    return execute(["xdg-mime", "default", desktop, mime])


def open_file(path: str) -> dict[str, Any]:
    return {"type": "open", "parameters": {"path": path}}


def launch(command: list[str] | str, shell: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"command": command}
    if shell:
        params["shell"] = True
    return {"type": "launch", "parameters": params}


def execute(command: list[str] | str, shell: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"command": command}
    if shell:
        params["shell"] = True
    return {"type": "execute", "parameters": params}


def sleep(seconds: float) -> dict[str, Any]:
    return {"type": "sleep", "parameters": {"seconds": seconds}}


def activate(window: str, strict: bool = True) -> dict[str, Any]:
    return {"type": "activate_window", "parameters": {"window_name": window, "strict": strict}}


def save_postconfig(window: str) -> list[dict[str, Any]]:
    """OSWorld's LibreOffice postconfig, as its own task files write it: the document's window in front, Ctrl+S
    by pyautogui, a pause."""
    return [activate(window), sleep(0.5),
            execute(["python", "-c", 'import pyautogui; pyautogui.hotkey("ctrl", "s");']), sleep(0.5)]


def vm_file(path: str, dest: str | None = None) -> dict[str, Any]:
    return {"type": "vm_file", "path": path, "dest": dest or os.path.basename(path)}


def cloud_file(domain: str, slug: str, name: str) -> dict[str, Any]:
    return {"type": "cloud_file", "path": url(domain, slug, name), "dest": name}


def command_line(command: str) -> dict[str, Any]:
    return {"type": "vm_command_line", "command": command, "shell": True}


def rule(**rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def task(slug: str, snapshot: str, instruction: str, config: list[dict[str, Any]], apps: list[str],
         evaluator: dict[str, Any]) -> dict[str, Any]:
    """A task file in OSWorld's schema (evaluation_examples/examples/<domain>/<id>.json)."""
    return {"id": task_id(slug), "snapshot": snapshot, "instruction": instruction, "source": "pytest-retrace",
            "config": config, "trajectory": "trajectories/", "related_apps": apps, "evaluator": evaluator,
            "proxy": False, "fixed_ip": False, "possibility_of_env_change": "low"}
