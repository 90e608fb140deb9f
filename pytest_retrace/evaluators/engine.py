"""Run a validated evaluator plan against an environment.

Failure policy, because a verdict must mean something:
- a getter or metric raising (undecodable file, corrupt xlsx, invalid JSON) scores that check 0 and
  records why: a broken file produced by the agent is a task failure;
- an exception raised by the environment itself (``EvalEnv.read_file`` / ``run``) propagates unchanged:
  that is broken infrastructure, and the caller must not count it against the agent;
- ``EvaluatorError`` (the case's evaluator is wrong, e.g. a ``local_file`` missing from the case) propagates;
- ``FileRefused`` (the env would not read a file the agent turned into a FIFO, a device link, a link out of
  its home, or something huge) fails the whole evaluation, whatever ``not`` and ``or`` around the check say:
  a check that could not look at the file has not seen it absent either.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_retrace.envs import FileRefused
from pytest_retrace.envs.setup import IDLE_SHARE
from pytest_retrace.evaluators.base import (
    GETTERS,
    METRICS,
    CheckFailed,
    CommandResult,
    EvalEnv,
    Evaluation,
    EvaluatorError,
    GetterContext,
    Score,
    metric_wants_path,
)
from pytest_retrace.evaluators.plan import Check, Group, compile_block
from pytest_retrace.evaluators.values import short
from pytest_retrace.text import clip


def validate_evaluator(spec: dict[str, Any], where: str = "evaluator") -> None:
    """Raise EvaluatorError (message starting with the field path) if ``spec`` is malformed.

    Checks metric and getter names, getter fields, per-func list lengths, ``conj``, options against
    each metric's signature, and ``rule`` literals against what the metric accepts. No env access.
    """
    compile_block(spec, where)


# How long a failing evaluation is repeated at most: an app may write the file an evaluator reads after its screen
# settled (measured: LibreOffice's xlsx export ran past the settle window at -n 16, with nothing new on screen
# meanwhile, and the oracle's R_TC read the old file), and a verdict taken before the write measures the app's
# timing, not the agent's work.
LATE_WRITES = 5.0
# A failure is final before LATE_WRITES once the task's processes were idle (IDLE_SHARE of a CPU, as a settle step
# means it) for this long and everything the evaluator read (files, command output) was the same on both sides of
# that window: no write is under way then. Waiting the whole cap for that made a failing evaluation cost 5 s.
EVAL_QUIET = 1.0


def evaluate(spec: dict[str, Any], env: EvalEnv, case_dir: Path | None = None, *, wait: float = 0.0,
             interval: float = 0.5, quiet: float = EVAL_QUIET) -> Evaluation:
    """Score ``spec`` against the live environment; ``case_dir`` resolves ``local_file`` getters.

    ``wait``: while the evaluation fails, repeat it for up to this long (a pass is final; a failure at the cap is
    the verdict). A failure is final sooner when the task was idle for ``quiet`` seconds and what the evaluator
    read did not change across them; an environment that cannot tell the task's CPU time (no
    ``task_cpu_seconds``, or it returns None) or a getter using more of the env than ``read_file``/``run`` repeats
    every ``interval`` seconds until the cap."""
    plan = compile_block(spec, "evaluator")  # validate fully before touching the env, and once
    start = time.monotonic()
    deadline = start + wait
    evaluation, seen = _evaluate_once(plan, env, case_dir)
    rounds = 1
    while not evaluation.passed and time.monotonic() < deadline:
        idle = _quiet_window(env, quiet, interval, deadline)
        again, read = _evaluate_once(plan, env, case_dir)
        rounds += 1
        if again.passed:
            return _noted(again, f"passed on evaluation {rounds}, {time.monotonic() - start:.1f} s after the first "
                                 "(which failed) began")
        final = idle and seen is not None and read == seen
        evaluation, seen = again, read
        if final:
            return _noted(evaluation, f"final after {rounds} evaluations: the task idle for {quiet:g} s and "
                                      "everything read unchanged")
    return evaluation if rounds == 1 else _noted(evaluation, f"final after {rounds} evaluations: still failing at "
                                                             f"the {wait:g} s cap")


def _quiet_window(env: EvalEnv, quiet: float, interval: float, deadline: float) -> bool:
    """Sleep one window before the next evaluation; True if the task's processes were idle over a full ``quiet``
    window, False if they were busy, the cap cut the window short, or the environment cannot tell."""
    sample = getattr(env, "task_cpu_seconds", None)
    before = sample() if callable(sample) else None
    if before is None:
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
        return False
    began = time.monotonic()
    window = min(quiet, deadline - began)
    time.sleep(max(0.0, window))
    used, elapsed = (sample() or 0.0) - before, time.monotonic() - began
    return window >= quiet and used <= IDLE_SHARE * elapsed


def _noted(evaluation: Evaluation, note: str) -> Evaluation:
    return Evaluation(evaluation.score, evaluation.passed, [*evaluation.details, note])


def _evaluate_once(plan: Group, env: EvalEnv, case_dir: Path | None) -> tuple[Evaluation, tuple[str, ...] | None]:
    """The evaluation, and a digest of everything it read in order (None when a getter used an env feature
    beyond read_file/run, whose result this cannot see)."""
    guarded = _GuardedEnv(env)
    details: list[str] = []
    score = _run_group(plan, GetterContext(guarded, case_dir), guarded, details)
    if guarded.refused:
        score = 0.0
        details.append(f"failed: {len(guarded.refused)} file(s) the evaluator refused to read")
    seen = None if guarded.opaque else tuple(guarded.reads)
    return Evaluation(score=score, passed=score >= 1.0, details=details), seen


class _GuardedEnv:
    """Delegates to the real env and remembers the exceptions it raised, so the engine can tell
    infrastructure failures (propagate) from failures of the agent's artefacts (score 0)."""

    def __init__(self, env: EvalEnv) -> None:
        self._env = env
        self._raised: list[BaseException] = []
        self.refused: list[str] = []  # files the env would not read (FileRefused): they fail the evaluation
        # what each read returned (a digest, so a repeated evaluation can tell whether anything changed), and
        # whether a getter reached past read_file/run, where the digest would miss what it saw
        self.reads: list[str] = []
        self.opaque = False

    def read_file(self, path: str) -> bytes | None:
        data = self._call(self._env.read_file, path)
        self.reads.append(f"file {path}: " + ("absent" if data is None else hashlib.sha256(data).hexdigest()))
        return data

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        res = self._call(self._env.run, command, timeout=timeout)
        output = f"{res.returncode}\0{res.stdout}\0{res.stderr}".encode(errors="replace")
        self.reads.append(f"run {command}: " + hashlib.sha256(output).hexdigest())
        return res

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except FileRefused as exc:
            self.reads.append(f"refused {args[0] if args else ''}: {exc}")
            raise  # the agent's artefact, not the environment failing
        except Exception as exc:
            self._raised.append(exc)
            raise

    def env_failure(self, exc: BaseException) -> BaseException | None:
        """The env exception behind ``exc`` (itself, or in its cause/context chain), if any."""
        seen: set[int] = set()
        node: BaseException | None = exc
        while node is not None and id(node) not in seen:
            if any(node is raised for raised in self._raised):
                return node
            seen.add(id(node))
            node = node.__cause__ or node.__context__
        return None

    def __getattr__(self, name: str) -> Any:  # extra env features plugin getters may use
        self.opaque = True
        return getattr(self._env, name)


