"""Driving an agent: it observes, replies and acts, turn by turn, within its budget of actions (paper 5.2).

Everything the model does is the agent's: a reply that does not parse, an action the desktop refuses, a screen it
leaves unreadable. An exception escaping an agent's ``start`` or ``act`` is a bug in agent code (an error of kind
``agent-bug``), never a measurement; the model's API down after retries is the harness's (``AgentInfraError``)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_retrace.actions import ActionError, check_turn
from pytest_retrace.agents import Agent, AgentContext, AgentInfraError, Observation
from pytest_retrace.agents.secrets import redact
from pytest_retrace.envs import ActionFailed, EnvError, Environment
from pytest_retrace.replay.result import (
    InfraError,
    RecoveryResult,
    ReplayOptions,
    StepLog,
    blame,
    timed_stage,
)
from pytest_retrace.text import clip


def drive(env: Environment, agent: Agent, context: AgentContext, budget: int,
          count_looks: bool = False) -> RecoveryResult:
    """Let an agent act from the environment's current state under the same rules as a recovery (the
    dataset pipeline's perturbation agent uses it); ``steps`` holds what it did. ``count_looks``: a look-only
    turn spends a step of the budget (the paper's step counting, as ReplayOptions.count_looks)."""
    result = RecoveryResult("", 0.0, budget=budget)
    recover(env, agent, context, ReplayOptions(budget=budget, count_looks=count_looks), result)
    return result


def recover(env: Environment, agent: Agent, context: AgentContext, opts: ReplayOptions,
            result: RecoveryResult, after_turn: Callable[[], bool] | None = None) -> None:
    """Let the agent act. The budget counts actions (the paper's steps): executed ones, ones the desktop
    refused and invalid replies; a turn that would exceed it is cut, and the result says how much.
    ``after_turn`` (end-to-end recovery's error detector) is asked after every turn that did not end the
    drive; True stops it there."""
    try:
        agent.start(context)
    except AgentInfraError as exc:
        raise InfraError("agent", str(exc), kind=exc.kind) from exc
    except InfraError:
        raise  # a privileged baseline's own replay (the oracle's restore) desynced: the harness's, as it says
    except Exception as exc:
        raise InfraError("agent", f"start raised {_brief(exc)}", kind="agent-bug") from exc
    executed: int | None = None
    failure: str | None = None
    for turn_no in range(opts.max_turns):
        if result.actions_used >= opts.budget:
            return
        with timed_stage(result, opts, "turn", f"turn {turn_no + 1}", turn=turn_no + 1) as stage:
            before = len(result.steps)
            executed, failure, done = _turn(env, agent, opts, result, turn_no, executed, failure)
            stage.failed = failure
            mine = [s for s in result.steps[before:] if s.stage == "recover"]  # not the oracle's own replay
            if mine:
                stage.title += ": " + ", ".join(_short(s.action) for s in mine)
        if done or (after_turn is not None and after_turn()):
            return


def _short(action: dict[str, Any]) -> str:
    args = ", ".join(f"{v!r}" if isinstance(v, str) else str(v) for k, v in action.items() if k != "action")
    text = f"{action['action']}({args})"
    return clip(text, 60)


def _turn(env: Environment, agent: Agent, opts: ReplayOptions, result: RecoveryResult, turn_no: int,
          executed: int | None, failure: str | None) -> tuple[int, str | None, bool]:
    """One model turn: observe, ask, execute. Returns (actions executed, what failed, whether the agent is
    done: it said so or the budget ran out)."""
    try:
        cursor = env.cursor_position()
    except EnvError:
        cursor = None  # nice to have for the model, never worth failing a case
    try:
        screen = env.screenshot()
    except EnvError as exc:
        blame(env, "recover", exc)  # the desktop is fine: the agent's own actions made it unreadable
        result.steps.append(StepLog("recover", {"action": "observe"}, 0.0, "", f"the screen could not be read: {exc}"))
        return 0, f"the screen could not be read: {exc}", True
    observation = Observation(screen, turn_no, opts.budget - result.actions_used, cursor, executed, failure)
    try:
        turn = agent.act(observation)
    except AgentInfraError as exc:
        raise InfraError("agent", f"turn {turn_no}: {exc}", kind=exc.kind) from exc
    except InfraError:
        raise  # as in recover: the oracle's restore replays ground truth, and a desync there is not a bug
    except Exception as exc:
        raise InfraError("agent", f"turn {turn_no}: act raised {_brief(exc)}", kind="agent-bug") from exc
    result.agent_turns = turn_no + 1
    result.usage.add(turn.usage)
    # any agent's words, not only the built-in adapters' (which redact already): no key reaches a record
    turn = replace(turn, rationale=redact(turn.rationale), invalid=None if turn.invalid is None else redact(turn.invalid))
    executed = 0
    invalid = turn.invalid
    if invalid is None:
        try:
            check_turn(turn.actions)  # per-turn caps, whatever dialect the actions came from
        except ActionError as exc:
            invalid = str(exc)
    if invalid is not None:
        result.actions_used += 1
        result.invalid_steps += 1
        result.steps.append(StepLog("recover", {"action": "invalid"}, 0.0, turn.rationale, invalid))
        return 0, f"invalid reply: {invalid}", False
    if not turn.actions and opts.count_looks:
        # the paper counts a model response as a step, a look included (docs/paper.md, row 4)
        result.actions_used += 1
        result.steps.append(StepLog("recover", {"action": "observe"}, 0.0, turn.rationale))
        return 0, None, False
    for i, action in enumerate(turn.actions):
        if action.terminal:
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale))
            return executed, None, True
        if result.actions_used >= opts.budget:
            result.cut_actions += sum(not a.terminal for a in turn.actions[i:])
            return executed, None, True
        result.actions_used += 1
        try:
            settled = env.execute(action)
        except ActionFailed as exc:  # the desktop is fine; what the agent asked could not be done
            result.failed_actions += 1
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale, str(exc)))
            return executed, f"{action.describe()} failed: {exc}", False
        except EnvError as exc:
            blame(env, "recover", exc)
            # the desktop stopped answering because of what the agent did (a grab): nothing more can be done
            result.failed_actions += 1
            result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale, str(exc)))
            return executed, f"{action.describe()} failed: {exc}", True
        executed += 1
        # a screen the agent leaves changing is its own doing: recorded, and R_O waits for a settled screen
        result.steps.append(StepLog("recover", action.to_dict(), round(settled.seconds, 4), turn.rationale,
                                    settled=settled.stable))
    return executed, None, False


def _brief(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return redact(f"{type(exc).__name__}: {exc}{where}")
