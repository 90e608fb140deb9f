"""The plugin's own hooks (added through pytest_addhooks), for extensions such as report writers,
dashboards or CI gates. They run on the controller (or the only process without xdist). The built-in writers
(writers.py: results.jsonl, summary.json) implement them too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .records import Record


@pytest.hookspec
def pytest_retrace_record(record: Record, config: pytest.Config) -> None:
    """A test finished: its typed, versioned record (records.py), as results.jsonl stores it."""


@pytest.hookspec
def pytest_retrace_summary(summary: dict[str, Any], run_dir: str, config: pytest.Config) -> None:
    """The session's summary (summary.json, with its ``schema_version``) was computed from all records."""
