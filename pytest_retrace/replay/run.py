"""Goal-oriented action replay of one recovery case (paper section 5.2).

reset → gt[0:t_seed] → verify s_target → perturbation → verify s_error → the agent acts (at most r actions)
→ recovered screenshot → R_O → gt[t_seed:] → Φ → R_TC.

The jobs live next door: ``reconstruct`` (the recorded states), ``drive`` (the agent's turns), ``scoring`` (R_O,
probes, suffix, R_TC) and ``result`` (what a replay produces, and ``InfraError``).

Who is to blame decides how a problem counts, and an agent must never be able to change its own n:
- the harness, the environment, a ground-truth replay that desyncs, the model's API down after retries:
  :class:`InfraError`, reported as a pytest *error* and left out of every rate;
- everything the model does — a reply that does not parse (after one re-ask), an action the desktop
  cannot complete — is recorded and scored as the agent's failure. The adapters turn any reply into
  actions or an invalid step, so a model cannot raise; an exception escaping an agent's ``start`` or
  ``act`` is a bug in agent code and an error of kind ``agent-bug``: it must never pass for a measurement;
- once the agent has acted, whatever goes wrong in observing, in the probes, the suffix or the evaluation
  comes from the state it left (a screen it keeps changing, a server grab, a process that swallows the
  suffix's keys), since from s_target itself the suffix never fails (the calibration replays it from the
  oracle's restored state every time): R_O or R_TC is false, with the reason. Only the harness's own fault,
  which the environment itself reports (``harness_fault``: its X server dead, the container gone, the guest
  not answering), is an error there (docs/cases.md, "Who is to blame").
"""

from __future__ import annotations

import time

from pytest_retrace.agents import Agent, AgentInfraError, HistoryStep
from pytest_retrace.envs import Environment
from pytest_retrace.replay.cases import RecoveryCase, load_png
from pytest_retrace.replay.drive import recover
from pytest_retrace.replay.reconstruct import reconstruct
from pytest_retrace.replay.result import InfraError, RecoveryResult, ReplayOptions, timed_stage
from pytest_retrace.replay.scoring import score
from pytest_retrace.replay.strategies import build_context


def run_case(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions) -> RecoveryResult:
    """Run one case end to end. Never raises for infra failures: they land in ``result.error``."""
    result = RecoveryResult(case.id, opts.ssim_threshold, budget=opts.budget)
    start, cpu = time.monotonic(), time.process_time()
    try:
        _run(env, case, agent, opts, result)
    except InfraError as exc:
        result.error = exc
    finally:
        result.timings["total"] = round(time.monotonic() - start, 4)
        result.cpu["total"] = round(time.process_time() - cpu, 4)
    return result


def _run(env: Environment, case: RecoveryCase, agent: Agent, opts: ReplayOptions, result: RecoveryResult) -> None:
    if tuple(env.size) != tuple(case.screen):
        raise InfraError("setup", f"environment screen {env.size} != case screen {case.screen}", kind="config")
    history: list[HistoryStep] = []
    reconstruct(env, case, opts, result, history)
    target = load_png(case.target_png)
    result.target_screenshot = target

    with timed_stage(result, opts, "context", f"context: {opts.strategy}"):
        try:
            context, usage = build_context(opts.strategy, instruction=case.task.instruction, budget=opts.budget,
                                           screen=tuple(env.size), history=history, t_seed=case.t_seed,
                                           target=target, contextualizer=opts.contextualizer)
        except AgentInfraError as exc:
            raise InfraError("context", f"contextualizer: {exc}", kind=exc.kind) from exc
        result.context_usage.add(usage)
    if agent.privileged:
        # the oracle's "ideal recovery": the very replay used to build s_target, verified the same way
        context.restore_target = lambda: reconstruct(env, case, opts, result, with_error=False)
    with timed_stage(result, opts, "recover", f"recovery: {agent.name}, budget {opts.budget}") as stage:
        recover(env, agent, context, opts, result)
        stage.title += f" ({result.actions_used} used)"
    score(env, case, target, opts, result)
