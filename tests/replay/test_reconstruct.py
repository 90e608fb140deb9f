"""Reconstruction's retries on a real desktop: a reset that fails is an attempt like a state that does not
reproduce (nothing has acted yet, so another attempt may get past a window that came late), and only a reset
failing every attempt is the test's error, at the reset stage."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_retrace.agents.baselines import OracleAgent
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.result import ReplayOptions
from pytest_retrace.replay.run import run_case
from tests.helpers import REPO

pytestmark = pytest.mark.desktop

CASE = REPO / "tests" / "data" / "alias-case" / "alias-echo.yaml"


@pytest.fixture
def flaky(env: XvfbEnvironment, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The desktop's reset fails (as an app's window that did not show in time does) while the list's count
    is positive, then resets for real."""
    left = [0]
    real = env.reset

    def reset(*args: object, **kwargs: object) -> None:
        if left[0] > 0:
            left[0] -= 1
            real(*args, **kwargs)  # the desktop really started; its app did not show in time
            raise EnvError("no window matching 'xterm' within 0.0 s after launching xterm")
        real(*args, **kwargs)

    monkeypatch.setattr(env, "reset", reset)
    yield left


def test_a_reset_that_fails_once_is_retried_and_the_test_scores(env: XvfbEnvironment, flaky: list[int]) -> None:
    flaky[0] = 1
    result = run_case(env, load_case(CASE), OracleAgent(), ReplayOptions(budget=2, strategy="explicit-none"))
    assert result.error is None, result.error
    assert result.recovered and result.attempts == 2


def test_a_reset_failing_every_attempt_is_a_reset_error_naming_each(env: XvfbEnvironment, flaky: list[int]) -> None:
    flaky[0] = 3
    result = run_case(env, load_case(CASE), OracleAgent(), ReplayOptions(budget=2, strategy="explicit-none"))
    assert result.error is not None and result.error.stage == "reset", result.error
    assert [f"attempt {i}: reset: no window matching 'xterm'" in result.error.message for i in (1, 2, 3)] == [True] * 3
    assert result.attempts == 3 and result.recovered is False
