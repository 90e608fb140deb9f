"""The run plan of the ideal-recovery experiment (paper §4, appendix B.1): for every forward episode that failed,
its first wrong step E (the error detector, asked once) and the steps to return to under each condition, fixed
once and kept in a file so that every rerun and resume of the experiment uses the same annotations.

Conditions (the paper's): ``reset`` R = 0; ``E-1``; ``E-random``, a past step drawn uniformly from 0..E-1 with a
generator seeded by the plan's seed and the episode (the same step in every run, on every machine); ``R_LLM``, the
recovery-step detector's answer. An episode the error detector finds no error in, or answers invalidly about, is
excluded with its reason, and counted; an invalid recovery-step answer leaves only ``R_LLM`` out.

``retrace plan TRAJECTORIES --error-detector NAME --recovery-detector NAME`` writes it (plan.json beside the
trajectories); run again, it annotates only the episodes the file does not have yet.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_retrace.experiments.detectors import ErrorDetector, RecoveryStepDetector
from pytest_retrace.experiments.trajectory import Episode, episodes_in, read_episode

SCHEMA_VERSION = 1
CONDITIONS = ("reset", "E-1", "E-random", "R_LLM")


class PlanError(ValueError):
    """A plan file this version cannot use; the message names the file and field."""


class Annotated(BaseModel):
    """One failed episode, annotated: E, the detectors' decisions (Decision.to_dict) and R per condition."""

    model_config = ConfigDict(extra="forbid")

    episode: str  # its directory, relative to the trajectories root
    task: str
    model: str  # the forward agent's directory name (OSWorld's layout: <model>[-run<k>])
    steps: int
    error_step: int
    error_decision: dict[str, Any]
    recovery_decision: dict[str, Any]
    recovery_steps: dict[str, int | None]  # condition -> R (None: R_LLM's answer was invalid)


class Excluded(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episode: str
    reason: str
    error_decision: dict[str, Any] | None = None


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    trajectories: str
    error_detector: str
    recovery_detector: str
    seed: int
    annotated: list[Annotated] = Field(default_factory=list)
    excluded: list[Excluded] = Field(default_factory=list)
    solved: int = 0  # episodes that needed no annotation: the agent solved the task

    def root(self, path: Path) -> Path:
        """The trajectories directory of the plan read from ``path`` (a relative one is the plan file's)."""
        return Path(self.trajectories) if Path(self.trajectories).is_absolute() else path.parent / self.trajectories

    def known(self) -> set[str]:
        return {a.episode for a in self.annotated} | {e.episode for e in self.excluded}

    @classmethod
    def read(cls, path: Path) -> Plan:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PlanError(f"{path}: {exc}") from None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise PlanError(f"{path}: plan schema_version {version!r}: this version reads {SCHEMA_VERSION} only")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise PlanError(f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # a plan exists only whole


def random_step(seed: int, episode: str, error_step: int) -> int:
    """E-random: a past step in 0..E-1, the same for this seed and episode everywhere (str seeds hash by SHA-512)."""
    return random.Random(f"{seed}:{episode}").randrange(error_step)


def make_plan(root: Path, errors: ErrorDetector, recoveries: RecoveryStepDetector, *, seed: int = 0,
              previous: Plan | None = None, save: Path | None = None) -> Plan:
    """Annotate every failed episode below ``root`` that ``previous`` does not hold yet (its annotations are kept
    as they are, whatever the detectors would say now). With ``save``, the plan is written after each episode,
    so an interrupted annotation resumes where it stopped."""
    if previous is not None and (previous.error_detector, previous.recovery_detector, previous.seed) != (
            errors.name, recoveries.name, seed):
        raise PlanError(f"the plan was made with error detector {previous.error_detector}, recovery detector "
                        f"{previous.recovery_detector} and seed {previous.seed}: continue it with the same ones, "
                        f"or write a new plan (--out)")
    # relative to the plan file where there is one: the run directory may move
    where = os.path.relpath(root.absolute(), save.absolute().parent) if save is not None else str(root)
    plan = previous or Plan(trajectories=where, error_detector=errors.name, recovery_detector=recoveries.name,
                            seed=seed)
    plan.solved = 0
    known = plan.known()  # annotated or excluded before: never read again (their screenshots are the cost)
    for path in episodes_in(root):
        rel = str(path.relative_to(root))
        if rel in known:
            continue
        episode = read_episode(path)
        if isinstance(episode, str):
            plan.excluded.append(Excluded(episode=rel, reason=episode))
            continue
        if episode.solved:
            plan.solved += 1
            continue
        item = _annotate(plan, rel, episode, errors, recoveries)
        (plan.annotated if isinstance(item, Annotated) else plan.excluded).append(item)  # type: ignore[arg-type]
        if save is not None:
            plan.write(save)
    if save is not None:
        plan.write(save)
    return plan


def _annotate(plan: Plan, rel: str, episode: Episode, errors: ErrorDetector,
              recoveries: RecoveryStepDetector) -> Annotated | Excluded:
    instruction, history = episode.task.instruction, episode.history
    if not history:
        return Excluded(episode=rel, reason="the agent took no action: no step to return to")
    found = errors.first_error(instruction, history, episode.final)
    if not found.valid:
        return Excluded(episode=rel, reason="the error detector's reply named no valid step",
                        error_decision=found.to_dict())
    if found.step is None:
        return Excluded(episode=rel, reason="the error detector found no wrong step", error_decision=found.to_dict())
    e = found.step
    back = recoveries.recovery_step(instruction, history, e)
    steps = {"reset": 0, "E-1": e - 1, "E-random": random_step(plan.seed, rel, e),
             "R_LLM": back.step if back.valid else None}
    return Annotated(episode=rel, task=episode.task.id, model=Path(rel).parts[-3] if len(Path(rel).parts) >= 3 else "",
                     steps=len(history), error_step=e, error_decision=found.to_dict(),
                     recovery_decision=back.to_dict(), recovery_steps=steps)
