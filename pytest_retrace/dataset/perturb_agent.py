"""The perturbation agent of `retrace build --perturb-agent` (paper A.1): a model drives a target state off
track within the mistake's budget; the actions it executed become the candidate's perturbation.

What the budget counts depends on the build's protocol (docs/agents.md, docs/paper.md row 9):

- ``default``: d actions; a turn that only looks (a screenshot, a zoom) is free, as in a recovery.
- ``paper``: d steps, a step being one model response, so a look spends one (the paper's counting). A model
  config's ``perturbation.extra_steps`` is added: GPT-5.4 gets 1, as in A.1 ("a budget of 2 due to its strong
  tendency to generate a 'take a screenshot' action as the initial step").

Either way the mistake takes at most d actions: a case's d is its horizon's recovery distance (1 or 5), the
one its horizon tables are read against. Extra steps are room for a look, not for a longer mistake: an
agent that spends them on actions is dropped ("took more than d actions"), as the paper keeps GPT-5.4's
samples only where a screenshot came first and a real action second. The case records the rule and the
budget that applied (``metadata.perturbation_agent``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import Agent, AgentContext, ModelConfig, create_agent, load_model_config
from pytest_retrace.dataset.catalogue import AgentPerturbation
from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.dataset.verify import execute
from pytest_retrace.envs import Environment
from pytest_retrace.replay.drive import drive
from pytest_retrace.replay.judge import reset
from pytest_retrace.replay.result import InfraError
from pytest_retrace.screen.similarity import differing_pixels

PROTOCOLS = ("default", "paper")
# what a drive's steps hold besides executed actions: the end of the drive, a reply that could not be
# used, a look that spent a step (paper protocol)
NOT_ACTIONS = ("done", "fail", "invalid", "observe")


@dataclass(frozen=True)
class StepBudget:
    """The perturbation agent's budget for one candidate."""

    protocol: str
    d: int  # the horizon's recovery distance: the most actions the mistake may take
    extra_steps: int  # the model config's rule, applied (0 under the default protocol)

    @property
    def steps(self) -> int:
        return self.d + self.extra_steps

    @property
    def count_looks(self) -> bool:
        return self.protocol == "paper"

    def __str__(self) -> str:
        if self.count_looks:
            return f"paper protocol: {self.steps} step(s) = d {self.d} + extra_steps {self.extra_steps}, a look spends one"
        return f"default protocol: {self.d} action(s), looks free"


def step_budget(protocol: str, d: int, config: ModelConfig) -> StepBudget:
    """The budget a model gets under a protocol. The rule applies under the paper's counting only: under the
    default one a look is free already, so a model that looks first still has its d actions."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return StepBudget(protocol, d, config.perturbation.extra_steps if protocol == "paper" else 0)


@dataclass(frozen=True)
class AgentMistake:
    actions: tuple[Action, ...]
    mistake: str  # the agent's own words for it, shortened
    record: dict[str, Any]  # how it was made (model, protocol, rule, budget, what was spent): case metadata


class PerturbationAgents:
    """The perturbation agents of one perturb stage: one per (model, desktop thread), since each thread owns
    its desktop and an agent holds one conversation at a time; closed at the end of the stage."""

    def __init__(self, agent_dirs: list[Path], protocol: str, log: Callable[[str], Any]) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
        self.agent_dirs, self.protocol, self.log = agent_dirs, protocol, log
        self._agents: dict[tuple[str, int], tuple[Agent, ModelConfig]] = {}

    def _agent(self, model: str, env: Environment) -> tuple[Agent, ModelConfig]:
        key = (model, id(env))
        if key not in self._agents:
            config = load_model_config(model, self.agent_dirs)
            self._agents[key] = (create_agent(config), config)
        return self._agents[key]

    def mistake(self, env: Environment, traj: Trajectory, t_seed: int, target: np.ndarray,
                p: AgentPerturbation) -> AgentMistake | str:
        """Let the agent act from the target state; a string says why no candidate came of it."""
        agent, config = self._agent(p.model, env)
        budget = step_budget(self.protocol, p.d, config)
        reset(env, traj.task, traj.base_dir)
        for action in traj.actions[:t_seed]:
            execute(env, action)
        if differing_pixels(env.screenshot(), target) > 0:
            return "target not reproduced"
        # the prompt's "at most $budget actions" is the mistake's limit, d; the extra steps are for looks
        context = AgentContext(instruction=traj.task.instruction, mode="perturbation", strategy="perturbation",
                               budget=p.d, screen=tuple(env.size))
        try:
            ran = drive(env, agent, context, budget.steps, count_looks=budget.count_looks)
        except InfraError as exc:
            self.log(f"  {traj.id}@{t_seed} {p.name}: {exc}, excluded")
            return "crash"
        done = [s for s in ran.steps if s.action["action"] not in NOT_ACTIONS]
        looked = any(s.action["action"] == "observe" for s in ran.steps)
        reason = None
        if ran.failed_actions or any(s.error for s in done):
            reason = "perturbation agent failed"  # an action that did not run cleanly cannot be replayed
        elif not done:
            spent = looked and ran.actions_used >= budget.steps
            reason = "perturbation budget spent on looks" if spent else "perturbation agent did nothing"
        elif len(done) > p.d:
            reason = "perturbation agent took more than d actions"
        if reason is not None:
            self.log(f"  {traj.id}@{t_seed} {p.name}: {reason} ({budget}: {ran.agent_turns} turn(s), "
                     f"{len(done)} action(s)), excluded")
            return reason
        rationale = next((s.rationale for s in reversed(ran.steps) if s.rationale), "")
        record = {"model": config.name, "protocol": budget.protocol,
                  "rule": config.perturbation.model_dump(), "budget": budget.steps,
                  "turns": ran.agent_turns, "steps_used": ran.actions_used, "actions": len(done)}
        return AgentMistake(tuple(Action.from_dict(s.action) for s in done), " ".join(rationale.split())[:300],
                            record)

    def close(self) -> None:
        for agent, _ in self._agents.values():
            agent.close()
        self._agents.clear()
