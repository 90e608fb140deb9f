"""replay/judge.py: an OSWorld task judged on a real desktop waits, after its postconfig, for what the postconfig
started (OSWorld's save postconfig presses ctrl+s and sleeps 0.5 s; a loaded LibreOffice wrote its file later, and
the getter read the old one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.osworld import package
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.judge import judge
from tests.guests import needs_desktop

pytestmark = [pytest.mark.desktop, needs_desktop,
              pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")]

# like an app saving: busy for 2 s, then the file is there
SAVE = ("python3 -c \"import time; t = time.time()\nwhile time.time() - t < 2: pass\n"
        "open('/home/user/saved.txt', 'w').write('saved')\"")


def saving_task() -> Task:
    evaluator = {"postconfig": [{"type": "launch", "parameters": {"command": SAVE, "shell": True}}],
                 "func": "exact_match", "result": {"type": "vm_command_line", "command": "cat ~/saved.txt", "shell": True},
                 "expected": {"type": "rule", "rules": {"expected": "saved"}}}
    return Task.model_validate({"id": "judge-wait", "instruction": "x", "domain": "os",
                                "osworld": {"id": "judge-wait", "config": [], "evaluator": evaluator}})


def test_the_getters_read_the_desktop_once_what_the_postconfig_started_is_done(env: XvfbEnvironment) -> None:
    task = saving_task()
    env.reset(task, Path("."))
    judged = judge(task, env, Path("."))
    assert judged.passed, judged.details
    assert judged.details[0] == "postconfig: 1 step(s) run" and len(judged.details) == 2, judged.details


def test_without_the_wait_the_getter_reads_too_early(env: XvfbEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above could fail: judged at once, the file is not there yet."""
    from pytest_retrace.replay import judge as judge_module

    monkeypatch.setattr(judge_module, "_after_postconfig", lambda env: None)
    task = saving_task()
    env.reset(task, Path("."))
    assert not judge(task, env, Path(".")).passed
