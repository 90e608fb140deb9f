"""What one test runs: a case under one model, strategy and budget (and, of ``--retrace-runs K``, which run).

It is the parameter of every recovery test (plugin.collection parametrizes ``retrace_run`` with it), and what
a record says ran (:meth:`Record.of_result`, :meth:`Record.of_error`), so the record, Allure's labels and the
progress line all read it from here rather than from the test id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_retrace.replay.result import ReplayOptions

if TYPE_CHECKING:
    from pytest_retrace.actions import Action
    from pytest_retrace.agents import ModelConfig
    from pytest_retrace.experiments.ideal import Start
    from pytest_retrace.replay.cases import RecoveryCase, Task


@dataclass(frozen=True)
class CaseRun:
    """The parameter of one test: a case under one model, strategy and budget."""

    case: RecoveryCase
    model: ModelConfig
    strategy: str
    budget: int
    run_index: int = 0  # of --retrace-runs K: 0..K-1
    runs: int = 1

    @property
    def id(self) -> str:
        return self.case.id + self.id_suffix(self.model.name, self.strategy, self.budget, self.run_index, self.runs)

    @staticmethod
    def id_suffix(model: str, strategy: str, budget: int, run_index: int, runs: int) -> str:
        # repeated runs are distinct tests (never retries of one): the run index is part of the id
        run = f"-run{run_index + 1}" if runs > 1 else ""
        return f"-{model}-{strategy}-r{budget}{run}"

    @property
    def max_turns(self) -> int:
        """The most model turns the replay gives the agent (ReplayOptions decides)."""
        return ReplayOptions(budget=self.budget, strategy=self.strategy).max_turns


@dataclass(frozen=True)
class ForwardRun:
    """The parameter of one forward test (--retrace-experiment=forward): a task under one model, at most
    ``max_steps`` steps. The task comes from a case file (one per task id: ``case`` is set, and its ground
    truth, which only privileged scripted agents are given) or from an OSWorld task file (no ground truth)."""

    task: Task
    task_dir: Path  # what the task's relative paths (setup files, an OSWorld task's cache) resolve against
    source: str  # the case's id, or the task file's path
    model: ModelConfig
    max_steps: int
    run_index: int = 0
    runs: int = 1
    ground_truth: tuple[Action, ...] | None = None
    case: RecoveryCase | None = None  # for --retrace-sample, which picks cases by app x kind
    start: Start | None = None
    recovery: str | None = None  # end-to-end: none | ideal | a recovery strategy
    max_recoveries: int = 0  # end-to-end

    @property
    def id(self) -> str:
        # the task's id first, so -k TASK_ID selects its forward tests
        run = f"-run{self.run_index + 1}" if self.runs > 1 else ""
        start = f"-{self.start.id}" if self.start is not None else ""
        recovery = "" if self.recovery is None else f"-{self.recovery}" + (
            "" if self.recovery == "none" else f"-m{self.max_recoveries}")
        return f"{self.task.id}{start}-{self.model.name}-s{self.max_steps}{recovery}{run}"


def forward_run_of(item: Any) -> ForwardRun | None:
    """The ForwardRun a collected test item runs (its ``retrace_forward_run`` parameter); None for any other."""
    callspec = getattr(item, "callspec", None)
    run = callspec.params.get("retrace_forward_run") if callspec is not None else None
    return run if isinstance(run, ForwardRun) else None


def case_run_of(item: Any) -> CaseRun | None:
    """The CaseRun a collected test item runs (its ``retrace_run`` parameter); None for any other test."""
    callspec = getattr(item, "callspec", None)
    run = callspec.params.get("retrace_run") if callspec is not None else None
    return run if isinstance(run, CaseRun) else None
