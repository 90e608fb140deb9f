"""Scripted baselines that need no API key. They calibrate the benchmark on every run:
``noop`` must score 0 % (every case's error is real), ``oracle`` 100 % (every target is reachable and
the oracle judges it recovered), ``undo`` somewhere in between. ``script`` plays fixed actions: a stand-in
model for agent rollouts and for tests of the protocol (its actions are parsed as a model's are, turn by
turn, so a bad one is an invalid step, not a crash)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_retrace.actions import Action, ActionError, parse_action
from pytest_retrace.agents import AgentContext, AgentTurn, ModelConfig, Observation, parse_options
from pytest_retrace.screen.similarity import differing_pixels

_DONE = Action("done")


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoopAgent:
    """Does nothing: the recovered state is the error state."""

    name = "noop"
    privileged = False
    calls_per_turn = 0

    def __init__(self, config: ModelConfig | None = None) -> None:
        if config is not None:
            parse_options(_Options, config)

    def start(self, context: AgentContext) -> None:
        pass

    def act(self, observation: Observation) -> AgentTurn:
        return AgentTurn([_DONE], "noop baseline: take no action")

    def close(self) -> None:
        pass


class _UndoOptions(_Options):
    keys: list[str] = ["ctrl", "z"]


class UndoAgent:
    """Presses ctrl+z, one press per step, up to the budget r.

    With explicit recovery it sees the target screenshot and stops as soon as the screen matches it,
    as a careful user would; implicitly it stops when an undo no longer changes the screen.
    """

    name = "undo"
    privileged = False
    calls_per_turn = 0

    def __init__(self, config: ModelConfig | None = None) -> None:
        opts = parse_options(_UndoOptions, config) if config is not None else _UndoOptions()
        self.keys = tuple(opts.keys)
        self._ctx: AgentContext | None = None
        self._last: Observation | None = None

    def start(self, context: AgentContext) -> None:
        self._ctx, self._last = context, None

    def act(self, observation: Observation) -> AgentTurn:
        ctx = self._ctx
        assert ctx is not None, "start() first"
        target = ctx.target_screenshot
        # exact match, not the R_O threshold: a 0.99 SSIM is reached by screens that still differ
        if target is not None and differing_pixels(observation.screenshot, target) == 0:
            return AgentTurn([_DONE], "the screen matches the target")
        if self._last is not None and (self._last.screenshot == observation.screenshot).all():
            return AgentTurn([_DONE], "undo had no visible effect")
        self._last = observation
        return AgentTurn([Action("hotkey", keys=self.keys)], "undo the last change")

    def close(self) -> None:
        pass


class OracleAgent:
    """The paper's ideal recovery: reset the environment and replay gt[0:t_seed]. In a forward run, the task's
    whole ground truth, one action a turn (agents/forward.py).

    Privileged — it uses the harness's own replay, not the screen — so it measures the benchmark,
    not an agent: anything below 100 % is a broken case or a nondeterministic environment.
    """

    name = "oracle"
    privileged = True
    calls_per_turn = 0

    def __init__(self, config: ModelConfig | None = None) -> None:
        if config is not None:
            parse_options(_Options, config)
        self._forward: Any = None

    def start(self, context: AgentContext) -> None:
        self._ctx, self._forward = context, None
        if context.ground_truth is not None:  # a forward run (implicit recovery has mode "forward" too)
            from pytest_retrace.agents.forward import GroundTruth

            self._forward = GroundTruth(context)
        elif context.restore_target is None:
            raise RuntimeError("the oracle baseline needs the harness's restore_target hook")

    def act(self, observation: Observation) -> AgentTurn:
        if self._forward is not None:
            return self._forward.act()
        assert self._ctx.restore_target is not None
        self._ctx.restore_target()
        return AgentTurn([_DONE], "oracle: reset and replay the ground-truth prefix")

    def close(self) -> None:
        pass


class _ScriptOptions(_Options):
    actions: list[Any] = []  # one turn each: an action mapping, or pyautogui code (which may hold several)


class ScriptAgent:
    """Plays a fixed list of turns, then declares done. Each turn is parsed when it is played, exactly like a
    model's reply: an entry outside the whitelist or over the caps is an invalid step, never an exception."""

    name = "script"
    privileged = False
    calls_per_turn = 0

    def __init__(self, config: ModelConfig | None = None) -> None:
        opts = parse_options(_ScriptOptions, config) if config is not None else _ScriptOptions()
        self.turns = list(opts.actions)
        self._next = 0

    @classmethod
    def of(cls, turns: list[Any]) -> ScriptAgent:
        return cls(ModelConfig("script", "script", options={"actions": turns}))

    def start(self, context: AgentContext) -> None:
        self._next = 0

    def act(self, observation: Observation) -> AgentTurn:
        if self._next >= len(self.turns):
            return AgentTurn([_DONE], "script finished")
        self._next += 1
        try:
            actions = parse_action(self.turns[self._next - 1])
        except ActionError as exc:
            return AgentTurn([], f"scripted step {self._next}", invalid=str(exc))
        return AgentTurn(actions, f"scripted step {self._next}")

    def close(self) -> None:
        pass
