"""End-to-end recovery (paper §6, appendix B.2): a forward episode with an error detector asked after every
forward step; on a detection the recovery-step detector names R, the environment is brought back to the state
after step R, and the forward agent goes on from there with its history cut at R and a short note saying so.

How it is brought back (the test's ``mode``):
- ``none``: never (the detector is not asked): the baseline every other mode is compared with;
- ``ideal``: the harness resets and replays the episode's first R actions, verified pixel for pixel against the
  screen it recorded after step R (the upper bound; a replay that does not reproduce is a desync, excluded);
- a recovery strategy (``explicit-0E``, ``explicit-0R``, ``explicit-none``, ``explicit-context``, ``implicit``):
  the recovery agent (by default the same model config as the forward agent, a fresh instance: the same
  backbone, other prompts) gets the strategy's context (replay.strategies: the history so far, the one up to R,
  none, or a summary; the target = the recorded screen of step R) and ``budget`` actions to restore it.
  Whether it did is R_O against that screen (SSIM >= the threshold) and, when the task's cases carry probes
  (replay.probes), every probe's value equal to the one read after step R of this episode (the forward steps
  are probed only then: a strategy runs and the task has getters; the reads are timed, ``probe_reads``). A
  restore that looks right but left a file changed did not reach s_R.

The paper's rules: the detector is asked once per forward step, and not for ``FREEZE`` steps after a recovery;
at most ``max_recoveries`` recoveries an episode; recovery actions do not count against the forward agent's
``max_steps`` (which counts every forward action, including those a recovery undid).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import Agent, AgentContext, HistoryStep, Usage
from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.experiments.detectors import ErrorDetector, RecoveryStepDetector
from pytest_retrace.experiments.forward import ForwardResult, Recording, judge_stage, reset_stage, timed_episode
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.drive import recover
from pytest_retrace.replay.probes import AnyGetter, poll, settled_values
from pytest_retrace.replay.reconstruct import PROBE_WAIT, replay_to
from pytest_retrace.replay.result import InfraError, RecoveryResult, ReplayObserver, ReplayOptions, timed_stage
from pytest_retrace.replay.strategies import STRATEGIES, Contextualizer, build_context
from pytest_retrace.screen.similarity import ssim

FREEZE = 5  # forward steps the error detector is not asked after a recovery (the paper's)
MODES = ("none", "ideal", *STRATEGIES)
NOTE = ("The environment has been restored to the state after step {step} of this task: the steps after it were "
        "undone and are not shown. Continue the task from the current screen.")


@dataclass(frozen=True)
class Recovery:
    """How an episode recovers: the mode, and for every mode but none the detectors, at most how many
    recoveries, the recovery agent and its budget per attempt."""

    mode: str
    max_recoveries: int = 1
    errors: ErrorDetector | None = None
    backs: RecoveryStepDetector | None = None
    agent: Agent | None = None  # a strategy's recovery agent
    budget: int = 10
    contextualizer: Contextualizer | None = None
    ssim_threshold: float = 0.99
    attempts: int = 3  # ideal: tries to reproduce the prefix
    getters: tuple[AnyGetter, ...] = ()  # the task's cases' probe getters: a strategy's restore must match them

    @property
    def probing(self) -> bool:
        """Whether the forward steps are probed: only a recovery agent's restore is checked against them (the
        ideal one replays the episode's own actions, verified pixel for pixel)."""
        return self.mode not in ("none", "ideal") and bool(self.getters)


@dataclass
class Attempt:
    """One recovery: when the detector fired, what it and the recovery-step detector said, and the restore."""

    at: int  # forward actions spent when the detector fired
    error_step: int  # E, in the history as it was then
    step: int  # R
    reached: bool | None = None  # the restore reached s_R: R_O and every probe matches
    r_o: bool | None = None  # R_O alone: the screen against the one recorded after step R
    ssim: float | None = None
    probes: dict[str, bool] | None = None  # per getter, its value equals the one after step R (None: no probes)
    actions: int = 0  # the recovery agent's
    usage: Usage = field(default_factory=Usage)
    decisions: dict[str, Any] = field(default_factory=dict)  # {"error": Decision.to_dict(), "recovery": ...}


@dataclass
class Episode:
    """The forward agent's view, cut at each recovery: its steps and the screen after each (``screens[i]`` after
    ``i`` steps), and how far the drive's log has been read into them."""

    steps: list[HistoryStep]
    screens: list[np.ndarray]
    values: list[list[str]] = field(default_factory=list)  # probed: the getters' values, as screens
    read: int = 0
    frames_read: int = 0


