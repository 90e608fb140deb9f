"""Scripted forward agents: they follow a task's ground truth (``AgentContext.ground_truth``, given to privileged
agents in forward runs only) and go wrong where they are told to, so a forward run, and the experiments standing
on it, have agents with a known outcome and a known first wrong step E, for tests and for the README.

- ``oracle`` (baselines.OracleAgent) in a forward run: the whole ground truth, then done: every task solved;
- ``stall``: the ground truth up to step ``at`` - 1, at step ``at`` its ``wrong`` action (if any), then done:
  the episode's first wrong step is ``at``, and a task that needs the rest is not solved;
- ``random-fail``: at each ground-truth step goes wrong as ``stall`` does with probability ``p``, drawn from a
  generator seeded by ``seed``, the task's instruction and the context's ``sample`` (0 in a forward run, the
  continuation's index in an ideal-recovery run): the same step every run, on every machine.

Resumed from a past state (an ideal-recovery continuation: the context's ``history`` holds the R steps replayed
before it), they go on with the ground truth's step R + 1. Asked to recover (end-to-end recovery's recovery agent)
they know no way back: they end the attempt at once. ``stall``'s ``on_resume: recover`` makes its mistake
one a fresh start repeats but a resumed episode does not: the planted failure that returning to E - 1 fixes and
a reset does not.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from pytest_retrace.actions import Action, ActionError, parse_action
from pytest_retrace.agents import AgentContext, AgentTurn, ModelConfig, Observation, parse_options

_DONE = Action("done")


class GroundTruth:
    """Plays a forward context's ground-truth actions one per turn, then done (the oracle's forward mode)."""

    def __init__(self, context: AgentContext, until: int | None = None, wrong: Action | None = None) -> None:
        if context.ground_truth is None:
            raise RuntimeError("a scripted forward agent needs the task's ground truth (privileged, forward runs only)")
        self.actions = list(context.ground_truth)
        # resumed after R replayed steps (they are the ground truth's up to the first wrong one): go on from R + 1
        self.until, self.wrong, self.next = until, wrong, len(context.history)

    def act(self) -> AgentTurn:
        i, self.next = self.next, self.next + 1
        if self.until is not None and i == self.until - 1:
            if self.wrong is not None:
                return AgentTurn([self.wrong], f"step {i + 1}: going wrong on purpose")
            return AgentTurn([_DONE], f"step {i + 1}: stalling on purpose")
        if self.until is not None and i >= self.until:
            return AgentTurn([_DONE], "stalled after going wrong")
        if i < len(self.actions):
            return AgentTurn([self.actions[i]], f"ground-truth step {i + 1} of {len(self.actions)}")
        return AgentTurn([_DONE], "the ground truth is done")


class _WrongOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wrong: Any = None  # one action (a mapping or pyautogui code) played at the wrong step; none: stop there

    @field_validator("wrong")
    @classmethod
    def _one_action(cls, value: Any) -> Any:
        if value is not None:
            try:
                actions = parse_action(value)
            except ActionError as exc:
                raise ValueError(f"not an action: {exc}") from None
            if len(actions) != 1 or actions[0].terminal:
                raise ValueError("must be exactly one action that is not done/fail")
        return value

    def wrong_action(self) -> Action | None:
        return None if self.wrong is None else parse_action(self.wrong)[0]


class _StallOptions(_WrongOptions):
    at: int = 1  # the first wrong step E, 1-based
    on_resume: Literal["repeat", "recover"] = "repeat"  # resumed from a past state: go wrong at `at` again, or not

    @field_validator("at")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be >= 1 (steps are numbered from 1)")
        return value


class _Scripted:
    """What the scripted forward agents share: a GroundTruth player made at each start, played turn by turn."""

    privileged = True
    calls_per_turn = 0
    _play: GroundTruth | None = None

    def start(self, context: AgentContext) -> None:
        if context.mode == "recovery" and context.ground_truth is None:
            # an end-to-end recovery given to a scripted forward agent: it knows no way back, and says so
            self._play = None
            return
        self._play = GroundTruth(context, until=self.wrong_step(context), wrong=self.opts.wrong_action())

    def wrong_step(self, context: AgentContext) -> int | None:
        raise NotImplementedError

    def act(self, observation: Observation) -> AgentTurn:
        if self._play is None:
            return AgentTurn([_DONE], "a scripted forward agent cannot restore a past state")
        return self._play.act()

    def close(self) -> None:
        pass


class StallAgent(_Scripted):
    """The ground truth until step ``at``, where it goes wrong (its ``wrong`` action, or nothing) and stalls."""

    name = "stall"

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.opts = parse_options(_StallOptions, config) if config is not None else _StallOptions()

    def wrong_step(self, context: AgentContext) -> int | None:
        return None if context.history and self.opts.on_resume == "recover" else self.opts.at


class _RandomOptions(_WrongOptions):
    seed: int = 0
    p: float = 0.3  # the chance of going wrong at each ground-truth step

    @field_validator("p")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("a probability in 0..1")
        return value


class RandomFailAgent(_Scripted):
    """Follows the ground truth and goes wrong at a step drawn with probability ``p`` each, seeded per task."""

    name = "random-fail"

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.opts = parse_options(_RandomOptions, config) if config is not None else _RandomOptions()

    def wrong_step(self, context: AgentContext) -> int | None:
        """E for this task (1-based), or None: this seed lets the agent through. A str seed hashes the same in
        every process (random.Random seeds str through SHA-512), unlike hash()."""
        sample = f":{context.sample}" if context.sample else ""  # a forward run's draw is the one it always was
        draw = random.Random(f"{self.opts.seed}:{context.instruction}{sample}")
        steps = len(context.ground_truth or [])
        start = len(context.history)  # resumed: the replayed steps are behind it, drawn for no more
        return next((i + 1 for i in range(steps) if draw.random() < self.opts.p and i >= start), None)
