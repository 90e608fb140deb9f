"""A forward episode (the paper's forward run, what its §4 and §6 experiments stand on): an agent solves a task
from its initial state in at most ``max_steps`` actions, and the task's own evaluator scores what it left.

reset (the task's setup; an OSWorld task's config) → the agent's turns, as in a recovery (replay.drive: the
same whitelist, caps, budget accounting and blame) → Φ.

A continuation (:class:`Resume`, the ideal-recovery experiment, paper B.1) starts after R steps of a saved
episode instead: the reset, the saved actions replayed and the screen verified against the one the episode
recorded after step R (retried; a prefix that does not reproduce is a desync, never scored), then the agent,
given those R steps as its history and what the episode had left of ``max_steps``.

Who is to blame is decided as in a recovery (replay/run.py): a reset that fails, the model's API down after
retries, an exception out of agent code are infrastructure errors; what the agent does and leaves behind is
scored. The screen after every executed action is kept (the trajectory's observations, experiments.trajectory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import Agent, AgentContext, HistoryStep, Usage
from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.evaluators import Evaluation
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.drive import recover
from pytest_retrace.replay.judge import reset
from pytest_retrace.replay.reconstruct import replay_to
from pytest_retrace.replay.result import (
    InfraError,
    RecoveryResult,
    ReplayObserver,
    ReplayOptions,
    timed_stage,
)
from pytest_retrace.replay.scoring import judge_left


@dataclass(frozen=True)
class Resume:
    """Where a continuation starts: the saved episode's first R steps (the screen before each, the action, the
    rationale) and ``screen``, the episode's recorded screen after step R; ``sample``: which continuation."""

    history: list[HistoryStep]
    screen: np.ndarray | None
    sample: int = 0

    @property
    def step(self) -> int:
        return len(self.history)


@dataclass
class ForwardResult:
    """One episode: what the agent did (``steps``, the drive's own log), the screen before its first action and
    after each executed one, and the evaluator's verdict. ``error``: an infrastructure error (no verdict)."""

    task_id: str
    max_steps: int
    drive: RecoveryResult  # the turns' bookkeeping, shared with recoveries (steps, usage, invalid, failed, cut)
    initial: np.ndarray | None = field(default=None, repr=False)
    frames: list[np.ndarray] = field(default_factory=list, repr=False)  # after each executed action, in order
    evaluation: Evaluation | None = None
    last_action: str | None = None  # "DONE" / "FAIL" when the agent ended the episode itself
    error: InfraError | None = None
    # end-to-end recovery (experiments.endtoend): each recovery, and what asking the detectors cost
    recoveries: list[Any] = field(default_factory=list)
    detector_calls: int = 0
    detector_usage: Usage = field(default_factory=Usage)

    @property
    def solved(self) -> bool:
        return self.error is None and self.evaluation is not None and self.evaluation.passed

    @property
    def verdict(self) -> str:
        return "error" if self.error is not None else "solved" if self.solved else "unsolved"

    def __repr__(self) -> str:
        score = None if self.evaluation is None else self.evaluation.score
        return f"ForwardResult(task={self.task_id!r}, verdict={self.verdict!r}, score={score})"


class Recording:
    """The environment as the agent's turns see it, keeping the settled screen of every executed action
    (the frame the settle grabbed anyway: no extra screenshot)."""

    def __init__(self, env: Environment, frames: list[np.ndarray]) -> None:
        self._env, self._frames = env, frames

    def execute(self, action: Action) -> Any:
        settled = self._env.execute(action)
        self._frames.append(settled.frame)
        return settled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def run_forward(env: Environment, task: Task, task_dir: Path, agent: Agent, *, max_steps: int,
                ground_truth: list[Action] | None = None, observer: ReplayObserver | None = None,
                resume: Resume | None = None, attempts: int = 3) -> ForwardResult:
    """Run one episode (from the task's initial state, or resumed). Never raises for infrastructure failures:
    they land in ``result.error``. ``ground_truth`` reaches only a privileged agent (the scripted baselines)."""
    # a resumed episode has what the saved one had left: never longer than a fresh one
    budget = max(1, max_steps - (resume.step if resume else 0))
    opts = ReplayOptions(budget=budget, observer=observer, attempts=attempts)
    return timed_episode(task.id, max_steps, opts,
                         lambda result: _run(env, task, task_dir, agent, ground_truth, opts, result, resume))


def timed_episode(task_id: str, max_steps: int, opts: ReplayOptions,
                  body: Callable[[ForwardResult], None]) -> ForwardResult:
    """An episode's result, ``body`` filling it: an infrastructure error lands in ``result.error``, the total
    time in its timings (forward runs, continuations and end-to-end episodes alike)."""
    drive = RecoveryResult(task_id, 0.0, budget=opts.budget)
    result = ForwardResult(task_id, max_steps, drive)
    start = time.monotonic()
    try:
        body(result)
    except InfraError as exc:
        result.error = exc
    finally:
        drive.timings["total"] = round(time.monotonic() - start, 4)
    return result


def reset_stage(env: Environment, task: Task, task_dir: Path, opts: ReplayOptions, result: ForwardResult) -> None:
    """The task's reset, and the screen the agent starts from. Nothing has acted yet: a failure is the harness's."""
    with timed_stage(result.drive, opts, "reset", "reset"):
        try:
            reset(env, task, task_dir)
            result.initial = env.screenshot()
        except EnvError as exc:
            raise InfraError("reset", str(exc)) from exc


def judge_stage(env: Environment, task: Task, task_dir: Path, opts: ReplayOptions, result: ForwardResult) -> None:
    """How the agent ended the episode (DONE / FAIL, if it said so), then Φ on what it left."""
    ends = [s.action["action"] for s in result.drive.steps if s.action.get("action") in ("done", "fail")]
    result.last_action = ends[-1].upper() if ends else None
    with timed_stage(result.drive, opts, "evaluate", "Φ: the task's evaluator") as stage:
        result.evaluation = judge_left(env, task, task_dir, stage, "Φ", last_action=result.last_action)


def _run(env: Environment, task: Task, task_dir: Path, agent: Agent, ground_truth: list[Action] | None,
         opts: ReplayOptions, result: ForwardResult, resume: Resume | None) -> None:
    drive = result.drive
    if resume is not None and resume.step:
        if resume.screen is None:
            raise InfraError("reconstruct", f"the saved episode has no screenshot after step {resume.step}",
                             kind="desync")
        replay_to(env, task, task_dir, [h.action for h in resume.history], resume.screen, opts, drive,
                  state=f"step {resume.step}")
        drive.steps.clear()  # the replayed prefix is the saved episode's, not this one's
        result.initial = env.screenshot()
    else:
        reset_stage(env, task, task_dir, opts, result)
    context = AgentContext(instruction=task.instruction, mode="forward", strategy="implicit", budget=opts.budget,
                           screen=tuple(env.size), ground_truth=list(ground_truth or []) if agent.privileged else None,
                           history=list(resume.history) if resume else [], sample=resume.sample if resume else 0)
    with timed_stage(drive, opts, "recover", f"forward: {agent.name}, at most {opts.budget} steps") as stage:
        recover(Recording(env, result.frames), agent, context, opts, drive)  # type: ignore[arg-type]
        stage.title += f" ({drive.actions_used} used)"
    judge_stage(env, task, task_dir, opts, result)
