"""Fixtures and hooks shared by the project's own tests; helper functions live in helpers.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Fuzzing measures correctness, not speed: on a machine busy with desktops, input generation ran slower than
# Hypothesis's health check allows (30 s for 2 inputs at nice 19 next to 16 desktops) and failed a sound test.
settings.register_profile("retrace", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("retrace")

from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from tests.helpers import REPO


@pytest.fixture(scope="module")
def env() -> Iterator[XvfbEnvironment]:
    """A real desktop shared by the tests of one module (started once, always closed)."""
    e = XvfbEnvironment()
    e.start()
    yield e
    e.close()


@pytest.fixture
def project(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A copy of the repository's suite (cases + agents) in a fresh directory, with its own TMPDIR so
    the processes of this session can be told apart from other test workers' desktops."""
    shutil.copytree(REPO / "tests" / "data" / "cases", pytester.path / "cases")
    shutil.copytree(REPO / "agents", pytester.path / "agents")
    pytester.makeini("[pytest]\ntestpaths = cases\n")
    tmp = tmp_path_factory.mktemp("envtmp")
    monkeypatch.setenv("TMPDIR", str(tmp))
    pytester._retrace_tmp = tmp  # type: ignore[attr-defined]
    return pytester


def pytest_itemcollected(item: pytest.Item) -> None:
    """A calibration test runs the built-in suite on 16 desktops, so it is a desktop test too: `-m "not desktop"`
    alone is then the unit suite (marked here, at collection and before -m selects, so that no module has to
    remember both markers)."""
    if item.get_closest_marker("calibration") is not None:
        item.add_marker(pytest.mark.desktop)
