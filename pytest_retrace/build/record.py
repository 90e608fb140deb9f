"""Record (and verify) a case's screenshots by replaying it on a real desktop.

The canonical target and error screenshots come from replays, not from the original rollout, and a
case is only written if it is transition-consistent: the full trajectory succeeds on every replay, the
target and error screens are identical across replays, and the error is real (the remaining gt
actions fail from the error state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..cases import RecoveryCase, load_case
from ..envs import Environment
from ..evaluators import evaluate
from ..oracle import differing_pixels, ssim


class RecordError(Exception):
    """The case cannot be recorded as written: the message says which check failed."""


@dataclass
class Recording:
    case: RecoveryCase
    target: np.ndarray
    error: np.ndarray
    checks: list[str] = field(default_factory=list)


def _replay(env: Environment, case: RecoveryCase, actions: list) -> None:
    env.reset(case.task, case.dir)
    for action in actions:
        env.execute(action)


def record_case(path: Path, env: Environment, replays: int = 3, tolerance: int = 0,
                write: bool = True) -> Recording:
    from PIL import Image

    case = load_case(path, check_screenshots=False)
    checks: list[str] = []
    for i in range(replays):
        _replay(env, case, case.trajectory)
        ev = evaluate(case.task.evaluator, env, case.dir)
        if not ev.passed:
            raise RecordError(f"{path}: full trajectory failed the evaluator on replay {i + 1}: {ev.details}")
    checks.append(f"full trajectory succeeds on {replays}/{replays} replays")
    targets, errors = [], []
    for i in range(replays):
        _replay(env, case, case.prefix)
        targets.append(env.screenshot())
        for action in case.perturbation:
            env.execute(action)
        errors.append(env.screenshot())
        for action in case.suffix:
            env.execute(action)
        ev = evaluate(case.task.evaluator, env, case.dir)
        if ev.passed:
            raise RecordError(f"{path}: the perturbation is not an error: the remaining gt actions still succeed "
                              f"from the error state (replay {i + 1})")
    checks.append("remaining gt actions fail from the error state on every replay")
    for name, shots in (("target", targets), ("error", errors)):
        worst = max((differing_pixels(shots[0], s, case.masks) for s in shots[1:]), default=0)
        if worst > tolerance:
            raise RecordError(f"{path}: {name} screenshots differ across replays (up to {worst} px)")
        checks.append(f"{name} screen reproducible ({worst} px differ at most over {replays} replays)")
    sim = ssim(targets[0], errors[0], case.masks)
    checks.append(f"SSIM(target, error) = {sim:.4f}, {differing_pixels(targets[0], errors[0], case.masks)} px differ")
    if write:
        for png, arr in ((case.target_png, targets[0]), (case.error_png, errors[0])):
            png.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(png, optimize=True)
    return Recording(case, targets[0], errors[0], checks)
