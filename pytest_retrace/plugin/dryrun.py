"""``--retrace-dry-run``: list the tests and the most model calls each could make; run and call nothing."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_retrace.agents import AgentConfigError, agent_factory
from pytest_retrace.plugin.options import Settings
from pytest_retrace.replay.result import ReplayOptions
from pytest_retrace.results.caserun import ForwardRun, case_run_of, forward_run_of


class DryRun:
    """``--retrace-dry-run``: after collection, the most model calls each test could make, and the total.
    A turn makes at most ``calls_per_turn`` calls (a reply and its re-ask), a case at most 2r + 2 turns (a forward
episode 2 x max_steps + 2);
    explicit-context adds the contextualizer's call, a verifier up to two per reconstruction attempt."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lines: list[str] = []
        self.total = 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # session.items: what is left once every plugin's pytest_collection_modifyitems (-k, -m, --deselect,
        # --lf, --retrace-resume) has deselected its share; counting in that hook saw the whole suite
        per_turn: dict[str, int] = {}
        for item in session.items:
            run = case_run_of(item) or forward_run_of(item)
            if run is None:
                continue
            if run.model.name not in per_turn:
                try:
                    per_turn[run.model.name] = agent_factory(run.model).calls_per_turn
                except AgentConfigError as exc:
                    raise pytest.UsageError(f"retrace: {exc}") from None
            if isinstance(run, ForwardRun):  # a forward episode: turns as a recovery of budget max_steps
                # (a continuation from step R has what the episode had left: max_steps - R)
                budget = max(1, run.max_steps - (run.start.step if run.start is not None else 0))
                calls = per_turn[run.model.name] * ReplayOptions(budget=budget).max_turns
            else:
                calls = per_turn[run.model.name] * run.max_turns
                calls += run.strategy == "explicit-context"
                calls += 2 * self.settings.attempts if self.settings.verifier is not None else 0
            self.total += calls
            self.lines.append(f"{item.nodeid}  (at most {calls} model calls)")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("=", "retrace dry run: nothing was run and no model was called")
        for line in self.lines:
            tr.write_line(line)
        tr.write_line(f"{len(self.lines)} test(s); at most {self.total} model calls in all")
