"""Evaluators Φ: decide whether a task was completed by checking real environment state.

Modelled on OSWorld's evaluator blocks. A block in a case YAML::

    evaluator:
      func: compare_text_file                      # or a list of funcs
      result: {type: vm_file, path: ~/notes.txt}   # getter for the actual value (list when func is)
      expected: {type: rule, rules: {text: "Hello world\\n"}}   # optional (list when func is)
      options: {strip: true}                       # optional (list when func is)
      conj: and                                    # and (min score) | or (max score); default and

or, for composition, ``{conj: or, checks: [<block>, ...], negate: false}``. Any check can be inverted
with ``options: {negate: true}`` (score -> 1 - score), any block with ``negate: true``.

Getters (``result`` / ``expected``): ``vm_file`` {path} -> bytes | None; ``vm_file_exists`` {path} -> bool;
``vm_command_line`` {command, timeout?} -> stdout only (also on a non-zero exit); ``vm_command_result``
{command, timeout?} -> CommandResult; ``rule`` {rules} -> the literal; ``local_file`` {path} -> bytes of a
file relative to the case directory; ``none`` (or no ``expected``) -> None.

Metrics: ``exact_match``, ``file_exists``, ``compare_text_file``, ``match_regex``, ``contains_text``,
``check_json_key``, ``check_ini_key``, ``compare_cells`` (alias ``compare_cell``; csv/tsv/xlsx/gnumeric,
format from ``options.format`` or the result path's extension), ``command_succeeds``.

Scores: ``and`` = min, ``or`` = max; passed iff score >= 1. A getter/metric raising on the agent's
artefact (corrupt file, bad encoding) scores that check 0 with the reason in ``details``; exceptions
from the environment itself propagate; ``EvaluatorError`` means the spec is wrong (load time if
possible, via :func:`validate_evaluator`).

Metrics are ``func(result, expected, **options) -> float`` (a :class:`Score` carries a reason);
getters ``getter(config, ctx) -> value``. Plugins add more with ``@register_metric(name)`` /
``@register_getter(name)``.
"""

from __future__ import annotations

from pytest_retrace.evaluators import config_files, getters, metrics, sheets  # noqa: F401 - importing registers the built-ins
from pytest_retrace.evaluators.base import (
    GETTERS,
    METRICS,
    NOT_LITERAL,
    CheckFailed,
    CheckSpec,
    CommandResult,
    EvalEnv,
    Evaluation,
    EvaluatorError,
    GetterContext,
    Score,
    register_getter,
    register_metric,
)
from pytest_retrace.evaluators.engine import LATE_WRITES, evaluate, validate_evaluator

__all__ = [
    "GETTERS",
    "LATE_WRITES",
    "METRICS",
    "NOT_LITERAL",
    "CheckFailed",
    "CheckSpec",
    "CommandResult",
    "EvalEnv",
    "Evaluation",
    "EvaluatorError",
    "GetterContext",
    "Score",
    "evaluate",
    "register_getter",
    "register_metric",
    "validate_evaluator",
]
