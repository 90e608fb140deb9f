"""The built-in report writers: implementations of the plugin's own hooks (hookspecs.py), registered like any
third party's writer would be, so that results.jsonl and summary.json get nothing a plugin could not.

results.jsonl is the run; everything else is a view of it. So the views (summary.md, the plots) never fail a
run: a view that cannot be written is reported by its file and the other writers still run (pluggy would
stop at the first hook implementation that raised).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_retrace.results import rundir
from pytest_retrace.results.forward import ForwardRecord
from pytest_retrace.results.records import Record
from pytest_retrace.results.summary import Summary


class ResultsJsonl:
    """``results.jsonl``: one record per line, appended and flushed to disk as each test finishes, so an
    interrupted or killed run keeps every finished result."""

    def __init__(self, run_dir: Path) -> None:
        self.path = rundir.results_file(run_dir)
        self.forward_path = rundir.forward_file(run_dir)

    @pytest.hookimpl
    def pytest_retrace_record(self, record: Record, config: pytest.Config) -> None:
        _append(self.path, record.to_json())

    @pytest.hookimpl
    def pytest_retrace_forward_record(self, record: ForwardRecord, config: pytest.Config) -> None:
        """A forward run's records go to forward.jsonl, the same way."""
        _append(self.forward_path, record.to_json())


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class SummaryJson:
    """``summary.json``: the run's summary, computed from the records only."""

    @pytest.hookimpl
    def pytest_retrace_summary(self, summary: Summary, run_dir: str, config: pytest.Config) -> None:
        path = rundir.summary_json(Path(run_dir))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary.to_json())


class Plots:
    """``plots/`` (plots.py), each figure as PNG, PDF and SVG: rates with their intervals, rate against budget
    (several budgets only), by domain, kind and horizon, R_O against R_TC —
    drawn from the summary the hook receives, which is computed from the run's records only, so the pictures
    and summary.json cannot disagree."""

    @pytest.hookimpl
    def pytest_retrace_summary(self, summary: Summary, run_dir: str, config: pytest.Config) -> None:
        out = rundir.plots_dir(Path(run_dir))
        errors: list[str] = []
        try:
            from pytest_retrace.results.plots import write_plots

            write_plots(summary, out, errors=errors)
        except Exception as exc:  # noqa: BLE001 - no matplotlib, an unwritable directory: the run stands
            errors.append(f"{out}: {type(exc).__name__}: {exc}")
        for error in errors:
            _warn(config, f"plot not written: {error}")


class SummaryMarkdown:
    """``summary.md``: the summary's tables in markdown, linking the plots of the run directory. It runs after
    the other summary writers (``trylast``), so the plots it links are those written for this summary."""

    def __init__(self, title: str | None = None) -> None:
        self.title = title  # default: "pytest-retrace run <run directory name>"

    @pytest.hookimpl(trylast=True)
    def pytest_retrace_summary(self, summary: Summary, run_dir: str, config: pytest.Config) -> None:
        from pytest_retrace.results.plots import ALL_PLOTS
        from pytest_retrace.results.report import render_markdown

        path = rundir.summary_md(Path(run_dir))
        plots = [f"{rundir.PLOTS}/{name}" for name in ALL_PLOTS
                 if (rundir.plots_dir(Path(run_dir)) / name).is_file()]
        try:
            text = render_markdown(summary, self.title or f"pytest-retrace run {Path(run_dir).name}", plots)
            path.write_text(text, encoding="utf-8")
        except Exception as exc:  # noqa: BLE001 - a view of the run must not fail it
            _warn(config, f"{path} not written: {type(exc).__name__}: {exc}")


def _warn(config: pytest.Config, message: str) -> None:
    """On the terminal, not through warnings.warn: under -W error that would raise again, inside the hook."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"retrace: {message}", yellow=True)
    else:
        print(f"retrace: {message}", file=sys.stderr)
