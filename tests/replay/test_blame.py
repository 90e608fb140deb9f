"""Who is to blame after the agent acted (replay/result.py, docs/cases.md "Who is to blame"), on the real desktop.

What the agent leaves behind — a screen it keeps changing, a server grab — must fail its recovery with the
reason, never become an infrastructure error (which would take the case out of its n); the harness's own
fault (its X server gone) must stay an error. Each test plays the agent's part on a built-in terminal case,
on the module's desktop (conftest's ``env``).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentContext, AgentTurn, Observation
from pytest_retrace.agents.baselines import ScriptAgent
from pytest_retrace.envs import DisplayBlocked
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.envs.xvfb.sandbox import available
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.result import ReplayOptions
from pytest_retrace.replay.run import run_case
from tests.helpers import REPO

pytestmark = [pytest.mark.desktop,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

CASE = load_case(REPO / "cases" / "terminal" / "greeting-t1-clobber-variable.yaml")
OPTS = ReplayOptions(budget=3, strategy="implicit")
# An X client of the task that holds a server grab for a minute: any X client can do this (XGrabServer).
GRAB = ("python3 -c \"import ctypes as c,time; x=c.CDLL('libX11.so.6'); x.XOpenDisplay.restype=c.c_void_p; "
        "d=c.c_void_p(x.XOpenDisplay(None)); x.XGrabServer(d); x.XSync(d,0); time.sleep(60)\" &\n")


def test_a_screen_the_agent_leaves_changing_fails_the_recovery_and_is_no_error(env: XvfbEnvironment) -> None:
    agent = ScriptAgent.of([{"action": "type", "text": "(while :; do date +%N; sleep 0.05; done) &\n"}])
    result = run_case(env, CASE, agent, OPTS)
    assert result.error is None, result.error
    assert result.verdict == "not_recovered"
    assert result.r_o is False and result.r_tc is False
    assert result.evaluation is not None
    assert "could not be replayed from the state the agent left" in result.evaluation.details[0]
    assert "still changing" in result.evaluation.details[0]


def test_a_server_grab_by_the_agent_fails_its_recovery_within_the_deadlines(env: XvfbEnvironment) -> None:
    start = time.monotonic()
    result = run_case(env, CASE, ScriptAgent.of([{"action": "type", "text": GRAB}]), OPTS)
    took = time.monotonic() - start
    assert result.error is None, result.error
    assert result.r_o is False and result.r_tc is False
    assert "server grab" in (result.unobserved or ""), result.unobserved
    assert result.failed_actions == 1  # the typing action itself could not settle: the grab began under it
    # bounded by the X deadline, not the grab's minute: one screenshot waits 10 s, every later call fails at once
    assert took < 50, took
    # the desktop is recycled at reset: the next case starts as on a fresh display
    with pytest.raises(DisplayBlocked):
        env.screenshot()
    env.reset(CASE.task, CASE.dir, masks=CASE.masks)
    assert env.screenshot().shape == (800, 1280, 3)


class _HostKillsTheXServer:
    """Not an agent's doing: the X server ends while the agent's turn runs (the host, the OOM killer)."""

    name, privileged, calls_per_turn = "host", False, 0

    def __init__(self, env: XvfbEnvironment) -> None:
        self.env = env

    def start(self, context: AgentContext) -> None:
        pass

    def act(self, observation: Observation) -> AgentTurn:
        assert self.env._xvfb is not None
        self.env._xvfb.kill()
        self.env._xvfb.wait()
        return AgentTurn([Action("done")], "done")

    def close(self) -> None:
        pass


class _SlowRedraws:
    """The module's desktop, whose first ``slow`` actions report a screen still changing at the settle cap: an
    app's redraw outlasting the cap under load (seen under docker at -n 16: GIMP, once in a run)."""

    def __init__(self, env: XvfbEnvironment, slow: int) -> None:
        self._env, self.slow = env, slow

    def execute(self, action: Action) -> object:
        settled = self._env.execute(action)
        if self.slow > 0:
            self.slow -= 1
            return dataclasses.replace(settled, stable=False)
        return settled

    def __getattr__(self, name: str) -> object:
        return getattr(self._env, name)


def test_a_ground_truth_replay_still_changing_at_the_cap_is_tried_again_before_it_is_an_error(
        env: XvfbEnvironment) -> None:
    assert CASE.prefix, "the case needs a ground-truth prefix"
    once = run_case(_SlowRedraws(env, 1), CASE, ScriptAgent.of([]), OPTS)  # type: ignore[arg-type]
    assert once.error is None and once.attempts == 2, once.error
    never = run_case(_SlowRedraws(env, 10**6), CASE, ScriptAgent.of([]), OPTS)  # type: ignore[arg-type]
    assert never.error is not None and never.error.kind == "unsettled" and never.attempts == 3
    assert "attempt 3: prefix" in never.error.message and "the settle cap" in never.error.message


def test_the_harnesss_own_x_server_dying_after_the_agent_acted_is_an_infrastructure_error(
        env: XvfbEnvironment) -> None:
    result = run_case(env, CASE, _HostKillsTheXServer(env), OPTS)
    assert result.error is not None and result.verdict == "error"
    assert result.error.stage == "observe"
    assert "the X server exited (signal SIGKILL)" in result.error.message
    env.reset(CASE.task, CASE.dir, masks=CASE.masks)  # a new server at reset
    assert np.asarray(env.screenshot()).any()
