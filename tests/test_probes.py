"""Error-state probes on a real desktop: a case whose error screen equals its target screen is verified by a
probe, replay refuses an error state the probe does not confirm, and the recovery's probe results tell the
oracle's restore from doing nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pytest_retrace.actions import parse_action
from pytest_retrace.agents.baselines import NoopAgent, OracleAgent
from pytest_retrace.build.verify import Rejected, verify_candidate
from pytest_retrace.cases import load_case
from pytest_retrace.envs.desktop import DESKTOP_MENU
from pytest_retrace.envs.xvfb import XvfbEnvironment
from pytest_retrace.probes import FileGetter, digest
from pytest_retrace.records import Record
from pytest_retrace.replay import ReplayOptions, run_case

pytestmark = pytest.mark.desktop

TERMINAL = list(dict(DESKTOP_MENU)["Terminal"])
TASK = {
    "id": "probe-task", "instruction": "Write hi into ~/out.txt", "domain": "terminal",
    "setup": [{"type": "launch", "command": TERMINAL, "window": "xterm"}],
    # the task's outcome: exactly one file, out.txt (so a stray ~/flag fails it)
    "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "ls ~"},
                  "expected": {"type": "rule", "rules": "out.txt\n"}},
}
GT = ["pyautogui.write('echo hi > ~/out.txt\\n')"]
# a mistake the screen cannot show: a file made, then the screen cleared back to a fresh prompt
HIDDEN = ["pyautogui.write('touch ~/flag; clear\\n')"]


def _write_case(tmp: Path, env: XvfbEnvironment, perturbation: list[str], probe_target: str) -> Path:
    from pytest_retrace.cases import Task

    task = Task.model_validate(TASK)
    env.reset(task, tmp)
    target = env.screenshot()
    for a in perturbation:
        env.execute(parse_action(a)[0])
    error = env.screenshot()
    for name, shot in (("target", target), ("error", error)):
        Image.fromarray(shot).save(tmp / f"{name}.png")
    doc = {"id": "hidden", "task": TASK, "trajectory": GT, "t_seed": 0, "perturbation": perturbation, "d": 1,
           "screenshots": {"target": "target.png", "error": "error.png"},
           "probes": [{"get": {"type": "file", "path": "~/flag"}, "target": probe_target}]}
    path = tmp / "hidden.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def env():
    e = XvfbEnvironment()
    e.start()
    yield e
    e.close()


def test_the_build_finds_the_probe_that_tells_an_identical_error_screen_apart(env: XvfbEnvironment,
                                                                               tmp_path: Path) -> None:
    from pytest_retrace.cases import Task

    task = Task.model_validate(TASK)
    hidden = [parse_action(a)[0] for a in HIDDEN]
    gt = [parse_action(a)[0] for a in GT]
    flag, out = FileGetter(type="file", path="~/flag"), FileGetter(type="file", path="~/out.txt")
    # out.txt is the same (missing) in both states; only the flag tells them apart
    got = verify_candidate(env, task, tmp_path, [], hidden, gt, runs=2, threshold=0.99, intent=None,
                           probes=[out, flag])
    assert got.identical and got.kind == "hidden-state" and not got.suffix_passes
    assert [p.get for p in got.probes] == [flag] and got.probes[0].target == digest(b"missing")
    with pytest.raises(Rejected) as exc:
        verify_candidate(env, task, tmp_path, [], hidden, gt, runs=2, threshold=0.99, intent=None, probes=[out])
    assert exc.value.reason == "unverifiable" and "file ~/out.txt" in str(exc.value)


def test_replay_checks_the_probe_and_records_whether_the_recovery_restored_it(env: XvfbEnvironment,
                                                                              tmp_path: Path) -> None:
    case = load_case(_write_case(tmp_path, env, HIDDEN, digest(b"missing")))
    assert np.array_equal(np.asarray(Image.open(case.target_png)), np.asarray(Image.open(case.error_png)))
    opts = ReplayOptions(budget=2, strategy="explicit-none")
    oracle = run_case(env, case, OracleAgent(), opts)
    noop = run_case(env, case, NoopAgent(), opts)
    assert oracle.error is None and noop.error is None, (oracle.error, noop.error)
    assert oracle.probes == {"file ~/flag": True} and noop.probes == {"file ~/flag": False}
    record = Record.of_result(noop, nodeid="n", case=case, model="noop", strategy="implicit", budget=2)
    assert [(p.probe, p.restored) for p in record.probes] == [("file ~/flag", False)]


def test_an_error_state_the_probe_does_not_confirm_is_an_infrastructure_error(env: XvfbEnvironment,
                                                                             tmp_path: Path) -> None:
    # the same screens, but the perturbation no longer makes the flag: pixels alone would accept it
    case = load_case(_write_case(tmp_path, env, ["pyautogui.write('clear\\n')"], digest(b"missing")))
    result = run_case(env, case, NoopAgent(), ReplayOptions(budget=1, attempts=2))
    assert result.error is not None and result.error.kind == "desync"
    assert "probe file ~/flag still has its target value" in result.error.message