def _run_group(group: Group, ctx: GetterContext, guarded: _GuardedEnv, details: list[str]) -> float:
    # Every check runs even after an `and` fails: the details of a failed task should be complete.
    scores = [
        _run_group(item, ctx, guarded, details)
        if isinstance(item, Group)
        else _run_check(item, ctx, guarded, details)
        for item in group.items
    ]
    combined = min(scores) if group.conj == "and" else max(scores)
    if not group.negate:
        return combined
    details.append(f"not ({group.where}, {group.conj}): {combined:g} -> {1.0 - combined:g}")
    return 1.0 - combined


def _run_check(check: Check, ctx: GetterContext, guarded: _GuardedEnv, details: list[str]) -> float:
    label = f"{check.metric}({_label(check.result)})"
    try:
        result = _fetch(check.result, check.result_where, ctx)
        expected = None if check.expected is None else _fetch(check.expected, check.expected_where, ctx)
        raw = _call_metric(check, result, expected)
    except EvaluatorError:
        raise
    except CheckFailed as exc:
        raw = Score.fail(str(exc))
    except FileRefused as exc:
        guarded.refused.append(str(exc))
        details.append(f"{label}: refused to read: {exc}")
        return 0.0
    except Exception as exc:  # noqa: BLE001 - any failure on the agent's artefact scores 0
        if (infra := guarded.env_failure(exc)) is not None:
            raise infra
        raw = Score.fail(f"error: {type(exc).__name__}: {exc}")
    score, reason = _coerce(raw, check.metric)
    if check.negate:
        score = 1.0 - score
        label, reason = f"not {label}", f"{reason} (negated: {'pass' if score >= 1.0 else 'fail'})"
    details.append(f"{label}: {reason}")
    return score


def _call_metric(check: Check, result: Any, expected: Any) -> Any:
    metric = METRICS[check.metric]
    kwargs = dict(check.options)
    if metric_wants_path(metric):
        path = check.result.get("path")
        kwargs["_path"] = path if isinstance(path, str) else None
    try:
        return metric(result, expected, **kwargs)
    except EvaluatorError as exc:
        raise EvaluatorError(f"{check.where} ({check.metric}): {exc}") from exc


def _fetch(block: Mapping[str, Any], where: str, ctx: GetterContext) -> Any:
    try:
        return GETTERS[block["type"]](block, ctx)
    except EvaluatorError as exc:
        raise EvaluatorError(f"{where}: {exc}") from exc


def _coerce(raw: Any, metric: str) -> tuple[float, str]:
    """A metric's return value as (score in [0, 1], reason)."""
    if isinstance(raw, bool):
        return (1.0, "ok") if raw else (0.0, "failed")
    if not isinstance(raw, (int, float)):
        # A metric returning e.g. None is a bug in the metric, not an outcome of the task.
        raise TypeError(f"metric {metric!r} returned {short(raw)}, not a number")
    score = 0.0 if math.isnan(raw) else min(1.0, max(0.0, float(raw)))
    reason = raw.reason if isinstance(raw, Score) else ("ok" if score >= 1.0 else f"score {score:g}")
    if 0.0 < score < 1.0 and isinstance(raw, Score):
        reason = f"{reason} (score {score:g})"
    return score, reason


def _label(result: Mapping[str, Any]) -> str:
    """What a detail line names: the path or command checked, else the getter type."""
    for field in ("path", "command"):
        if isinstance(result.get(field), str):
            return clip(result[field], 40)
    return str(result.get("type"))
