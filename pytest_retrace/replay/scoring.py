"""Scoring a recovery from the state the agent left: R_O (SSIM against the target, on a settled screen), the
error-state probes, the remaining ground-truth actions and the task's evaluator (R_TC).

Once the agent has acted, a failure here comes from the state it left and is scored as its failure, with the
reason, unless the environment reports a fault of its own (``blame``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.evaluators import Evaluation
from pytest_retrace.replay.cases import RecoveryCase, Task
from pytest_retrace.replay.judge import judge
from pytest_retrace.replay.probes import poll
from pytest_retrace.replay.reconstruct import PROBE_WAIT, run_actions
from pytest_retrace.replay.result import (
    InfraError,
    RecoveryResult,
    ReplayOptions,
    Stage,
    blame,
    count,
    timed_stage,
)
from pytest_retrace.screen.settle import Settled
from pytest_retrace.screen.similarity import screen_diff, ssim


def score(env: Environment, case: RecoveryCase, target: np.ndarray, opts: ReplayOptions,
          result: RecoveryResult) -> None:
    """R_O, the probes, the suffix and R_TC, from the state the agent left. A failure of any of them is the
    agent's (its reason recorded) unless the environment reports a fault of its own (``blame``)."""
    with timed_stage(result, opts, "observe", "R_O: SSIM(recovered, target)") as stage:
        try:
            settled = env.settle()
        except EnvError as exc:
            blame(env, "observe", exc)
            result.r_o, result.unobserved = False, f"the screen could not be read: {exc}"
            stage.title, stage.failed = "R_O: the screen could not be read", result.unobserved
        else:
            _similarity(settled, target, case, opts, result, stage)
    if case.probes:
        with timed_stage(result, opts, "probe", "error-state probes after the recovery") as stage:
            try:
                result.probes = _probes_restored(env, case)
            except EnvError as exc:
                blame(env, "probe", exc)
                result.probes = {p.describe(): False for p in case.probes}
                stage.failed = f"the probes could not be read: {exc}"
            else:
                off = [name for name, restored in result.probes.items() if not restored]
                stage.failed = ("not restored: " + ", ".join(off)) if off else None
    with timed_stage(result, opts, "suffix", f"suffix: {count(case.suffix, 'remaining ground-truth action')}") as stage:
        try:
            run_actions(env, case.suffix, "suffix", result)
        except InfraError as exc:
            blame(env, "suffix", exc)
            # the rest of the task cannot be carried out from the state the agent left: it is not completed
            why = f"the remaining ground-truth actions could not be replayed from the state the agent left: {exc.message}"
            result.evaluation = Evaluation(0.0, False, [why])
            result.r_tc, stage.failed = False, exc.message
            return
        result.suffix_len = len(case.suffix)
    with timed_stage(result, opts, "evaluate", "R_TC: the task's evaluator") as stage:
        result.evaluation = judge_left(env, case.task, case.dir, stage, "R_TC")
    result.r_tc = result.evaluation.passed


def judge_left(env: Environment, task: Task, task_dir: Path, stage: Stage, label: str,
               last_action: str | None = None) -> Evaluation:
    """The task's evaluator on the state an agent left (a recovery's R_TC, a forward episode's Φ): a desktop it
    left unreadable fails the evaluation, with the reason, unless the environment reports a fault of its own."""
    try:
        evaluation = judge(task, env, task_dir, last_action=last_action)
    except EnvError as exc:
        blame(env, "evaluate", exc)
        evaluation = Evaluation(0.0, False, [f"the evaluator could not read the state the agent left: {exc}"])
    except OSError as exc:  # the task's own files (its expected outputs): the harness's
        raise InfraError("evaluate", str(exc)) from exc
    stage.title = f"{label}: evaluator score {evaluation.score:g}"
    stage.failed = None if evaluation.passed else "; ".join(evaluation.details[:4]) or "failed"
    return evaluation



def _similarity(settled: Settled, target: np.ndarray, case: RecoveryCase, opts: ReplayOptions,
                result: RecoveryResult, stage: Stage) -> None:
    recovered = settled.frame
    result.recovered_screenshot = recovered
    result.ssim = round(ssim(recovered, target, case.masks), 6)
    # the target was a settled screen: one the agent left changing for the whole cap is not it
    result.r_o = result.ssim >= opts.ssim_threshold and settled.stable
    result.diff = screen_diff(recovered, target, case.masks)
    relation = ">=" if result.ssim >= opts.ssim_threshold else "<"
    stage.title = f"R_O: SSIM {result.ssim:.4f} {relation} {opts.ssim_threshold}"
    if not settled.stable:
        stage.title += f", but the screen never settled ({settled.seconds:.1f} s)"
    stage.failed = None if result.r_o else f"{stage.title}; {result.diff.describe()}"


def _probes_restored(env: Environment, case: RecoveryCase) -> dict[str, bool]:
    """Which probes are back at their target values after the recovery. An app writes some state on its own
    timer (mousepad's window state, seconds after start), so each gets the same grace as after the
    perturbation: polled for up to PROBE_WAIT + 1 s until every probe is back."""
    targets = [p.target for p in case.probes]
    values = poll(env, [p.get for p in case.probes], lambda vs: vs == targets, PROBE_WAIT + 1.0, interval=0.25)
    return {p.describe(): v == p.target for p, v in zip(case.probes, values)}