def run_end_to_end(env: Environment, task: Task, task_dir: Path, agent: Agent, recovery: Recovery, *,
                   max_steps: int, ground_truth: list[Action] | None = None,
                   observer: ReplayObserver | None = None) -> ForwardResult:
    """One episode with recoveries. Never raises for infrastructure failures: they land in ``result.error``."""
    opts = ReplayOptions(budget=max_steps, observer=observer, attempts=recovery.attempts)
    return timed_episode(task.id, max_steps, opts,
                         lambda result: _run(env, task, task_dir, agent, recovery, ground_truth, opts, result))


def _run(env: Environment, task: Task, task_dir: Path, agent: Agent, recovery: Recovery,
         ground_truth: list[Action] | None, opts: ReplayOptions, result: ForwardResult) -> None:
    drive = result.drive
    reset_stage(env, task, task_dir, opts, result)
    assert result.initial is not None
    episode = Episode([], [result.initial])
    recording = Recording(env, result.frames)
    if recovery.probing:
        episode.values.append(_read_probes(env, recovery.getters, drive))
        recording = _Probed(env, result.frames, recovery.getters, drive)
    note, frozen_until = None, 0
    while drive.actions_used < opts.budget:
        fired: list[Attempt] = []
        context = AgentContext(instruction=task.instruction, mode="forward", strategy="implicit", budget=opts.budget,
                               screen=tuple(env.size), history=list(episode.steps), note=note,
                               ground_truth=list(ground_truth or []) if agent.privileged else None)

        def after_turn() -> bool:
            _read_steps(drive, result.frames, episode, recording)
            if recovery.mode == "none" or len(result.recoveries) >= recovery.max_recoveries \
                    or drive.actions_used < frozen_until or not episode.steps:
                return False
            attempt = _detect(task, episode, recovery, result, drive.actions_used)
            if attempt is not None:
                fired.append(attempt)
            return attempt is not None

        with timed_stage(drive, opts, "recover", f"forward: {agent.name}") as stage:
            recover(recording, agent, context, opts, drive, after_turn=after_turn)  # type: ignore[arg-type]
            stage.title += f" ({drive.actions_used} of {opts.budget} used)"
        if not fired:
            break
        attempt = fired[0]
        with timed_stage(drive, opts, "restore", f"restore: step {attempt.step} ({recovery.mode})") as stage:
            _restore(env, task, task_dir, recovery, episode, attempt, opts, result)
            stage.failed = None if attempt.reached else f"the restore did not reach step {attempt.step} " \
                                                         f"(SSIM {attempt.ssim})"
        result.recoveries.append(attempt)
        del episode.steps[attempt.step:], episode.screens[attempt.step + 1:], episode.values[attempt.step + 1:]
        note, frozen_until = NOTE.format(step=attempt.step), drive.actions_used + FREEZE
    _read_steps(drive, result.frames, episode, recording)
    judge_stage(env, task, task_dir, opts, result)


class _Probed(Recording):
    """A Recording that also reads the task's probes after every executed action (the state each forward step
    left, which a restore to it must match), timed into the episode's ``probe_reads``."""

    def __init__(self, env: Environment, frames: list[np.ndarray], getters: tuple[AnyGetter, ...],
                 drive: RecoveryResult) -> None:
        super().__init__(env, frames)
        self.env, self.getters, self.drive = env, getters, drive
        self.values: list[list[str]] = []  # after each executed action, as the frames

    def execute(self, action: Action) -> Any:
        settled = super().execute(action)
        self.values.append(_read_probes(self.env, self.getters, self.drive))
        return settled


def _read_probes(env: Environment, getters: tuple[AnyGetter, ...], drive: RecoveryResult) -> list[str]:
    """The getters' values once they hold still (as the build reads a case's target values). A desktop that
    cannot be read is the harness's failure: the episode is an infrastructure error, never a verdict."""
    start = time.monotonic()
    try:
        return settled_values(env, list(getters))
    except EnvError as exc:
        raise InfraError("probes", f"reading the task's probes after a forward step: {exc}") from exc
    finally:
        drive.timings["probe_reads"] = round(drive.timings.get("probe_reads", 0.0) + time.monotonic() - start, 4)


