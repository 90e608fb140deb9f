"""Record (and verify) a hand-written case's screenshots by replaying it on a real desktop.

The canonical target and error screenshots come from replays, not from the original rollout, and a
case is only written if it is transition-consistent (the full trajectory succeeds on every replay)
and passes the same candidate check as `retrace build` (:func:`.verify.verify_candidate`)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from pytest_retrace.dataset.share import share_duplicates
from pytest_retrace.dataset.verify import Rejected, Verified, replay, verify_candidate
from pytest_retrace.envs import Environment
from pytest_retrace.replay.casefiles import SHARED_DIR, outside_case
from pytest_retrace.replay.cases import RecoveryCase, load_case, load_png
from pytest_retrace.replay.judge import evaluated_files, judge
from pytest_retrace.replay.probes import narrowest, standard_getters


class RecordingError(Exception):
    """The case cannot be recorded as written: the message says which check failed."""


@dataclass
class Recording:
    case: RecoveryCase
    target: np.ndarray
    error: np.ndarray
    kind: str
    checks: list[str] = field(default_factory=list)
    verified_by: str = "screen"  # what confirms s_error on replay: screen, probes or determinism (cases.py)


def record_case(path: Path, env: Environment, replays: int = 3, tolerance: int = 0, threshold: float = 0.99,
                write: bool = True) -> Recording:
    case = load_case(path, check_screenshots=False)
    for i in range(replays):
        replay(env, case.task, case.dir, case.trajectory)
        ev = judge(case.task, env, case.dir)
        if not ev.passed:
            raise RecordingError(f"{path}: full trajectory failed the evaluator on replay {i + 1}: {ev.details}")
    checks = [f"full trajectory succeeds on {replays}/{replays} replays"]
    # a case may declare the kind its author meant; a harmless mistake then has to be meant as visual-only
    intent = case.metadata.get("intended_kind", case.metadata.get("kind"))
    declared = case.verified_by == "determinism"
    try:
        got = verify_candidate(env, case.task, case.dir, case.prefix, case.perturbation, case.suffix, runs=replays,
                               threshold=threshold, intent=intent, masks=case.masks, tolerance=tolerance,
                               probes=list(dict.fromkeys([*(p.get for p in case.probes),
                                                          *standard_getters(evaluated_files(case.task))])),
                               unverifiable_ok=declared)
    except Rejected as exc:
        hint = ("; if nothing the task exposes can see the error state (it lives only in a process's memory: a "
                "shell alias, an undo history), declare `verified_by: determinism` (docs/cases.md)"
                if exc.reason == "unverifiable" else "")
        raise RecordingError(f"{path}: {exc.reason}: {exc}{hint}") from None
    found = {p.get: p.target for p in got.probes}
    if declared:
        checks.append(_declaration_holds(path, got, replays))
    elif got.identical and not case.probes:
        # a hidden-state case must say how replay can tell its error state from the target: suggest a probe
        snippet = yaml.safe_dump({"probes": [q.model_dump(mode="json") for q in narrowest(got.probes)]},
                                 sort_keys=False, width=200)
        raise RecordingError(f"{path}: probes: the error screen equals the target screen, so the case needs a probe "
                          f"that replay can check after the perturbation; measured on {replays} replays, add:\n"
                          f"{snippet}")
    for i, probe in enumerate(case.probes):
        if probe.get not in found:
            raise RecordingError(f"{path}: probes[{i}]: {probe.describe()} does not tell s_error from s_target on "
                              f"every replay")
        if found[probe.get] != probe.target:
            raise RecordingError(f"{path}: probes[{i}].target: measured {found[probe.get]} at s_target, the case "
                              f"says {probe.target}")
        checks.append(f"probe {probe.describe()}: its target value, and another one after the perturbation")
    checks += [f"{name} screen reproducible ({px} px differ at most over {replays} replays)"
               for name, px in got.worst_px.items()]
    checks.append(f"the error is real: the remaining gt actions {'succeed' if got.suffix_passes else 'fail'} "
                  f"from it; SSIM(error, target) = {got.ssim:.4f}; measured kind {got.kind}")
    if intent is not None and intent != got.kind:
        checks.append(f"note: metadata says {intent!r}, measured {got.kind!r}")
    if write:
        write_screenshots(case, got.target, got.error)
    return Recording(case, got.target, got.error, got.kind, checks, case.error_state_verified_by)


def _declaration_holds(path: Path, got: Verified, replays: int) -> str:
    """The check line for a case declaring `verified_by: determinism`, or RecordingError when the declaration is
    not needed: a differing screen or a probe verifies the error state on every replay, and a declaration that
    drops that check would only weaken the case."""
    if not got.identical:
        raise RecordingError(f"{path}: verified_by: the error screen differs from the target screen, so replay's "
                          "pixel check verifies the error state: drop `verified_by: determinism`")
    if got.probes:
        snippet = yaml.safe_dump({"probes": [q.model_dump(mode="json") for q in narrowest(got.probes)]},
                                 sort_keys=False, width=200)
        raise RecordingError(f"{path}: verified_by: {got.probes[0].describe()} tells s_error from s_target on every "
                          f"one of {replays} replays, so replay can check it: drop `verified_by: determinism` "
                          f"and add:\n{snippet}")
    return (f"error state verified by determinism only (declared): no probe tells s_error from s_target, and the "
            f"remaining gt actions failed from it on {replays}/{replays} replays; replay checks its pixels only")


def write_screenshots(case: RecoveryCase, target: np.ndarray, error: np.ndarray) -> None:
    """Write a recorded case's two screenshots, in the suite's new form: in a suite that keeps a shared folder
    (cases/shared/), a screenshot that another case (or this one's other) has too is then kept once
    (dataset.share). Elsewhere nothing else changes: recording a lone case never edits the files beside it."""
    for name, rel, arr in (("screenshots.target", case.screenshots.target, target),
                           ("screenshots.error", case.screenshots.error, error)):
        _write_png(case, name, rel, arr)
    suite = case.dir.parent
    if (suite / SHARED_DIR).is_dir():
        share_duplicates(suite, log=lambda _: None)


def _write_png(case: RecoveryCase, field: str, rel: str, arr: np.ndarray) -> None:
    """Write a screenshot inside the case's directory and nowhere else.

    Loading checked the path, but the replays take minutes: check again right before creating its
    directory and before writing (a directory on the way may have become a symlink meanwhile). The PNG
    is written to a temporary file that then replaces the target: a rename replaces a symlink itself
    instead of writing through it, and a failed write leaves no half-written screenshot."""
    from PIL import Image

    def check_inside() -> None:
        if problem := outside_case(case.dir, rel, shared=False):
            raise RecordingError(f"{case.path}: {field}: {problem}")

    png = case.dir / rel
    if rel.startswith(f"../{SHARED_DIR}/"):
        # other cases use this file: it may not change under them
        if png.is_file() and np.array_equal(load_png(png), arr):
            return
        raise RecordingError(f"{case.path}: {field}: {rel} is shared with other cases and the recorded screen "
                          f"differs from it: point the field at a file of the case's own (such as "
                          f"{case.id}/{field.rsplit('.', 1)[1]}.png) and record again")
    check_inside()
    png.parent.mkdir(parents=True, exist_ok=True)
    check_inside()  # and still, with the directories just made
    fd, tmp = tempfile.mkstemp(dir=png.parent, prefix=".record-", suffix=".png")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the committed screenshot private
        with os.fdopen(fd, "wb") as fh:
            Image.fromarray(arr).save(fh, format="PNG", optimize=True)
        os.replace(tmp, png)
    except BaseException:
        os.unlink(tmp)
        raise
