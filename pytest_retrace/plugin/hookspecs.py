"""The plugin's own hooks (added through pytest_addhooks), for extensions such as report writers,
dashboards or CI gates. The built-in writers implement them too: results.jsonl and summary.json
(results/writers.py), Allure (results/allure.py), the live progress line (results/progress.py).

Where they run: ``pytest_retrace_record`` and ``pytest_retrace_summary`` on the controller (or the only
process without xdist), where every test's record arrives; the stage and result hooks on the process that
runs the test (an xdist worker), where the desktop and the screenshots are."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_retrace.experiments.forward import ForwardResult
    from pytest_retrace.replay.result import RecoveryResult, Stage
    from pytest_retrace.results.forward import ForwardRecord
    from pytest_retrace.results.records import Record
    from pytest_retrace.results.summary import Summary


@pytest.hookspec
def pytest_retrace_record(record: Record, config: pytest.Config) -> None:
    """A test finished: its typed, versioned record (records.py), as results.jsonl stores it."""


@pytest.hookspec
def pytest_retrace_summary(summary: Summary, run_dir: str, config: pytest.Config) -> None:
    """The session's summary was computed from all records: typed and versioned (results/summary.py), its
    ``to_dict()`` is summary.json; ``summary["groups"]`` still reads summary.json's keys, as the dict it was."""


@pytest.hookspec
def pytest_retrace_stage_start(item: pytest.Item, stage: Stage) -> None:
    """A stage of the test's replay started (reset, prefix, verify, perturb, context, recover, turn, observe,
    suffix, evaluate). Runs where the test runs; must not raise."""


@pytest.hookspec
def pytest_retrace_stage_end(item: pytest.Item, stage: Stage) -> None:
    """A stage ended: ``stage.seconds`` is set, ``stage.failed`` names a check that did not hold (the agent's, or
    in a reset or verify stage a reconstruction attempt's, which is retried), ``stage.error`` the infrastructure
    error that ended the replay. Runs where the test runs."""


@pytest.hookspec
def pytest_retrace_result(item: pytest.Item, result: RecoveryResult, record: Record) -> None:
    """The test's replay is over (recovered, not, or an infrastructure error): its record, and the result with
    the screenshots, which only this process has. Runs where the test runs, before its assertion."""


@pytest.hookspec
def pytest_retrace_forward_record(record: ForwardRecord, config: pytest.Config) -> None:
    """A forward test (--retrace-experiment=forward) finished: its typed, versioned record (results/forward.py),
    as forward.jsonl stores it. On the controller, like ``pytest_retrace_record``."""


@pytest.hookspec
def pytest_retrace_forward_result(item: pytest.Item, result: ForwardResult, record: ForwardRecord) -> None:
    """A forward episode is over: its record, and the result with the screens. Runs where the test runs."""
