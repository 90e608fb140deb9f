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
        self.per_turn: dict[str, int] = {}  # model config name -> the agent's calls per turn

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # session.items: what is left once every plugin's pytest_collection_modifyitems (-k, -m, --deselect,
        # --lf, --retrace-resume) has deselected its share; counting in that hook saw the whole suite
        per_turn = self.per_turn
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
                if run.recovery not in (None, "none"):  # end-to-end: the detectors and the recoveries too
                    calls += self._recoveries(run)
            else:
                calls = per_turn[run.model.name] * run.max_turns
                calls += run.strategy == "explicit-context"
                calls += 2 * self.settings.attempts if self.settings.verifier is not None else 0
            self.total += calls
            self.lines.append(f"{item.nodeid}  (at most {calls} model calls)")

    def _recoveries(self, run: ForwardRun) -> int:
        """End-to-end: the error detector's call after every forward turn and the recovery-step detector's on
        each detection (at most 2 a turn), and per recovery the recovery agent's turns (2 x budget + 2, a
        strategy's; none for ideal) and explicit-context's summary; each forward segment after a recovery
        may take its own 2 x max_steps + 2 turns."""
        settings = self.settings
        cfg = settings.recovery_agent or run.model
        if cfg.name not in self.per_turn:
            self.per_turn[cfg.name] = agent_factory(cfg).calls_per_turn
        turns = ReplayOptions(budget=run.max_steps).max_turns * (run.max_recoveries + 1)
        asked = [c for c in (settings.error_detector, settings.recovery_detector)
                 if c is not None and c.provider not in ("scripted-error", "scripted-recovery")]  # models only
        detectors = turns * len(asked)
        per_attempt = 0 if run.recovery == "ideal" else (
            self.per_turn[cfg.name] * ReplayOptions(budget=settings.budgets[0]).max_turns
            + (run.recovery == "explicit-context"))
        return (turns - ReplayOptions(budget=run.max_steps).max_turns) * self.per_turn[run.model.name] \
            + detectors + run.max_recoveries * per_attempt

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("=", "retrace dry run: nothing was run and no model was called")
        for line in self.lines:
            tr.write_line(line)
        tr.write_line(f"{len(self.lines)} test(s); at most {self.total} model calls in all")
