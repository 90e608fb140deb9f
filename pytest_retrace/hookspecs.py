"""The plugin's own hooks (added through pytest_addhooks), for extensions such as report writers,
dashboards or CI gates. They run on the controller (or the only process without xdist)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_retrace_record(record: dict[str, Any], config: pytest.Config) -> None:
    """A test finished and its record (one line of results.jsonl) was written."""


@pytest.hookspec
def pytest_retrace_summary(summary: dict[str, Any], run_dir: str, config: pytest.Config) -> None:
    """The session's summary (summary.json) was computed from all records."""
