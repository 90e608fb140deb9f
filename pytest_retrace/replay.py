"""Goal-oriented action replay of one recovery case (paper section 5.2).

reset → gt[0:t_seed] → verify s_target (SSIM vs the recorded target) → perturbation → verify s_error
→ the agent acts for at most r turns → recovered screenshot → R_O → gt[t_seed:] → Φ → R_TC.

Anything that goes wrong in the harness, the environment or the agent's transport raises
:class:`InfraError`, which the plugin reports as a pytest *error* and leaves out of every rate:
a crashed desktop must never count as an agent that failed to recover.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .actions import Action
from .agents import Agent, AgentError, HistoryStep, Observation, RecoveryContext, Strategy
from .cases import RecoveryCase, load_png
from .envs import EnvError, Environment
from .evaluators import Evaluation, evaluate
from .oracle import ScreenDiff, differing_pixels, screen_diff, ssim


class InfraError(Exception):
    """An infrastructure failure at `stage`: reported as a pytest error, excluded from rates."""

    def __init__(self, stage: str, message: str, kind: str = "env") -> None:
        self.stage, self.kind, self.message = stage, kind, message
        super().__init__(f"[{stage}] {message}")


@dataclass(frozen=True)
class ReplayOptions:
    budget: int = 10  # r
    ssim_threshold: float = 0.99
    attempts: int = 3  # tries to reconstruct s_target and s_error before declaring an infra error
    verify_tolerance: int = 0  # differing pixels allowed when checking a reconstructed state
    strategy: Strategy = "implicit"


@dataclass
class StepLog:
    stage: str
    action: dict[str, Any]
    settle: float
    rationale: str = ""


@dataclass
class RecoveryResult:
    case_id: str
    ssim_threshold: float
    ssim: float | None = None
    r_o: bool | None = None
    r_tc: bool | None = None
    evaluation: Evaluation | None = None
    diff: ScreenDiff | None = None
    suffix_len: int = 0
    attempts: int = 0
    agent_turns: int = 0
    steps: list[StepLog] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    recovered_screenshot: np.ndarray | None = field(default=None, repr=False)
    target_screenshot: np.ndarray | None = field(default=None, repr=False)
    error: InfraError | None = None

    def __repr__(self) -> str:  # pytest prints fixture values in tracebacks: keep it to one short line
        return (f"RecoveryResult(case={self.case_id!r}, verdict={self.verdict!r}, ssim={self.ssim}, "
                f"r_o={self.r_o}, r_tc={self.r_tc})")

    @property
    def recovered(self) -> bool:
        """R = R_TC ∧ R_O."""
        return bool(self.r_o and self.r_tc)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "error"
        return "recovered" if self.recovered else "not_recovered"


@contextmanager
def _timed(result: RecoveryResult, stage: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        result.timings[stage] = round(result.timings.get(stage, 0.0) + time.monotonic() - start, 4)


def _run_actions(env: Environment, actions: list[Action], stage: str, result: RecoveryResult,
                 history: list[HistoryStep] | None = None) -> None:
    for action in actions:
        before = env.screenshot() if history is not None else None
        try:
            settle = env.execute(action)
        except EnvError as exc:
            raise InfraError(stage, f"{action.describe()}: {exc}") from exc
        result.steps.append(StepLog(stage, action.to_dict(), round(settle, 4)))
        if history is not None:
            history.append(HistoryStep(before, action))


def reconstruct(env: Environment, case: RecoveryCase, opts: ReplayOptions, result: RecoveryResult,
                history: list[HistoryStep] | None = None, with_error: bool = True) -> None:
    """Drive a fresh environment to s_target (and on to s_error), verified by SSIM; retried."""
    target, error = load_png(case.target_png), load_png(case.error_png)
    problems: list[str] = []
    for attempt in range(1, opts.attempts + 1):
        result.attempts = attempt
        if history is not None:
            history.clear()
        with _timed(result, "reset"):
            try:
                env.reset(case.task, case.dir)
            except EnvError as exc:
                raise InfraError("reset", str(exc)) from exc
        with _timed(result, "prefix"):
            _run_actions(env, case.prefix, "prefix", result, history)
        with _timed(result, "verify"):
            shot = env.screenshot()
            off = differing_pixels(shot, target, case.masks)
        if off > opts.verify_tolerance:
            problems.append(f"attempt {attempt}: target state off by {off} px (SSIM {ssim(shot, target, case.masks):.4f})")
            continue
        if not with_error:
            return
        with _timed(result, "perturb"):
            _run_actions(env, case.perturbation, "perturb", result, history)
        with _timed(result, "verify"):
            shot = env.screenshot()
            off = differing_pixels(shot, error, case.masks)
        if off <= opts.verify_tolerance:
            return
        problems.append(f"attempt {attempt}: error state off by {off} px (SSIM {ssim(shot, error, case.masks):.4f})")
    raise InfraError(
        "reconstruct",
        f"could not reproduce the recorded states (tolerance {opts.verify_tolerance} px): " + "; ".join(problems),
        kind="desync",
    )


def run_case(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions) -> RecoveryResult:
    """Run one case end to end. Never raises for infra failures: they land in ``result.error``."""
    result = RecoveryResult(case.id, opts.ssim_threshold)
    start = time.monotonic()
    try:
        _run(env, case, agent, opts, result)
    except InfraError as exc:
        result.error = exc
    finally:
        result.timings["total"] = round(time.monotonic() - start, 4)
    return result


def _run(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions, result: RecoveryResult) -> None:
    env_masks = getattr(env, "masks", None)
    if env_masks is not None:
        env.masks = case.masks  # type: ignore[attr-defined]  # settling ignores the case's masked regions
    if tuple(env.size) != tuple(case.screen):
        raise InfraError("setup", f"environment screen {env.size} != case screen {case.screen}", kind="config")
    history: list[HistoryStep] = []
    reconstruct(env, case, opts, result, history)
    target = load_png(case.target_png)
    result.target_screenshot = target

    def restore_target() -> None:
        # the oracle's "ideal recovery": the very replay used to build s_target, verified the same way
        reconstruct(env, case, opts, result, with_error=False)

    context = RecoveryContext(
        instruction=case.task.instruction, strategy=opts.strategy, budget=opts.budget, history=history,
        t_seed=case.t_seed, target_screenshot=target if opts.strategy == "explicit" else None,
        ssim_threshold=opts.ssim_threshold, restore_target=restore_target if agent.privileged else None,
    )
    with _timed(result, "recover"):
        _recover(env, agent, context, opts, result)
    with _timed(result, "observe"):
        recovered = env.screenshot()
        result.recovered_screenshot = recovered
        result.ssim = round(ssim(recovered, target, case.masks), 6)
        result.r_o = result.ssim >= opts.ssim_threshold
        result.diff = screen_diff(recovered, target, case.masks)
    with _timed(result, "suffix"):
        _run_actions(env, case.suffix, "suffix", result)
        result.suffix_len = len(case.suffix)
    with _timed(result, "evaluate"):
        try:
            result.evaluation = evaluate(case.task.evaluator, env, case.dir)
        except (EnvError, OSError) as exc:
            raise InfraError("evaluate", str(exc)) from exc
    result.r_tc = result.evaluation.passed


def _recover(env: Environment, agent: Agent, context: RecoveryContext, opts: ReplayOptions,
             result: RecoveryResult) -> None:
    try:
        agent.start(context)
    except AgentError as exc:
        raise InfraError("agent", str(exc), kind="agent") from exc
    for turn_no in range(opts.budget):
        observation = Observation(env.screenshot(), turn_no)
        try:
            turn = agent.act(observation)
        except AgentError as exc:
            raise InfraError("agent", f"turn {turn_no}: {exc}", kind="agent") from exc
        result.agent_turns = turn_no + 1
        for action in turn.actions:
            if action.terminal:
                result.steps.append(StepLog("recover", action.to_dict(), 0.0, turn.rationale))
                return
            try:
                settle = env.execute(action)
            except EnvError as exc:
                raise InfraError("recover", f"{action.describe()}: {exc}") from exc
            result.steps.append(StepLog("recover", action.to_dict(), round(settle, 4), turn.rationale))
        if not turn.actions:
            return  # an agent that proposes nothing has finished
