"""The desktop's AT-SPI accessibility tree, as OSWorld's judges read it: a task that sets ``accessibility``
gets its own session and AT-SPI buses (envs/accessibility.py) and its apps their bridges, and GET
/accessibility (guest/accessibility.py) gives the tree in OSWorld's XML, which desktop-env's own
PythonController, chrome getters and evaluation read through the VM server OSWorld's code is given
(osworld/connect.py). Every other task keeps the sandbox's environment (no bus, bridges off) and gets a 501.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.guest.accessibility import NO_PYATSPI, OFF, accessibility_tree
from pytest_retrace.replay.cases import Task
from tests.guests import osworld_module

_TRUE = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
WWW = 8000  # the task's own web server, on its loopback
DEADLINE = 90.0  # seconds for chromium to come up on a loaded machine
URL = f"http://127.0.0.1:{WWW}/page.html"
PAGE = "<!doctype html><html><head><title>Tree page</title></head><body><button>Press me</button></body></html>"
NOTE = "hello from the tree"
ST = "https://accessibility.ubuntu.example.org/ns/state"
CP = "https://accessibility.ubuntu.example.org/ns/component"
# what OSWorld's chrome tasks judge: the active tab's URL, read from Chrome's address bar in the tree
ACTIVE_TAB = {"func": "is_expected_active_tab", "result": {"type": "active_url_from_accessTree", "goto_prefix": "http://"},
              "expected": {"type": "rule", "rules": {"type": "url", "url": URL}}}


def tree_task(accessibility: bool) -> Task:
    """mousepad with a file, and google-chrome on a page of the task's own web server with DevTools on 9222, as
    OSWorld's chrome configs start it (socat 9222 -> 1337)."""
    setup: list[dict[str, Any]] = [
        {"type": "file", "path": "~/www/page.html", "content": PAGE},
        {"type": "file", "path": "~/note.txt", "content": NOTE},
        {"type": "launch", "command": ["python3", "-m", "http.server", str(WWW), "--bind", "127.0.0.1",
                                       "--directory", "/home/user/www"]},
        {"type": "launch", "command": ["mousepad", "/home/user/note.txt"], "window": "note.txt", "timeout": DEADLINE},
        {"type": "launch", "command": ["google-chrome", "--remote-debugging-port=1337", URL],
         "window": "^Tree page", "timeout": DEADLINE},
        {"type": "launch", "command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]},
    ]
    return Task.model_validate({"id": "tree", "instruction": "x", "domain": "test", "setup": setup,
                                "evaluator": _TRUE, "accessibility": accessibility})


@pytest.fixture(scope="module")
def osworld() -> SimpleNamespace:
    """desktop-env's PythonController and chrome getters, each module imported alone (osworld/package.py)."""
    return SimpleNamespace(python=osworld_module("desktop_env.controllers.python"),
                           chrome=osworld_module("desktop_env.evaluators.getters.chrome"))


def served(env: XvfbEnvironment, osworld: SimpleNamespace) -> tuple[Any, SimpleNamespace]:
    """The VM server OSWorld's code gets for `env`'s current task, and the DesktopEnv part its getters read."""
    from pytest_retrace.osworld.connect import vm_server

    server = vm_server(env)
    controller = osworld.python.PythonController(server.host, server.server_port)
    controller.retry_interval = 0.2
    return server, SimpleNamespace(controller=controller, vm_ip=server.host, chromium_port=server.chromium_port)


def wait_for(read: Any, what: str) -> Any:
    """`read()` once it is truthy: an app's bridge registers a moment after its window shows."""
    deadline = time.monotonic() + DEADLINE
    while not (value := read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {DEADLINE:g} s")
        time.sleep(0.5)
    return value


def applications(xml: str) -> dict[str, Any]:
    import lxml.etree

    root = lxml.etree.fromstring(xml.encode())
    assert root.tag == "desktop-frame"
    return {app.get("name"): app for app in root if app.tag == "application"}


# -- without a desktop -----------------------------------------------------------------------------------------


class _Backend:
    """A GuestBackend whose `run` gives one result, as the tree's script would end."""

    home, roots = "/home/user", ("/home/user", "/tmp")

    def __init__(self, code: int, output: str = "", error: str = "") -> None:
        self.result = {"status": "success", "output": output, "error": error, "returncode": code}

    def run(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        assert command[:2] == ["python3", "-c"] and not shell
        return self.result


@pytest.mark.parametrize(("code", "output", "status", "says"), [
    (OFF, "", 501, "sets `accessibility: true`"),
    (NO_PYATSPI, "pyatspi is not importable by this desktop's python3 (x): install python3-pyatspi", 501,
     "install python3-pyatspi"),
    (124, "", 500, "not read within 60 s"),
    (1, "", 500, "exit status 1): Traceback"),
    (0, "eJzLSM3JyVcozy/KSQEAGgQEXQ", 500, "is not whole"),  # cut short at the output cap
])
def test_a_tree_that_cannot_be_read_says_why(code: int, output: str, status: int, says: str) -> None:
    answer = accessibility_tree(_Backend(code, output, "Traceback ..."))  # type: ignore[arg-type]
    assert answer[0] == status and says in answer[1], answer


def test_an_osworld_task_whose_judge_reads_the_tree_must_turn_accessibility_on() -> None:
    from pytest_retrace.dataset.osworld_task import build_task

    osworld = {"id": "t", "evaluator": ACTIVE_TAB}
    with pytest.raises(ValueError, match=r"needs the accessibility tree .*: set `accessibility: true` on the task"):
        Task.model_validate({"id": "t", "instruction": "x", "domain": "chrome", "osworld": osworld})
    assert Task.model_validate({"id": "t", "instruction": "x", "domain": "chrome", "osworld": osworld,
                                "accessibility": True}).accessibility
    built = build_task({"id": "t", "instruction": "x", "evaluator": ACTIVE_TAB}, "chrome", "t", None)
    assert isinstance(built, Task) and built.accessibility, built
    plain = build_task({"id": "u", "instruction": "x", "evaluator": {"func": "infeasible"}}, "chrome", "u", None)
    assert isinstance(plain, Task) and not plain.accessibility, plain


def test_the_check_counts_a_tree_task_supported_and_runnable_where_the_provider_serves_the_tree() -> None:
    from pytest_retrace.dataset.osworld_apps import lacking, needs
    from pytest_retrace.dataset.osworld_check import task_problems
    from pytest_retrace.osworld.evaluate import evaluator_problems

    assert [r for r, _ in evaluator_problems(ACTIVE_TAB)] == ["needs the accessibility tree"]  # a task without it
    assert evaluator_problems(ACTIVE_TAB, accessibility=True) == []
    task = {"id": "t", "instruction": "x", "evaluator": ACTIVE_TAB}
    assert task_problems(task, "t", None) == []
    assert "accessibility tree" in needs(task)
    for provider in ("docker", "remote"):  # docker: its container starts the buses, its osworld image has pyatspi
        assert "accessibility tree" not in lacking(provider, needs(task)), provider


# -- on a desktop ----------------------------------------------------------------------------------------------


@pytest.mark.desktop
def test_with_accessibility_osworlds_getters_read_the_tree_of_mousepad_and_chrome(
        env: XvfbEnvironment, osworld: SimpleNamespace) -> None:
    from pytest_retrace.osworld.evaluate import evaluate

    started = time.monotonic()
    env.reset(tree_task(True), Path("."))
    reset = time.monotonic() - started
    server, desktop = served(env, osworld)
    # desktop-env's own controller, through the guest's GET /accessibility
    apps = wait_for(lambda: (xml := desktop.controller.get_accessibility_tree()) and
                    {"mousepad", "Google Chrome"} <= set(applications(xml)) and applications(xml), "mousepad and chrome")
    frame = apps["mousepad"].find("frame")
    assert "note.txt" in frame.get("name") and frame.get(f"{{{ST}}}showing") == "true"
    assert frame.get(f"{{{CP}}}screencoord").startswith("(") and frame.get(f"{{{CP}}}size").count(",") == 1
    assert any(NOTE in (node.text or "") for node in apps["mousepad"].iter()), "the text view's text"
    assert any(node.get("name") == "Press me" and node.tag == "push-button" for node in apps["Google Chrome"].iter())
    # desktop-env's chrome getters find the active tab's URL in Chrome's address bar, then the tab through DevTools
    url = wait_for(lambda: osworld.chrome.get_active_url_from_accessTree(desktop, {"goto_prefix": "http://"}),
                   "address bar")
    assert url == URL
    info = osworld.chrome.get_active_tab_info(desktop, {"goto_prefix": "http://"})
    assert info is not None and info["title"] == "Tree page" and info["url"] == URL, info
    # and OSWorld's evaluation of such a task judges it; another URL scores 0 (the tree is served: the agent's)
    assert evaluate(ACTIVE_TAB, server, env.root / "cache").score == 1.0
    other = {**ACTIVE_TAB, "expected": {"type": "rule", "rules": {"type": "url", "url": "http://127.0.0.1:1/"}}}
    assert evaluate(other, server, env.root / "cache").score == 0.0
    # the raw tree, as OSWorld's thunderbird and multi_apps tasks judge it: XPath with OSWorld's namespaces
    showing = "//application[@name='mousepad']//*[@st:showing='true' and contains(text(), '{}')]"
    rule = {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": showing.format(NOTE)}]}}
    assert evaluate(rule, server, env.root / "cache").score == 1.0
    rule["expected"] = {"type": "rule", "rules": [{"xpath": showing.format("not in the note")}]}
    assert evaluate(rule, server, env.root / "cache").score == 0.0
    print(f"reset with accessibility {reset:.2f} s (buses {env.bus_seconds:.2f} s)")


@pytest.mark.desktop
def test_without_accessibility_the_sandbox_is_unchanged_and_the_tree_a_501(
        env: XvfbEnvironment, osworld: SimpleNamespace) -> None:
    from pytest_retrace.osworld.evaluate import evaluate

    env.reset(tree_task(True), Path("."))  # the buses of a task with it end with that task
    env.reset(tree_task(False), Path("."))
    shown = dict(line.split("=", 1) for line in env.run("env").stdout.splitlines() if "=" in line)
    assert (shown["DBUS_SESSION_BUS_ADDRESS"], shown["NO_AT_BRIDGE"], shown["GTK_A11Y"]) == ("disabled:", "1", "none")
    assert "ACCESSIBILITY_ENABLED" not in shown
    running = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in env.session_pids()}
    assert {"mousepad", "socat"} <= running and not running & {"dbus-daemon", "at-spi-bus-laun", "at-spi2-registr"}
    server, desktop = served(env, osworld)
    assert desktop.controller.get_accessibility_tree() is None  # a 501: never a made-up tree
    import requests

    reply = requests.get(f"http://{server.host}:{server.server_port}/accessibility", timeout=60)
    assert reply.status_code == 501 and "accessibility: true" in reply.json()["error"]
    with pytest.raises(EvaluatorError, match="the desktop serves no accessibility tree"):
        evaluate(ACTIVE_TAB, server, env.root / "cache")


@pytest.mark.desktop
def test_an_app_opened_from_the_menu_gets_the_current_tasks_environment(env: XvfbEnvironment) -> None:
    import subprocess

    launcher = env.root / "wm-home" / "bin" / "retrace-launch"
    for accessibility, bus in ((True, "unix:path=/tmp/.runtime-user/bus"), (False, "disabled:")):
        env.reset(Task.model_validate({"id": "m", "instruction": "x", "domain": "test", "evaluator": _TRUE,
                                       "accessibility": accessibility}), Path("."))
        subprocess.run([str(launcher), "/bin/sh", "-c", "echo $DBUS_SESSION_BUS_ADDRESS > /tmp/bus"], timeout=60,
                       check=True)
        assert wait_for(lambda: env.read_file("/tmp/bus"), "/tmp/bus").decode().strip() == bus
