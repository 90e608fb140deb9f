"""The apps an OSWorld task needs (its steps' programs, the app its files open in, its getters' app) and which
provider has them: `retrace osworld check --provider` tells "the harness supports it" from "this provider runs it"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_retrace.cli import main
from pytest_retrace.dataset import osworld_apps
from pytest_retrace.dataset.osworld_apps import has, lacking, needs

TASK = {
    "id": "t", "instruction": "x",
    "config": [
        {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
        {"type": "launch", "parameters": {"command": "socat tcp-listen:9222,fork tcp:localhost:1337", "shell": True}},
        {"type": "open", "parameters": {"path": "/home/user/Desktop/sales.XLSX"}},
        {"type": "launch", "parameters": {"command": "VLC_VERBOSE=-1 vlc --no-audio", "shell": True}},
        {"type": "launch", "parameters": {"command": ["/usr/bin/thunderbird"]}},
        {"type": "execute", "parameters": {"command": ["./setup.sh"]}},  # the task's own script: no app
        {"type": "execute", "parameters": {"command": "cd ~ && mkdir x", "shell": True}},
    ],
    "evaluator": {
        "func": "is_vlc_playing", "result": {"type": "vlc_playing_info"},
        "postconfig": [{"type": "execute", "parameters": {"command": [
            "python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's')"]}}],
    },
}


def test_a_tasks_needs_are_read_from_its_steps_and_getters() -> None:
    assert needs(TASK) == ["cd", "chrome", "libreoffice calc", "pyautogui", "socat", "thunderbird", "vlc"]
    assert needs({"evaluator": {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"}}}) == ["chrome"]
    assert needs({"config": [{"type": "launch", "parameters": {"command": ["code", "~/project"]}}]}) == ["vs code"]
    assert needs({"config": [{"type": "execute", "parameters": {"command": [
        "libreoffice", "--headless", "--convert-to", "pdf", "/home/user/a.docx"]}}]}) == ["libreoffice writer"]


def test_each_provider_has_what_it_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # xvfb: the tasks' PATH, here a directory holding only gimp (and google-chrome is the desktop's own launcher)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gimp", "chromium"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(osworld_apps, "task_environment", lambda display: {"PATH": str(bin_dir)})
    assert lacking("xvfb", ["gimp", "chrome", "vlc", "cd", "socat", "pyautogui"]) == ["vlc", "socat", "pyautogui"]
    assert not has("xvfb", "vs code")
    # docker: the image's package lists; VS Code is in no Debian package, so only an OSWorld VM has it
    assert has("docker", "chrome") and has("docker", "mkdir") and not has("docker", "vs code")
    assert not has("docker", "a-program-no-package-is-known-for")
    # a Python module from a python3-<module> package only, or the Dockerfile's copy (pyautogui: no Debian package)
    assert has("docker", "pyautogui")
    # the tree: pyatspi from python3-pyatspi (the osworld variant's list) and the buses from at-spi2-core
    assert has("docker", "accessibility tree")
    assert lacking("remote", ["vs code", "gimp", "anything"]) == []


def test_check_counts_the_supported_tasks_a_provider_cannot_run(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    evaluator = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "ls"},
                 "expected": {"type": "rule", "rules": {"expected": "x"}}}
    for domain, task_id, command in [("vs_code", "code-1", "code"), ("vs_code", "code-2", "code"),
                                     ("os", "ls-1", "ls")]:
        path = tmp_path / domain / f"{task_id}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"id": task_id, "instruction": "x", "evaluator": evaluator,
                                    "config": [{"type": "launch", "parameters": {"command": [command]}}]}))
    assert main(["osworld", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ok  vs_code/code-1: not runnable on xvfb here, it lacks vs code" in out and "ok  os/ls-1" in out
    assert out[-2:] == ["of the 3 supported, 1 runnable on xvfb here (2 need an app: vs code 2)",
                        "3 supported, 0 not supported (of 3)"]
    assert main(["osworld", "check", str(tmp_path), "--provider", "remote"]) == 0
    assert capsys.readouterr().out.splitlines()[-2] == "of the 3 supported, 3 runnable on remote here"
    assert main(["osworld", "check", str(tmp_path), "--provider", "docker", "--json"]) == 0
    rows = {r["id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["code-1"]["lacking"] == ["vs code"] and rows["code-1"]["runnable"] is False
    assert rows["ls-1"]["runnable"] is True and rows["ls-1"]["provider"] == "docker"


def test_the_images_python_modules_are_the_ones_its_dockerfile_copies() -> None:
    from pytest_retrace.dataset.osworld_apps import IMAGE, IMAGE_PYTHON_MODULES, has

    dockerfile = (IMAGE / "Dockerfile").read_text(encoding="utf-8")
    for module in IMAGE_PYTHON_MODULES:
        assert f'"$site/{module}"' in dockerfile and "/usr/local/lib/python3.11/dist-packages" in dockerfile
    assert has("docker", "pyautogui")
