"""Reconstructing a case's recorded states: reset → gt[0:t_seed] → verify s_target → perturbation → verify
s_error, retried; and replaying ground-truth actions, whose failures are always the harness's (a desync).

A state is verified pixel for pixel (masks applied), or by the optional LLM verifier; a case with probes must
also show its perturbation took effect off screen."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.agents import AgentInfraError, HistoryStep
from pytest_retrace.envs import ActionFailed, EnvError, Environment
from pytest_retrace.replay.cases import RecoveryCase, Task, load_png
from pytest_retrace.replay.judge import reset
from pytest_retrace.replay.probes import poll
from pytest_retrace.replay.result import (
    InfraError,
    RecoveryResult,
    ReplayOptions,
    StepLog,
    count,
    timed_stage,
)
from pytest_retrace.screen.frames import Rect
from pytest_retrace.screen.similarity import differing_pixels, screen_diff, ssim

VERIFY_POLL = 0.1  # seconds between two looks at a state still on its way to the recorded pixels
PROBE_WAIT = 3.0  # seconds an app may take to write what the perturbation changed (GSettings, autosave)


def run_actions(env: Environment, actions: list[Action], stage: str, result: RecoveryResult,
                history: list[HistoryStep] | None = None) -> None:
    """Replay ground-truth actions: any failure here is the harness's (a desync), never the agent's."""
    for action in actions:
        before = env.screenshot() if history is not None else None
        try:
            settled = env.execute(action)
        except EnvError as exc:
            raise InfraError(stage, f"{action.describe()}: {exc}", kind="desync" if isinstance(exc, ActionFailed)
                             else "env") from exc
        result.steps.append(StepLog(stage, action.to_dict(), round(settled.seconds, 4), settled=settled.stable))
        if not settled.stable:
            # the next action, or the state check, would act on a screen still changing: not a replay
            raise InfraError(stage, f"{action.describe()}: the screen was still changing after "
                                    f"{settled.seconds:.1f} s (the settle cap)", kind="unsettled")
        if history is not None:
            history.append(HistoryStep(before, action))



def _matches(env: Environment, expected: np.ndarray, masks: Sequence[Rect], opts: ReplayOptions,
             result: RecoveryResult, state: str) -> tuple[bool, str, np.ndarray]:
    """Is the reconstructed `state` the recorded one? Pixel for pixel, or else by the LLM verifier if one is
    configured (for environments that cannot reproduce a screen exactly). Returns the screen it judged.

    The screen is polled for up to ``opts.verify_wait`` seconds until it matches: an app finishes some redraws
    on idle timers after the screen was quiet for a moment (LibreOffice's toolbar states, rulers and status
    fields), and under load (-n 16 on 2 cores) those come seconds late. Waiting for the recorded screen, not
    for any quiet screen, is what makes that safe: a state that never reaches the recording still fails."""
    deadline = time.monotonic() + opts.verify_wait
    while True:
        shot = env.screenshot()
        off = differing_pixels(shot, expected, masks)
        if off <= opts.verify_tolerance:
            result.reconstruction[state] = "pixels"
            return True, "", shot
        if time.monotonic() >= deadline:
            break
        time.sleep(VERIFY_POLL)
    diff = screen_diff(shot, expected, masks)  # where it differs tells a dialog from a shifted layout
    problem = f"{state} state off: {diff.describe()} (SSIM {ssim(shot, expected, masks):.4f})"
    if opts.verifier is None:
        return False, problem, shot
    try:
        same, reason, usage = opts.verifier.same_state(expected, shot, state)
    except AgentInfraError as exc:
        raise InfraError("verify", f"state verifier: {exc}", kind=exc.kind) from exc
    result.context_usage.add(usage)
    if same:
        result.reconstruction[state] = f"verifier ({off} px differ): {reason}"
        return True, "", shot
    return False, f"{problem}; the verifier says different: {reason}", shot


def _probes_differ(env: Environment, case: RecoveryCase) -> tuple[bool, str]:
    """Did the perturbation take effect off screen? Every probe must leave its target value."""
    targets = [p.target for p in case.probes]
    try:
        values = poll(env, [p.get for p in case.probes], lambda vs: all(map(str.__ne__, vs, targets)), PROBE_WAIT)
    except EnvError as exc:
        raise InfraError("verify", f"probe: {exc}") from exc
    pending = [p for p, v in zip(case.probes, values) if v == p.target]
    if pending:
        return False, "error state not reached: " + "; ".join(
            f"probe {p.describe()} still has its target value after the perturbation" for p in pending)
    return True, ""


def reconstruct(env: Environment, case: RecoveryCase, opts: ReplayOptions, result: RecoveryResult,
                history: list[HistoryStep] | None = None, with_error: bool = True) -> None:
    """Drive a fresh environment to s_target (and on to s_error), verified; retried up to `attempts` times.

    With ``opts.restore == "checkpoint"`` the state comes from the case's checkpoint of it on this desktop when
    there is one, checked as a replayed state is (pixels; for s_error the probes too). Else it is replayed, and
    checkpoints of s_target and of s_error are taken on the way; the test goes on from the replayed desktop, which
    CRIU only stopped for the dump and which is checked again after it. (Until 2026-12 each was restored at once,
    so that every test of a case ran on a restored desktop: two restores and their checks more per case, for a
    sameness the checks of every restored state already hold; the suite's calibration 740 -> 696 s without.)
    ``result.reconstruction["restore"]`` (s_error) and ``["restore_target"]`` (the oracle's ideal recovery) say
    which: "checkpoint", or "replay (<why>)", "replay (checkpoint taken)" for the test that took it."""
    state = "error" if with_error else "target"
    note = _note(state)
    if opts.restore != "checkpoint":
        _replay(env, case, opts, result, history, with_error)
        return
    if opts.restore_problem is not None:
        result.reconstruction[note] = f"replay (checkpoints unavailable: {opts.restore_problem})"
        _replay(env, case, opts, result, history, with_error)
        return
    if env.has_checkpoint(_key(case, state)) and _restored(env, case, state, opts, result, history):  # type: ignore[attr-defined]
        return
    _replay(env, case, opts, result, history, with_error, checkpoint_target=True)
    if with_error and not _checkpointed(env, case, "error", opts, result, history):
        _replay(env, case, opts, result, history, with_error)  # the desktop changed at the dump: replay once more


def _key(case: RecoveryCase, state: str) -> str:
    return f"{case.dir}::{case.id}::{state}"


def _note(state: str) -> str:
    """The record's key for how `state` was reached: "restore" (s_error), "restore_target" (s_target)."""
    return "restore" if state == "error" else "restore_target"


def _checkpointed(env: Environment, case: RecoveryCase, state: str, opts: ReplayOptions, result: RecoveryResult,
                  history: list[HistoryStep] | None = None) -> bool:
    """Checkpoint the verified `state` the desktop is in; the desktop goes on, checked again as a restored one is
    (CRIU stopped it for the dump). False only when that check fails (the caller replays)."""
    with timed_stage(result, opts, "checkpoint", f"checkpoint s_{state}"):
        payload = list(history) if history is not None else None
        why = env.take_checkpoint(_key(case, state), payload)  # type: ignore[attr-defined]
    note = _note(state)
    if why is not None:
        result.reconstruction[note] = f"replay (no checkpoint: {why})"
        return True
    problem = _checked(env, case, state, opts, result, "after its checkpoint")
    if problem is None:
        result.reconstruction[note] = "replay (checkpoint taken)"
        return True
    env.drop_checkpoint(_key(case, state))  # type: ignore[attr-defined]
    result.reconstruction[note] = f"replay (the desktop was not s_{state} after its checkpoint: {problem})"
    return False


def _restored(env: Environment, case: RecoveryCase, state: str, opts: ReplayOptions, result: RecoveryResult,
              history: list[HistoryStep] | None) -> bool:
    """Restore the case's checkpoint of `state` and check it as a replayed state is checked; on any failure the
    checkpoint is dropped and the reason recorded (the caller replays)."""
    key, note = _key(case, state), _note(state)
    with timed_stage(result, opts, "restore", f"restore s_{state} from its checkpoint") as stage:
        try:
            payload, why = env.restore_checkpoint(key, case.masks)  # type: ignore[attr-defined]
        except EnvError as exc:
            raise InfraError("restore", str(exc)) from exc
        stage.failed = why
    if why is None:
        problem = _checked(env, case, state, opts, result, "restored")
        if problem is None:
            result.attempts = max(result.attempts, 1)
            result.reconstruction[note] = "checkpoint"
            if history is not None and state == "error":
                history[:] = payload or []
            return True
        why = f"the restored desktop is not s_{state}: {problem}"
        env.drop_checkpoint(key)  # type: ignore[attr-defined]
    result.reconstruction[note] = f"replay (checkpoint not restored: {why})"
    return False


def _checked(env: Environment, case: RecoveryCase, state: str, opts: ReplayOptions, result: RecoveryResult,
             how: str) -> str | None:
    """Is the desktop, `how` (restored, after its checkpoint), still the case's verified `state`: its pixels, and
    for s_error its probes? None, else what is off."""
    expected = load_png(case.error_png if state == "error" else case.target_png)
    with timed_stage(result, opts, "verify", f"verify s_{state} {how}") as stage:
        ok, problem, shot = _matches(env, expected, case.masks, opts, result, state)
        if ok and state == "error" and case.probes:
            ok, problem = _probes_differ(env, case)
        stage.failed, stage.screenshot = (None, None) if ok else (problem, shot)
    return None if ok else problem


def _replay(env: Environment, case: RecoveryCase, opts: ReplayOptions, result: RecoveryResult,
            history: list[HistoryStep] | None, with_error: bool, checkpoint_target: bool = False) -> None:
    """The replay itself; with `checkpoint_target`, s_target is checkpointed once verified (and the perturbation
    replayed on its restore), unless the case already has that checkpoint here."""
    target, error = load_png(case.target_png), load_png(case.error_png)
    problems: list[str] = []
    resets_failed = 0
    for attempt in range(1, opts.attempts + 1):
        result.attempts = max(result.attempts, attempt)  # the most any reconstruction of this test took
        if history is not None:
            history.clear()
        failed = _reset(env, case.task, case.dir, case.masks, attempt, opts, result)
        if failed:
            problems.append(failed)
            resets_failed += 1
            continue
        with timed_stage(result, opts, "prefix", f"prefix: {count(case.prefix, 'ground-truth action')}"):
            slow = _replayed(env, case.prefix, "prefix", result, history)
        if slow:
            problems.append(f"attempt {attempt}: {slow}")
            continue
        with timed_stage(result, opts, "verify", "verify s_target") as stage:
            ok, problem, shot = _matches(env, target, case.masks, opts, result, "target")
            stage.failed, stage.screenshot = (None, None) if ok else (problem, shot)
        if not ok:
            problems.append(f"attempt {attempt}: {problem}")
            continue
        if (checkpoint_target and not env.has_checkpoint(_key(case, "target"))  # type: ignore[attr-defined]
                and not _checkpointed(env, case, "target", opts, result)):
            problems.append(f"attempt {attempt}: the desktop was not s_target after its checkpoint")
            checkpoint_target = False
            continue
        if not with_error:
            return
        with timed_stage(result, opts, "perturb", f"perturbation: {count(case.perturbation, 'action')}"):
            slow = _replayed(env, case.perturbation, "perturb", result, history)
        if slow:
            problems.append(f"attempt {attempt}: {slow}")
            continue
        with timed_stage(result, opts, "verify", "verify s_error") as stage:
            ok, problem, shot = _matches(env, error, case.masks, opts, result, "error")
            stage.screenshot = None if ok else shot
            if ok and case.probes:
                ok, problem = _probes_differ(env, case)
            stage.failed = problem or None
        if ok:
            return
        problems.append(f"attempt {attempt}: {problem}")
    if resets_failed == opts.attempts:  # an error of the reset, not of the recorded states
        raise InfraError("reset", "; ".join(problems))
    raise InfraError(
        "reconstruct",
        f"could not reproduce the recorded states (tolerance {opts.verify_tolerance} px): " + "; ".join(problems),
        kind=_kind(problems),
    )


def _reset(env: Environment, task: Task, task_dir: Path, masks: Sequence[Rect], attempt: int, opts: ReplayOptions,
           result: RecoveryResult) -> str | None:
    """A fresh desktop for this attempt, or why not. Nothing has acted yet, so a failure is the harness's and
    another attempt may get past it: an app that did not show its window within its timeout in a fresh
    container, a desktop that did not start under load."""
    with timed_stage(result, opts, "reset", f"reset (attempt {attempt})" if attempt > 1 else "reset") as stage:
        try:
            reset(env, task, task_dir, masks=masks)
        except EnvError as exc:
            stage.failed = str(exc)
            return f"attempt {attempt}: reset: {exc}"
    return None


def _replayed(env: Environment, actions: list[Action], stage: str, result: RecoveryResult,
              history: list[HistoryStep] | None = None) -> str | None:
    """Replay ground truth; a screen still changing at the settle cap is returned (another attempt may be
    quicker: under load an app's redraw can outlast the cap once), any other failure raised."""
    try:
        run_actions(env, actions, stage, result, history)
    except InfraError as exc:
        if exc.kind != "unsettled":
            raise
        return f"{stage} {exc.message}"
    return None


def _kind(problems: list[str]) -> str:
    """unsettled when no attempt got as far as a state check, else desync."""
    return "unsettled" if problems and all("the settle cap" in p for p in problems) else "desync"



def replay_to(env: Environment, task: Task, task_dir: Path, prefix: list[Action], expected: np.ndarray,
              opts: ReplayOptions, result: RecoveryResult, state: str = "step") -> None:
    """Drive a fresh environment through a saved action prefix to the screen it recorded (an ideal-recovery
    continuation's state R), verified as s_target is; retried up to `attempts` times, else a desync."""
    problems: list[str] = []
    resets_failed = 0
    for attempt in range(1, opts.attempts + 1):
        result.attempts = max(result.attempts, attempt)  # the most any reconstruction of this test took
        failed = _reset(env, task, task_dir, (), attempt, opts, result)
        if failed:
            problems.append(failed)
            resets_failed += 1
            continue
        with timed_stage(result, opts, "prefix", f"prefix: {count(prefix, 'saved action')}"):
            slow = _replayed(env, prefix, "prefix", result)
        if slow:
            problems.append(f"attempt {attempt}: {slow}")
            continue
        with timed_stage(result, opts, "verify", f"verify the {state} state") as stage:
            ok, problem, shot = _matches(env, expected, (), opts, result, state)
            stage.failed, stage.screenshot = (None, None) if ok else (problem, shot)
        if ok:
            return
        problems.append(f"attempt {attempt}: {problem}")
    if resets_failed == opts.attempts:
        raise InfraError("reset", "; ".join(problems))
    raise InfraError("reconstruct", f"the saved prefix did not reproduce its recorded screen (tolerance "
                                    f"{opts.verify_tolerance} px): " + "; ".join(problems), kind=_kind(problems))
