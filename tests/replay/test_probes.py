"""Error-state probes on a real desktop: a case whose error screen equals its target screen is verified by a
probe, replay refuses an error state the probe does not confirm, and the recovery's probe results tell the
oracle's restore from doing nothing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pytest_retrace.actions import parse_action
from pytest_retrace.agents import ModelConfig
from pytest_retrace.agents.baselines import NoopAgent, OracleAgent
from pytest_retrace.dataset.verify import Rejected, verify_candidate
from pytest_retrace.envs.desktop import DESKTOP_MENU
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.probes import FileGetter, digest
from pytest_retrace.replay.result import ReplayOptions
from pytest_retrace.replay.run import run_case
from pytest_retrace.results.caserun import CaseRun
from pytest_retrace.results.records import Record
from pytest_retrace.results.stats import summarize
from tests.helpers import REPO

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
    from pytest_retrace.replay.cases import Task

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
    from pytest_retrace.replay.cases import Task

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
    record = Record.of_result(CaseRun(case, ModelConfig("noop", "noop"), "implicit", 2), noop, nodeid="n")
    assert [(p.probe, p.restored) for p in record.probes] == [("file ~/flag", False)]


def test_an_error_state_the_probe_does_not_confirm_is_an_infrastructure_error(env: XvfbEnvironment,
                                                                             tmp_path: Path) -> None:
    # the same screens, but the perturbation no longer makes the flag: pixels alone would accept it
    case = load_case(_write_case(tmp_path, env, ["pyautogui.write('clear\\n')"], digest(b"missing")))
    result = run_case(env, case, NoopAgent(), ReplayOptions(budget=1, attempts=2))
    assert result.error is not None and result.error.kind == "desync"
    assert "probe file ~/flag still has its target value" in result.error.message


def test_a_process_probe_sees_a_background_job_but_not_an_alias(env: XvfbEnvironment, tmp_path: Path) -> None:
    """The process probe reads what /proc shows of the task's shell, from inside its sandbox: a background job
    is a child process, but an alias lives only in the shell's memory (hence `verified_by: determinism`)."""
    from pytest_retrace.replay.cases import Task
    from pytest_retrace.replay.probes import ProcessGetter, probe_value

    task = Task.model_validate(TASK)
    shell = ProcessGetter(type="process", name="bash", read=["cwd", "fds", "children", "cmdline"])
    # ptys held elsewhere on the host (here: by this test, under xdist by other workers' terminals) push the
    # xterm's /dev/pts number up; released before the second reset, its number falls: the value must not move
    held = [os.openpty() for _ in range(3)]
    env.reset(task, tmp_path)
    fresh = env.run(shell.command).stdout
    # one line: the xterm's bash, its home, its terminal; no pid, no pty number, no harness path
    assert fresh.count("\n") == 1 and "cwd /home/user\t" in fresh and "fd 0 /dev/pts\t" in fresh, fresh
    assert "retrace" not in fresh and "child" not in fresh
    env.execute(parse_action("pyautogui.write('alias echo=false; clear\\n')")[0])
    assert env.run(shell.command).stdout == fresh  # the alias changed nothing the probe can read
    env.execute(parse_action("pyautogui.write('sleep 600 & clear\\n')")[0])
    job = env.run(shell.command).stdout
    assert "child sleep 600 \t" in job and job.replace("child sleep 600 \t", "") == fresh
    for fd in (fd for pair in held for fd in pair):
        os.close(fd)
    env.reset(task, tmp_path)  # a new sandbox, new pids, another pty number: the same value
    assert probe_value(env, shell) == digest(b"0\n" + fresh.encode())


def test_a_process_probe_reads_a_launched_app_and_never_its_own_shell(env: XvfbEnvironment, tmp_path: Path) -> None:
    """A launched app's session and process group lie outside the task's pid namespace (they read 0 in /proc,
    as the probe's own shell's session does): the probe left it out with its own processes and read nothing."""
    from pytest_retrace.replay.cases import Task
    from pytest_retrace.replay.probes import ProcessGetter

    env.reset(Task.model_validate(TASK), tmp_path)
    xterm = env.run(ProcessGetter(type="process", name="xterm", read=["cwd", "cmdline"]).command).stdout
    assert xterm.count("\n") == 1 and "cmdline xterm -fa DejaVu Sans Mono" in xterm and "cwd /home/user\t" in xterm
    # the probe's shell (sh) and its subshells are not the task's: a task's own sh is
    assert env.run(ProcessGetter(type="process", name="sh", read=["cmdline"]).command).stdout == ""
    env.execute(parse_action("pyautogui.write('sh -c \\'sleep 600\\' & clear\\n')")[0])
    assert "cmdline sh -c sleep 600" in env.run(ProcessGetter(type="process", name="sh", read=["cmdline"]).command).stdout


def test_a_case_verified_by_determinism_only_is_recovered_by_the_oracle_not_by_noop(env: XvfbEnvironment) -> None:
    """The alias case (tests/data/alias-case): its error state is vouched for by its recording only, so replay
    checks pixels and no probe, and R_TC alone tells the oracle's restore (a fresh shell) from doing nothing."""
    case = load_case(REPO / "tests" / "data" / "alias-case" / "alias-echo.yaml")
    assert case.error_state_verified_by == "determinism"
    opts = ReplayOptions(budget=2, strategy="explicit-none")
    oracle = run_case(env, case, OracleAgent(), opts)
    noop = run_case(env, case, NoopAgent(), opts)
    assert oracle.error is None and noop.error is None, (oracle.error, noop.error)
    assert (oracle.r_o, oracle.r_tc, oracle.recovered) == (True, True, True)
    assert (noop.r_o, noop.r_tc, noop.recovered) == (True, False, False)
    assert oracle.probes == {} and noop.probes == {}
    # the record and the summary say which of its tests rest on the recording alone
    records = [Record.of_result(CaseRun(case, ModelConfig(m, m), "explicit-none", 2), r, nodeid=f"n{i}")
               for i, (r, m) in enumerate(((oracle, "oracle"), (noop, "noop")))]
    assert {r.error_state_verified_by for r in records} == {"determinism"}
    assert summarize(records).n_verified_by_determinism == 2
