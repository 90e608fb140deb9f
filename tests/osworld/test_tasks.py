"""The project's own OSWorld-format tasks (rollouts/osworld/): every task file in OSWorld's schema, its config and
evaluator accepted by the checks desktop-env's code runs under (with the cache make_files.py writes), its files
generated the same every time, and one calc task recorded end to end on a real desktop, judged by OSWorld's own
compare_table: the scripted rollout scores 1, the same rollout one action short scores 0."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_retrace.actions import parse_action
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.osworld import package
from tests.guests import needs_desktop
from tests.helpers import REPO

pytestmark = pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")

ROLLOUTS = REPO / "rollouts" / "osworld"
DOMAINS = ("libreoffice_calc", "libreoffice_impress", "libreoffice_writer", "chrome", "gimp", "os", "thunderbird",
           "vlc", "multi_apps")
KEYS = {"id", "snapshot", "instruction", "source", "config", "related_apps", "evaluator"}
TASK_FILES = sorted((ROLLOUTS / "tasks").glob("*/*.json"))


def _module(name: str) -> ModuleType:
    """A script of rollouts/osworld/ (not a package: they import each other by their directory)."""
    if str(ROLLOUTS) not in sys.path:
        sys.path.insert(0, str(ROLLOUTS))
    return __import__(name)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("osworld-cache")
    _module("make_files").make(root)
    return root


def test_there_are_24_tasks_over_every_domain_each_with_its_rollout() -> None:
    domains = Counter(p.parent.name for p in TASK_FILES)
    assert len(TASK_FILES) >= 24
    assert {d: domains[d] for d in DOMAINS if domains[d] < 2} == {}, domains
    record = _module("record")
    rollouts = record.rollouts()
    assert sorted(r.task_id for r in rollouts) == sorted(p.stem for p in TASK_FILES)
    for r in rollouts:  # one action per step, as OSWorld's importer and the case schema require
        assert len(r.actions) >= 2 and all(len(parse_action(code)) == 1 for code in r.actions), r.slug


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: f"{p.parent.name}/{p.stem[:8]}")
def test_a_task_is_in_osworlds_schema_and_passes_the_checks(path: Path, cache: Path) -> None:
    from pytest_retrace.osworld.evaluate import validate
    from pytest_retrace.osworld.setup import validate_config

    task: dict[str, Any] = json.loads(path.read_text())
    assert KEYS <= task.keys() and task["id"] == path.stem and task["snapshot"] == path.parent.name
    assert task["source"] == "pytest-retrace" and task["instruction"].strip()
    validate_config(task["config"], "config", cache, task["id"])
    validate(task["evaluator"], cache_dir=cache / task["id"])  # every cloud_file is in the cache as well


def test_the_files_are_the_same_bytes_every_time(cache: Path, tmp_path: Path) -> None:
    _module("make_files").make(tmp_path)

    def files(root: Path) -> Iterator[tuple[str, bytes]]:
        return ((str(p.relative_to(root)), p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file())

    again = dict(files(tmp_path))
    assert again and again == dict(files(cache))


def test_a_missing_cache_file_is_named(cache: Path, tmp_path: Path) -> None:
    """The check would catch a task whose download the cache lacks (so the test above could fail)."""
    from pytest_retrace.evaluators import EvaluatorError
    from pytest_retrace.osworld.setup import validate_config

    task = json.loads(TASK_FILES[0].read_text())
    (tmp_path / task["id"]).mkdir()
    with pytest.raises(EvaluatorError, match="cloud file not in cache"):
        validate_config(task["config"], "config", tmp_path, task["id"])


@pytest.mark.desktop
@needs_desktop
def test_a_calc_task_recorded_end_to_end_scores_1_and_0_one_action_short(cache: Path, tmp_path: Path) -> None:
    record = _module("record")
    rollout = next(r for r in record.rollouts() if r.slug == "calc-total")
    env = XvfbEnvironment()
    env.start()
    try:
        full = record.record(env, rollout, cache, tmp_path / "full")
        short = record.record(env, rollout, cache, tmp_path / "short", actions=rollout.actions[:-1])
    finally:
        env.close()
    assert (full.result, short.result) == (1.0, 0.0), (full.details, short.details)
    run = tmp_path / "full" / "pyautogui" / "screenshot" / "scripted" / "libreoffice_calc" / rollout.task_id
    lines = [json.loads(line) for line in (run / "traj.jsonl").read_text().splitlines()]
    assert [line["action"] for line in lines] == rollout.actions
    assert all((run / line["screenshot_file"]).is_file() for line in lines)
    assert (run / "result.txt").read_text().strip() == "1.0"
    assert "compare_table" in " ".join(full.details)
