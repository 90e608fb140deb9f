"""Scripted baselines that need no API key. They calibrate the benchmark on every run:
``noop`` must score 0 % (every case's error is real), ``oracle`` 100 % (every target is reachable and
the oracle judges it recovered), ``undo`` somewhere in between."""

from __future__ import annotations

from ..actions import Action
from ..oracle import differing_pixels
from . import AgentTurn, Observation, RecoveryContext

_DONE = Action("done")


class NoopAgent:
    """Does nothing: the recovered state is the error state."""

    name = "noop"
    privileged = False

    def start(self, context: RecoveryContext) -> None:
        pass

    def act(self, observation: Observation) -> AgentTurn:
        return AgentTurn([_DONE], "noop baseline: take no action")

    def close(self) -> None:
        pass


class UndoAgent:
    """Presses ctrl+z, one press per step, up to the budget r.

    With explicit recovery it sees the target screenshot and stops as soon as the screen matches it,
    as a careful user would; implicitly it stops when an undo no longer changes the screen.
    """

    name = "undo"
    privileged = False

    def __init__(self, keys: list[str] | None = None) -> None:
        self.keys = tuple(keys or ["ctrl", "z"])
        self._ctx: RecoveryContext | None = None
        self._last: Observation | None = None

    def start(self, context: RecoveryContext) -> None:
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
    """The paper's ideal recovery: reset the environment and replay gt[0:t_seed].

    Privileged — it uses the harness's own replay, not the screen — so it measures the benchmark,
    not an agent: anything below 100 % is a broken case or a nondeterministic environment.
    """

    name = "oracle"
    privileged = True

    def start(self, context: RecoveryContext) -> None:
        if context.restore_target is None:
            raise RuntimeError("the oracle baseline needs the harness's restore_target hook")
        self._ctx = context

    def act(self, observation: Observation) -> AgentTurn:
        assert self._ctx.restore_target is not None
        self._ctx.restore_target()
        return AgentTurn([_DONE], "oracle: reset and replay the ground-truth prefix")

    def close(self) -> None:
        pass


class ScriptAgent:
    """Plays a fixed list of actions, one per step, then declares done: a stand-in forward policy for
    agent rollouts (``retrace build --agent``) and for tests of the Agent protocol."""

    name = "script"
    privileged = False

    def __init__(self, actions: list[object] | None = None) -> None:
        from ..actions import parse_action

        self.actions = [a for item in (actions or []) for a in parse_action(item)]
        self._next = 0

    def start(self, context: RecoveryContext) -> None:
        self._next = 0

    def act(self, observation: Observation) -> AgentTurn:
        if self._next >= len(self.actions):
            return AgentTurn([_DONE], "script finished")
        self._next += 1
        return AgentTurn([self.actions[self._next - 1]], f"scripted step {self._next}")

    def close(self) -> None:
        pass
