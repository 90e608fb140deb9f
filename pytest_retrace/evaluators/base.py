"""Types shared by every evaluator module: the environment protocol, results, errors, registries.

Kept free of metric logic so plugins can ``from pytest_retrace.evaluators import register_metric``
without pulling in spreadsheet readers or the engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from pytest_retrace.envs import CommandResult


@runtime_checkable
class EvalEnv(Protocol):
    """What an environment offers to evaluators.

    Paths may start with ``~``; the environment expands it to the desktop user's home.
    Any exception raised by these methods is treated as an infrastructure failure and propagates
    out of :func:`evaluate` unchanged. An environment that considers a command timeout an outcome of
    the agent (not a broken sandbox) should return a ``CommandResult`` (e.g. returncode 124) instead.
    """

    def read_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        ...

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """Run ``command`` through a shell inside the environment."""
        ...


class EvaluatorError(ValueError):
    """A malformed evaluator spec. The message starts with the field path, e.g. ``evaluator.func[1]``.

    Metrics and getters raise it (without the path; the engine adds it) for problems of the case
    itself, such as an ``expected`` value of the wrong shape; those propagate instead of scoring 0.
    """


class CheckFailed(Exception):
    """Raised by a metric (or a helper deep inside one) to fail the check with ``str(exc)`` as reason.

    For outcomes of the agent's work such as a missing file, where a full traceback name would be noise.
    """


@dataclass(frozen=True)
class Evaluation:
    """Verdict of one evaluator block: ``passed`` iff ``score >= 1.0``."""

    score: float
    passed: bool
    details: list[str] = field(default_factory=list)


class Score(float):
    """A metric score that also explains itself.

    It *is* a float, so metrics keep the ``-> float`` contract and plain floats/bools remain valid
    return values; the engine only reads ``reason`` when it is there.
    """

    reason: str

    def __new__(cls, value: float, reason: str = "") -> Self:
        self = super().__new__(cls, value)
        self.reason = reason
        return self

    @classmethod
    def ok(cls, reason: str = "ok") -> Score:
        return cls(1.0, reason)

    @classmethod
    def fail(cls, reason: str) -> Score:
        return cls(0.0, reason)

    @classmethod
    def of(cls, success: bool, reason: str) -> Score:
        return cls(1.0 if success else 0.0, reason)


@dataclass(frozen=True)
class GetterContext:
    """What a getter may use besides its own config block."""

    env: EvalEnv
    case_dir: Path | None = None


# A getter turns its config block ({type: ..., path: ...}) into a value; a metric scores
# (result, expected, **options) in [0, 1].
Getter = Callable[[Mapping[str, Any], GetterContext], Any]
Metric = Callable[..., float]

METRICS: dict[str, Metric] = {}
GETTERS: dict[str, Getter] = {}


class NotLiteral:
    """Marker for an ``expected`` value only known at evaluation time (not a ``rule`` literal)."""

    def __repr__(self) -> str:
        return "NOT_LITERAL"


NOT_LITERAL = NotLiteral()


@dataclass(frozen=True)
class CheckSpec:
    """What a metric's load-time ``check`` hook sees (nothing from the environment)."""

    expected: Any  # the `rule` literal, None when absent, or NOT_LITERAL
    options: Mapping[str, Any]  # without the engine-level `negate`
    result: Mapping[str, Any]  # the result getter's config block


MetricCheck = Callable[[CheckSpec], None]


@dataclass(frozen=True)
class GetterFields:
    """Fields a getter accepts besides ``type``: name -> accepted type(s).

    ``optional=None`` means "anything else goes" (the default for plugin getters that don't declare).
    """

    required: Mapping[str, type | tuple[type, ...]]
    optional: Mapping[str, type | tuple[type, ...]] | None


# Metadata kept beside the public registries so that a plugin may also just assign
# METRICS[name] = func / GETTERS[name] = func and get permissive defaults.
METRIC_CHECKS: dict[str, MetricCheck] = {}
GETTER_FIELDS: dict[str, GetterFields] = {}

F = TypeVar("F", bound=Callable[..., Any])


def register_metric(name: str, *, check: MetricCheck | None = None) -> Callable[[F], F]:
    """Register ``func(result, expected, **options) -> float`` under ``name``.

    Options the metric accepts are its keyword parameters (validated at load time from the
    signature). Declaring a keyword parameter ``_path`` makes the engine pass the result getter's
    ``path`` field (or None). ``check`` validates literal ``expected`` values/options at load time;
    it raises ``EvaluatorError`` with a message relative to the check (the engine adds the path).
    """

    def decorate(func: F) -> F:
        METRICS[name] = func
        if check is not None:
            METRIC_CHECKS[name] = check
        else:
            METRIC_CHECKS.pop(name, None)
        return func

    return decorate


def register_getter(
    name: str,
    *,
    required: Mapping[str, type | tuple[type, ...]] | None = None,
    optional: Mapping[str, type | tuple[type, ...]] | None = None,
) -> Callable[[F], F]:
    """Register ``getter(config, ctx) -> value`` under ``name`` (the ``type`` of a getter block).

    ``required``/``optional`` map field names to accepted types. Passing ``optional`` (even ``{}``)
    makes the getter strict: any other field is rejected at load time (catches typos like ``paht``).
    """

    def decorate(func: F) -> F:
        GETTERS[name] = func
        GETTER_FIELDS[name] = GetterFields(dict(required or {}), None if optional is None else dict(optional))
        return func

    return decorate


def metric_options(func: Metric) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword options a metric accepts (private ``_``-names excluded) and whether it takes **kwargs."""
    params = list(inspect.signature(func).parameters.values())[2:]  # skip (result, expected)
    named = {
        p.name: p
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and not p.name.startswith("_")
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def metric_wants_path(func: Metric) -> bool:
    return "_path" in inspect.signature(func).parameters
