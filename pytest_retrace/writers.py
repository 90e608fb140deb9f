"""The built-in report writers: implementations of the plugin's own hooks (hookspecs.py), registered like any
third party's writer would be, so that results.jsonl and summary.json get nothing a plugin could not."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .records import Record


class ResultsJsonl:
    """``results.jsonl``: one record per line, appended and flushed to disk as each test finishes, so an
    interrupted or killed run keeps every finished result."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "results.jsonl"

    @pytest.hookimpl
    def pytest_retrace_record(self, record: Record, config: pytest.Config) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(record.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())


class SummaryJson:
    """``summary.json``: the run's summary, computed from the records only."""

    @pytest.hookimpl
    def pytest_retrace_summary(self, summary: dict[str, Any], run_dir: str, config: pytest.Config) -> None:
        path = Path(run_dir) / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
