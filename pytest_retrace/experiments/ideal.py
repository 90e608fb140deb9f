"""The ideal-recovery experiment (paper §4, appendix B.1: Success@K under ideal recovery): for every episode
of a run plan (plan.py) and every condition (R = 0, E-1, E-random, R_LLM), K continuations of the forward agent
from the state after R steps, each one test (``--retrace-experiment=ideal-recovery --retrace-plan FILE``).

A continuation is a forward episode resumed (forward.Resume): reset, the saved prefix replayed and verified
against the screen the episode recorded after step R, then the agent with those R steps as its history. Its
record is a ForwardRecord carrying its :class:`Start`; results.success turns them into Success@K.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_retrace.actions import Action
from pytest_retrace.experiments.forward import Resume
from pytest_retrace.experiments.plan import CONDITIONS, Plan
from pytest_retrace.experiments.trajectory import read_episode, read_ground_truth, read_task
from pytest_retrace.replay.cases import Task


class StartError(ValueError):
    """An episode of the plan this run cannot continue; the message names the episode and why."""


@dataclass(frozen=True)
class Start:
    """One continuation: which annotated episode, under which condition (its R), and which of the K."""

    episode: Path  # the episode's directory
    name: str  # the episode, relative to the plan's trajectories directory (as the plan names it)
    who: str  # the forward agent that ran it: its directory in OSWorld's layout, <model>[-run<k>]
    condition: str
    step: int  # R: the state after R steps
    error_step: int  # E
    sample: int  # 0..samples-1
    samples: int  # K
    task: Task
    task_dir: Path  # where the task's files lie
    ground_truth: tuple[Action, ...] | None = None  # what the episode's scripted agent was given, if any

    @property
    def id(self) -> str:
        return f"{self.who}-{self.condition}-k{self.sample + 1}"

    def resume(self) -> Resume:
        """The saved steps up to R and the screen the episode recorded after step R (read at run time: the
        screenshots are the cost, and only this test needs them)."""
        episode = read_episode(self.episode)
        if isinstance(episode, str):
            raise StartError(episode)
        if self.step > len(episode.history):
            raise StartError(f"{self.episode}: step {self.step} is past its {len(episode.history)} steps")
        screen = episode.history[self.step].screenshot if self.step < len(episode.history) else episode.final
        return Resume(episode.history[:self.step], screen, self.sample)


def starts_of(plan: Plan, plan_path: Path, conditions: tuple[str, ...] = CONDITIONS, samples: int = 5) -> list[Start]:
    """Every continuation of the plan; an episode whose task file cannot be read is a StartError naming it. A
    condition without an R (R_LLM's answer was invalid: the plan counts it) has no continuation."""
    root = plan.root(plan_path)
    out = []
    for item in plan.annotated:
        where = root / item.episode
        task = read_task(where)
        if not isinstance(task, tuple):
            raise StartError(task or f"{where}: not an episode of a forward run (no retrace-task.yaml)")
        gt = read_ground_truth(where)
        for condition in conditions:
            step = item.recovery_steps.get(condition)
            if step is None:
                continue
            out += [Start(where, item.episode, item.model, condition, step, item.error_step, k, samples, *task,
                          ground_truth=gt) for k in range(samples)]
    return out
