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

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..envs import FileRefused
from .base import (
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
from .plan import Check, Group, compile_block
from .values import short


def validate_evaluator(spec: dict[str, Any], where: str = "evaluator") -> None:
    """Raise EvaluatorError (message starting with the field path) if ``spec`` is malformed.

    Checks metric and getter names, getter fields, per-func list lengths, ``conj``, options against
    each metric's signature, and ``rule`` literals against what the metric accepts. No env access.
    """
    compile_block(spec, where)


# How long a failing evaluation is repeated: an app may write the file an evaluator reads after its screen
# settled (measured: LibreOffice's xlsx export ran past the settle window at -n 16, with nothing new on screen
# meanwhile, and the oracle's R_TC read the old file), and a verdict taken before the write measures the app's
# timing, not the agent's work.
LATE_WRITES = 5.0


def evaluate(spec: dict[str, Any], env: EvalEnv, case_dir: Path | None = None, *, wait: float = 0.0,
             interval: float = 0.5) -> Evaluation:
    """Score ``spec`` against the live environment; ``case_dir`` resolves ``local_file`` getters.

    ``wait``: while the evaluation fails, repeat it every ``interval`` seconds for up to this long (a pass is
    final; a failure after the wait is the verdict)."""
    plan = compile_block(spec, "evaluator")  # validate fully before touching the env, and once
    deadline = time.monotonic() + wait
    while True:
        evaluation = _evaluate_once(plan, env, case_dir)
        if evaluation.passed or time.monotonic() >= deadline:
            return evaluation
        time.sleep(interval)


def _evaluate_once(plan: Group, env: EvalEnv, case_dir: Path | None) -> Evaluation:
    guarded = _GuardedEnv(env)
    details: list[str] = []
    score = _run_group(plan, GetterContext(guarded, case_dir), guarded, details)
    if guarded.refused:
        score = 0.0
        details.append(f"failed: {len(guarded.refused)} file(s) the evaluator refused to read")
    return Evaluation(score=score, passed=score >= 1.0, details=details)


class _GuardedEnv:
    """Delegates to the real env and remembers the exceptions it raised, so the engine can tell
    infrastructure failures (propagate) from failures of the agent's artefacts (score 0)."""

    def __init__(self, env: EvalEnv) -> None:
        self._env = env
        self._raised: list[BaseException] = []
        self.refused: list[str] = []  # files the env would not read (FileRefused): they fail the evaluation

    def read_file(self, path: str) -> bytes | None:
        return self._call(self._env.read_file, path)

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        return self._call(self._env.run, command, timeout=timeout)

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except FileRefused:
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
            text = result[field]
            return text if len(text) <= 40 else text[:39] + "…"
    return str(result.get("type"))
