"""Verifying a candidate case on a real desktop: the one check that both `retrace build` (stage 4)
and `retrace record` (hand-written cases) trust, so the two can never disagree on what a case is.

A candidate (prefix a_0..a_{t_seed-1}, perturbation, suffix a_{t_seed}..a_T) is replayed `runs` times
from reset. It becomes a case only if
- every run reaches the same target and error screens and the same evaluator verdict (reproducible),
- the target is the one recorded earlier, when there is one (the pipeline's canonical screenshot),
- the error is real: the remaining gt actions fail from it, or (visual-only) they still succeed but
  the screen is visibly off (SSIM below R_O's threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..actions import Action
from ..cases import Task
from ..envs import Environment
from ..evaluators import evaluate
from ..similarity import differing_pixels, ssim

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
    runs: int
    worst_px: dict[str, int]  # most pixels by which a run's target / error screen differed from the first run's


def measured_kind(suffix_passes: bool, sim: float, intent: str | None, threshold: float,
                  identical: bool = False) -> str:
    """Which half of the oracle R = R_TC ∧ R_O catches the error, measured, not assumed:
    visible (both), subtle (on screen, but SSIM >= threshold: R_TC only), hidden-state (off screen: R_TC
    only), visual-only (the remaining gt actions still succeed: R_O only). A mistake of unknown intent (the
    perturbation agent's) is hidden-state only when its screen equals the target pixel for pixel."""
    if suffix_passes:
        return "visual-only"
    if sim < threshold:
        return "visible"
    return "hidden-state" if intent == "hidden-state" or identical else "subtle"


def replay(env: Environment, task: Task, base_dir: Path, actions: Sequence[Action]) -> None:
    """Reset to the task's initial state and execute `actions`."""
    env.reset(task, base_dir)
    for action in actions:
        env.execute(action)


def verify_candidate(env: Environment, task: Task, base_dir: Path, prefix: Sequence[Action],
                     perturbation: Sequence[Action], suffix: Sequence[Action], *, runs: int,
                     threshold: float, intent: str | None = None, masks: Masks = None, tolerance: int = 0,
                     expect_target: np.ndarray | None = None) -> Verified:
    """Replay the candidate `runs` times and return what it measurably is, or raise :class:`Rejected`.

    A harmless mistake (the remaining gt actions still succeed) is kept as visual-only only when the
    screen is visibly off and `intent` allows it (None: a hand-written case, judged on measurement alone).
    EnvError propagates: a crashed desktop is the caller's to count, never a verdict on the candidate."""
    masks = list(masks or [])
    targets, errors, verdicts = [], [], []
    for i in range(runs):
        replay(env, task, base_dir, prefix)
        targets.append(target := env.screenshot())
        if expect_target is not None and (px := differing_pixels(target, expect_target, masks)) > tolerance:
            raise Rejected("target not reproduced", f"run {i + 1}: the target screen differs from the recorded "
                                                    f"one by {px} px")
        for action in perturbation:
            env.execute(action)
        errors.append(env.screenshot())
        for action in suffix:
            env.execute(action)
        verdicts.append(evaluate(task.evaluator, env, base_dir).passed)
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
    return Verified(targets[0], errors[0], passed, sim, measured_kind(passed, sim, intent, threshold, identical),
                    identical, runs, worst)
