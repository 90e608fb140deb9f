"""Verifying a candidate case on a real desktop: the one check that both `retrace build` (stage 4)
and `retrace record` (hand-written cases) trust, so the two can never disagree on what a case is.

A candidate (prefix a_0..a_{t_seed-1}, perturbation, suffix a_{t_seed}..a_T) is replayed `runs` times
from reset. It becomes a case only if
- every run reaches the same target and error screens and the same evaluator verdict (reproducible),
- the target is the one recorded earlier, when there is one (the pipeline's canonical screenshot),
- the error is real: the remaining gt actions fail from it, or (visual-only) they still succeed but
  the screen is visibly off (SSIM below R_O's threshold);
- an error screen equal to the target screen is verifiable: some probe (a getter: a file's hash, a
  command's output) has one value at s_target on every run and another one at s_error on every run. Such a
  case carries its probes, and every replay checks them (replay/scoring.py). A hand-written case whose error state
  nothing can observe may declare `verified_by: determinism` (`retrace record` only; the build never does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.envs import Environment
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.judge import judge, reset
from pytest_retrace.replay.probes import AnyGetter, Probe, digest, poll, probe_value, settled_values
from pytest_retrace.screen.similarity import differing_pixels, ssim

LATE_READ = 3.0  # seconds after which a probe's target value is read again: it must not have moved
Masks = Sequence[tuple[int, int, int, int]] | None


class Rejected(Exception):
    """The candidate is not a case. `reason` is a short key the pipeline counts; the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Verified:
    target: np.ndarray
    error: np.ndarray
    suffix_passes: bool
    ssim: float  # SSIM(error, target)
    kind: str  # measured: visible | subtle | hidden-state | visual-only
    identical: bool  # the error screen equals the target screen pixel for pixel (masks applied)
    probes: list[Probe]  # probes whose value at s_error differed from their value at s_target on every run
    error_state: str  # digest of every probe's value at s_error (first run): what lies behind the error screen
    runs: int
    worst_px: dict[str, int]  # most pixels by which a run's target / error screen differed from the first run's


def measured_kind(suffix_passes: bool, sim: float, threshold: float, identical: bool) -> str:
    """Which half of the oracle R = R_TC ∧ R_O catches the error, measured, never taken from the mistake's
    intent: visual-only (the remaining gt actions still succeed: R_O only), visible (SSIM(error, target) below
    the threshold: both), hidden-state (the error screen equals the target pixel for pixel, masks applied:
    R_TC only), subtle (it shows, but SSIM stays >= the threshold: R_TC only)."""
    if suffix_passes:
        return "visual-only"
    if sim < threshold:
        return "visible"
    return "hidden-state" if identical else "subtle"


def execute(env: Environment, action: Action) -> None:
    """One replayed action; a screen that never settled makes the run unusable as a recording."""
    settled = env.execute(action)
    if not settled.stable:
        raise Rejected("unsettled", f"{action.describe()}: the screen was still changing after "
                                    f"{settled.seconds:.1f} s")


def replay(env: Environment, task: Task, base_dir: Path, actions: Sequence[Action]) -> None:
    """Reset to the task's initial state and execute `actions`."""
    reset(env, task, base_dir)
    for action in actions:
        execute(env, action)


def verify_candidate(env: Environment, task: Task, base_dir: Path, prefix: Sequence[Action],
                     perturbation: Sequence[Action], suffix: Sequence[Action], *, runs: int,
                     threshold: float, intent: str | None = None, masks: Masks = None, tolerance: int = 0,
                     expect_target: np.ndarray | None = None,
                     probes: Sequence[AnyGetter] = (), unverifiable_ok: bool = False) -> Verified:
    """Replay the candidate `runs` times and return what it measurably is, or raise :class:`Rejected`.

    A harmless mistake (the remaining gt actions still succeed) is kept as visual-only only when the
    screen is visibly off and `intent` allows it (None: a hand-written case, judged on measurement alone).
    `unverifiable_ok`: an error screen equal to its target that no probe tells apart is returned (with no
    probes) instead of rejected, for a case that declares it is verified by its recorded determinism only.
    EnvError propagates: a crashed desktop is the caller's to count, never a verdict on the candidate."""
    masks = list(masks or [])
    targets, errors, verdicts = [], [], []
    at_target: list[list[str]] = []  # per run, each probe's value
    at_error: list[list[str]] = []
    timed: set[int] = set()  # probes whose target value changed with time alone
    for i in range(runs):
        replay(env, task, base_dir, prefix)
        targets.append(target := env.screenshot())
        if expect_target is not None and (px := differing_pixels(target, expect_target, masks)) > tolerance:
            raise Rejected("target not reproduced", f"run {i + 1}: the target screen differs from the recorded "
                                                    f"one by {px} px")
        at_target.append(settled_values(env, list(probes)) if probes else [])
        if i == 0 and probes:
            # a value an app rewrites on its own timer (mousepad's window state in GSettings' keyfile, seconds
            # after start) is a clock, not the state: read again later, and a probe that moved is no probe
            time.sleep(LATE_READ)
            late = [probe_value(env, g) for g in probes]
            timed = {j for j, (a, b) in enumerate(zip(at_target[0], late)) if a != b}
        for action in perturbation:
            execute(env, action)
        errors.append(env.screenshot())
        # given time to change only where they are needed: an error screen equal to the target's
        wait = 3.0 if differing_pixels(errors[-1], targets[-1], masks) == 0 else 0.0
        target = at_target[-1]
        at_error.append(poll(env, probes, lambda vs, t=target: any(map(str.__ne__, vs, t)), wait))
        for action in suffix:
            execute(env, action)
        verdicts.append(judge(task, env, base_dir).passed)
    worst = {name: max((differing_pixels(shots[0], s, masks) for s in shots[1:]), default=0)
             for name, shots in (("target", targets), ("error", errors))}
    for name, px in worst.items():
        if px > tolerance:
            raise Rejected("nondeterministic", f"the {name} screen differs across {runs} runs (up to {px} px)")
    if len(set(verdicts)) > 1:
        raise Rejected("nondeterministic", f"the remaining gt actions succeed on some of {runs} runs only: {verdicts}")
    passed = verdicts[0]
    sim = ssim(errors[0], targets[0], masks)
    identical = differing_pixels(errors[0], targets[0], masks) == 0
    if passed and sim >= threshold:
        raise Rejected("not an error", f"the remaining gt actions still succeed from the error state and its "
                                       f"screen matches the target (SSIM {sim:.4f} >= {threshold})")
    if passed and intent not in (None, "visual-only"):
        raise Rejected("not an error", f"the remaining gt actions still succeed from the error state (intended "
                                       f"{intent}; a harmless mistake is kept only if meant to be visual-only)")
    found = [Probe(get=g, target=at_target[0][j]) for j, g in enumerate(probes)
             if j not in timed and len({t[j] for t in at_target}) == 1
             and all(e[j] != at_target[0][j] for e in at_error)]
    if identical and not found and not unverifiable_ok:
        raise Rejected("unverifiable", "the error screen equals the target screen and no probe tells them apart "
                                       f"(tried: {', '.join(g.describe() for g in probes) or 'none'})")
    return Verified(targets[0], errors[0], passed, sim, measured_kind(passed, sim, threshold, identical),
                    identical, found, digest("\n".join(at_error[0]).encode()), runs, worst)

