"""The desktop's AT-SPI tree on the docker provider: a task that sets ``accessibility`` gets a container started
with ``--accessibility`` (guest/container.py: its own session and AT-SPI buses, envs/accessibility.py, as the xvfb
provider's reset starts them), and GET /accessibility reads the tree with the ``osworld`` image variant's pyatspi;
every other task's container is the one it always was, and its tree a 501. On the default image (no pyatspi) such
a task fails at reset, naming the variant.

Skipped when no engine answers, except under CI (RETRACE_REQUIRE_DOCKER=1). The osworld image is built on first
use (about 200 s), then reused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.docker.environment import DockerEnvironment
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.replay.cases import Task
from tests.envs.test_accessibility import CP, NOTE, ST, applications, served, wait_for
from tests.guests import osworld_module
from tests.helpers import docker_client

pytestmark = pytest.mark.desktop

SIZE = (1024, 768)
_TRUE = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
SHOWING = "//application[@name='mousepad']//*[@st:showing='true' and contains(text(), '{}')]"


def note_task(accessibility: bool, task_id: str = "docker-tree") -> Task:
    setup = [{"type": "file", "path": "~/note.txt", "content": NOTE},
             {"type": "launch", "command": ["mousepad", "/home/user/note.txt"], "window": "note.txt", "timeout": 90}]
    return Task.model_validate({"id": task_id, "instruction": "x", "domain": "test", "setup": setup,
                                "evaluator": _TRUE, "accessibility": accessibility})


def _docker(**options: Any) -> Iterator[DockerEnvironment]:
    if docker_client() is None:
        pytest.skip("no docker engine answers (under CI, RETRACE_REQUIRE_DOCKER=1 makes this a failure)")
    env = DockerEnvironment(size=SIZE, **options)
    env.start()  # builds the image on first use
    try:
        yield env
    finally:
        env.close()


@pytest.fixture(scope="module")
def container() -> Iterator[DockerEnvironment]:
    yield from _docker(variant="osworld")


@pytest.fixture(scope="module")
def osworld() -> SimpleNamespace:
    return SimpleNamespace(python=osworld_module("desktop_env.controllers.python"))


def _tree(env: DockerEnvironment) -> tuple[int, Any]:
    """GET /accessibility of the container's own guest: (status, its JSON)."""
    reply = env.guest.client.request("GET", "/accessibility", timeout=90)
    return reply.status, reply.json()


def test_with_accessibility_the_containers_guest_serves_the_tree_and_osworlds_getter_reads_it(
        container: DockerEnvironment, osworld: SimpleNamespace, tmp_path: Path) -> None:
    from pytest_retrace.osworld.evaluate import evaluate

    started = time.monotonic()
    container.reset(note_task(True), Path("."))
    reset = time.monotonic() - started
    # the container's own guest: its python3 and pyatspi, as the task's user on the task's bus
    apps = wait_for(lambda: (answer := _tree(container))[0] == 200 and "mousepad" in applications(answer[1]["AT"])
                    and applications(answer[1]["AT"]), "mousepad in the container's tree")
    frame = apps["mousepad"].find("frame")
    assert "note.txt" in frame.get("name") and frame.get(f"{{{ST}}}showing") == "true"
    assert frame.get(f"{{{CP}}}screencoord").startswith("(") and frame.get(f"{{{CP}}}size").count(",") == 1
    assert any(NOTE in (node.text or "") for node in apps["mousepad"].iter()), "the text view's text"
    # desktop-env's own controller, through the VM server in front of the environment
    server, desktop = served(container, osworld)  # type: ignore[arg-type]
    xml = desktop.controller.get_accessibility_tree()
    assert xml is not None and "mousepad" in applications(xml)
    # desktop-env's accessibility_tree getter and check_accessibility_tree, as OSWorld's judges read it
    rule = {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": SHOWING.format(NOTE)}]}}
    assert evaluate(rule, server, tmp_path).score == 1.0
    rule["expected"] = {"type": "rule", "rules": [{"xpath": SHOWING.format("not in the note")}]}
    assert evaluate(rule, server, tmp_path).score == 0.0
    print(f"docker reset with accessibility (mousepad): {reset:.2f} s")


def test_without_accessibility_the_container_is_unchanged_and_the_tree_a_501(
        container: DockerEnvironment, osworld: SimpleNamespace, tmp_path: Path) -> None:
    from pytest_retrace.osworld.evaluate import evaluate

    started = time.monotonic()
    container.reset(note_task(False), Path("."))
    reset = time.monotonic() - started
    shown = dict(line.split("=", 1) for line in container.run("env").stdout.splitlines() if "=" in line)
    assert (shown["DBUS_SESSION_BUS_ADDRESS"], shown["NO_AT_BRIDGE"], shown["GTK_A11Y"]) == ("disabled:", "1", "none")
    assert "ACCESSIBILITY_ENABLED" not in shown
    assert container.run("pgrep -x dbus-daemon").returncode == 1, "no bus in a container made without it"
    status, body = _tree(container)
    assert status == 501 and "accessibility: true" in body["error"], (status, body)
    server, desktop = served(container, osworld)  # type: ignore[arg-type]
    assert desktop.controller.get_accessibility_tree() is None  # a 501: never a made-up tree
    rule = {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": SHOWING.format(NOTE)}]}}
    with pytest.raises(EvaluatorError, match="the desktop serves no accessibility tree"):
        evaluate(rule, server, tmp_path)
    print(f"docker reset without accessibility (mousepad): {reset:.2f} s")


def test_a_task_with_accessibility_never_takes_the_spare_made_without_it() -> None:
    for env in _docker(variant="osworld", spare=True):
        env.reset(note_task(False, "plain"), Path("."))  # leaves a spare booting, made without the buses
        env.reset(note_task(True), Path("."))
        shown = env.run("printenv DBUS_SESSION_BUS_ADDRESS").stdout.strip()
        assert shown == "unix:path=/tmp/.runtime-user/bus", shown
        assert wait_for(lambda e=env: (answer := _tree(e))[0] == 200 and "mousepad" in applications(answer[1]["AT"]),
                        "mousepad in the tree")
        env.reset(note_task(False, "plain"), Path("."))  # the spare made during the last reset: no buses
        assert env.run("printenv DBUS_SESSION_BUS_ADDRESS").stdout.strip() == "disabled:"


def test_on_the_default_image_a_task_with_accessibility_fails_at_reset_naming_the_variant() -> None:
    for env in _docker():
        with pytest.raises(EnvError, match=r"exited .*before serving: .*no pyatspi.*variant=osworld"):
            env.reset(note_task(True), Path("."))
