"""The task's command runner (envs/xvfb/runner.py) on a real desktop: a command it starts is the same task process
the sandbox's chain starts, and nothing the task does to it changes a command's result or becomes an error."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs.desktop import DESKTOP_MENU
from pytest_retrace.envs.xvfb import runner as runner_module
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.envs.xvfb.runner import LOST, Commands
from pytest_retrace.envs.xvfb.sandbox import available
from pytest_retrace.replay.cases import Task
from tests.helpers import REPO

pytestmark = [pytest.mark.desktop,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

OK = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
XTERM = Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "evaluator": OK, "setup": [
    {"type": "launch", "command": list(DESKTOP_MENU[0][1]), "window": "XTerm"}]})
# what makes a process a task's: user, groups, privileges, limits, group, namespaces, signals, home, environment
IDENTITY = ("id; pwd; umask; grep -E 'processes|file size' /proc/self/limits; cat /proc/self/cgroup; "
            "grep -E '^(NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)|Seccomp|SigBlk|SigIgn)' /proc/self/status; "
            "for ns in pid mnt net ipc uts cgroup user; do readlink /proc/self/ns/$ns; done; "
            "env | grep -v '^_=' | LC_ALL=C sort; [ -t 0 ] || echo 'stdin: not a terminal'; "
            "echo session $(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f4)")


def through(env: XvfbEnvironment, runner: bool) -> None:
    """Send the task's next commands through its runner, or through the chain as before."""
    assert env.sandbox is not None
    env.sandbox.commands.stop()
    env.sandbox.commands = Commands(env.sandbox.popen, env.sandbox.root / "logs" / "runner.log", runner=runner)


def runner_pid(env: XvfbEnvironment) -> int | None:
    assert env.sandbox is not None
    return env.sandbox.commands.runner_pid


def state(pid: int | None) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_command_the_runner_starts_is_the_task_process_the_chain_starts(env: XvfbEnvironment) -> None:
    env.reset(XTERM, REPO)
    through(env, runner=False)
    chain = env.run(IDENTITY)
    assert runner_pid(env) is None
    through(env, runner=True)
    ran = env.run(IDENTITY)
    assert runner_pid(env) is not None
    assert (ran.returncode, ran.stdout, ran.stderr) == (chain.returncode, chain.stdout, chain.stderr)
    assert "uid=1900" in ran.stdout and "NoNewPrivs:\t1" in ran.stdout and "session 0" in ran.stdout
    # Python ignores SIGPIPE for itself; a command gets the default, so a pipeline ends as in any shell
    assert env.run("yes | head -1").stdout == "y\n" and env.run("yes | head -1").stderr == ""
    assert env.write_file("~/notes/a.txt", b"data\n") is None and env.run("cat ~/notes/a.txt").stdout == "data\n"


def test_the_task_cannot_read_the_runner_and_does_not_count_it(env: XvfbEnvironment) -> None:
    env.reset(XTERM, REPO)
    env.run("true")
    pid = runner_pid(env)
    assert pid is not None and pid not in env.session_pids()
    # the task's processes run as the runner's user: it is non-dumpable, so its fds and memory are not theirs
    peek = env.run("p=$(pgrep -x retrace-run); ls /proc/$p/fd && cat /proc/$p/environ")
    assert peek.returncode != 0 and "Permission denied" in peek.stderr


def test_a_timed_out_command_is_killed_with_its_group(env: XvfbEnvironment) -> None:
    env.reset(XTERM, REPO)
    result = env.run("sleep 77 & sleep 78", timeout=1)
    assert result.returncode == 124 and "timed out after 1 s" in result.stderr
    assert env.run("pgrep -f 'sleep 7[78]' || echo none").stdout == "none\n"
    assert env.run("echo next").stdout == "next\n" and runner_pid(env) is not None


@pytest.mark.parametrize("signal", ["KILL", "STOP"])
def test_an_agent_that_kills_or_stops_the_runner_changes_no_result(env: XvfbEnvironment, signal: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "ANSWER", 1.0)  # a stopped runner is given up after this long
    env.reset(XTERM, REPO)
    before = env.run("echo $HOME; id -u")
    pid = runner_pid(env)
    env.execute(Action("type", text=f"pkill -{signal} -x retrace-run\n"))
    deadline = time.monotonic() + 10
    while state(pid) not in ("T", "Z", None) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state(pid) in ("T", "Z", None)
    after = env.run("echo $HOME; id -u")
    assert (after.returncode, after.stdout) == (before.returncode, before.stdout)
    assert runner_pid(env) is None  # given up: the chain runs this task's commands
    env.reset(XTERM, REPO)
    assert env.run("true").returncode == 0 and runner_pid(env) is not None  # a new task, a new runner


def test_a_command_that_ends_its_own_runner_fails_without_an_error(env: XvfbEnvironment) -> None:
    env.reset(XTERM, REPO)
    result = env.run("pkill -KILL -x retrace-run; sleep 0.2; echo after")
    assert result.returncode == LOST and "runner ended while the command ran" in result.stderr
    assert env.run("echo next").stdout == "next\n"


def test_commands_from_several_threads_at_once_each_get_their_own_result(env: XvfbEnvironment) -> None:
    # a guest server (`retrace guest`) may run requests on threads: one goes through the runner, the others the chain
    env.reset(XTERM, REPO)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: env.run(f"sleep 0.3; echo {i}"), range(4)))
    assert [(r.returncode, r.stdout) for r in results] == [(0, f"{i}\n") for i in range(4)]
    assert runner_pid(env) is not None


def test_a_kill_that_crosses_its_commands_exit_and_a_runner_ended_meanwhile_change_no_result(
        env: XvfbEnvironment) -> None:
    env.reset(XTERM, REPO)
    env.run("true")
    runner = env.sandbox.commands.runner if env.sandbox else None
    assert runner is not None
    runner.sock.sendall(b"kill\n")  # what the worker sends when a command's time is up as it exits
    assert env.run("echo one").stdout == "one\n" and env.sandbox.commands.runner is runner
    runner._end()  # as after a kill the runner never answered: its socket closed, the runner gone
    assert env.run("echo two").stdout == "two\n" and runner_pid(env) is None  # the chain ran it