def _read_steps(drive: RecoveryResult, frames: list[np.ndarray], episode: Episode, recording: Recording) -> None:
    """The forward steps executed since the last look, onto the episode: each with the screen before it (the
    recorded frames, and the probe values when probed, follow the executed actions one for one)."""
    for log in drive.steps[episode.read:]:
        name = log.action.get("action")
        if log.error is None and name not in ("done", "fail", "invalid", "observe"):
            episode.steps.append(HistoryStep(episode.screens[-1], Action.from_dict(log.action), log.rationale))
            episode.screens.append(frames[episode.frames_read])
            if isinstance(recording, _Probed):
                episode.values.append(recording.values[episode.frames_read])
            episode.frames_read += 1
    episode.read = len(drive.steps)


def _detect(task: Task, episode: Episode, recovery: Recovery, result: ForwardResult, spent: int) -> Attempt | None:
    """Ask the error detector about the history so far; on an error, the recovery-step detector for R. The
    model's API down after retries is the harness's (an infrastructure error), as for any model call."""
    from pytest_retrace.agents import AgentInfraError

    assert recovery.errors is not None and recovery.backs is not None
    try:
        found = recovery.errors.first_error(task.instruction, episode.steps, episode.screens[-1])
        result.detector_usage.add(found.usage)
        result.detector_calls += 1
        if not found.valid or found.step is None or found.step > len(episode.steps):
            return None
        back = recovery.backs.recovery_step(task.instruction, episode.steps[:found.step], found.step)
        result.detector_usage.add(back.usage)
        result.detector_calls += 1
    except AgentInfraError as exc:
        raise InfraError("detector", str(exc), kind=exc.kind) from exc
    if not back.valid or back.step is None or not 0 <= back.step < found.step:
        return None
    return Attempt(spent, found.step, back.step, decisions={"error": found.to_dict(), "recovery": back.to_dict()})


def _restore(env: Environment, task: Task, task_dir: Path, recovery: Recovery, episode: Episode, attempt: Attempt,
             opts: ReplayOptions, result: ForwardResult) -> None:
    target = episode.screens[attempt.step]
    prefix = [s.action for s in episode.steps[:attempt.step]]
    scratch = RecoveryResult(task.id, 0.0, budget=recovery.budget)

    def ideal() -> None:  # the harness's own replay: a desync is its failure, never the agent's
        replay_to(env, task, task_dir, prefix, target, opts, scratch, state=f"step {attempt.step}")

    if recovery.mode == "ideal":
        ideal()
        attempt.reached, attempt.r_o, attempt.ssim = True, True, 1.0
        return
    assert recovery.agent is not None
    try:
        context, usage = build_context(recovery.mode, instruction=task.instruction, budget=recovery.budget,
                                       screen=tuple(env.size), history=list(episode.steps), t_seed=attempt.step,
                                       target=target, contextualizer=recovery.contextualizer)
    except Exception as exc:  # noqa: BLE001 - the contextualizer's API down: the harness's
        raise InfraError("context", f"contextualizer: {exc}") from exc
    attempt.usage.add(usage)
    context.restore_target = ideal  # only a privileged recovery agent (the oracle) is given it
    strategy_opts = ReplayOptions(budget=recovery.budget, strategy=recovery.mode, observer=opts.observer)
    recover(env, recovery.agent, context, strategy_opts, scratch)
    attempt.actions = scratch.actions_used
    attempt.usage.add(scratch.usage)
    try:
        shot = env.screenshot()
    except EnvError:  # what the recovery agent left cannot be read: it did not restore anything
        attempt.reached = attempt.r_o = False
        return
    attempt.ssim = round(ssim(shot, target), 6)
    attempt.r_o = attempt.ssim >= recovery.ssim_threshold
    attempt.reached = attempt.r_o
    if recovery.probing:
        attempt.probes = _probes_match(env, recovery.getters, episode.values[attempt.step], wait=attempt.r_o)
        attempt.reached = attempt.r_o and all(attempt.probes.values())


def _probes_match(env: Environment, getters: tuple[AnyGetter, ...], recorded: list[str], *,
                  wait: bool) -> dict[str, bool]:
    """Per getter, whether its value now equals the one read after step R. An app may write what the restore
    changed a moment later: polled for up to PROBE_WAIT + 1 s until all match (as replay checks a recovery's
    probes), only when the screen matched (otherwise s_R is missed anyway: one read says what differs)."""
    try:
        values = poll(env, getters, lambda vs: vs == recorded, PROBE_WAIT + 1.0 if wait else 0.0, interval=0.25)
    except EnvError:  # what the recovery agent left cannot be read: nothing it restored can be vouched for
        return {g.describe(): False for g in getters}
    return {g.describe(): v == r for g, v, r in zip(getters, values, recorded)}
