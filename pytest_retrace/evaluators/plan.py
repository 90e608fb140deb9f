"""Load-time validation: turn an evaluator spec into a plan of checks, or raise EvaluatorError.

Validation never touches an environment, so case files are checked when they are loaded; the same
plan then drives :func:`evaluate`, which therefore cannot disagree with the validator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_retrace.evaluators.base import (
    GETTER_FIELDS,
    GETTERS,
    METRIC_CHECKS,
    METRICS,
    NOT_LITERAL,
    CheckSpec,
    EvaluatorError,
    metric_options,
)
from pytest_retrace.evaluators.getters import MAX_TIMEOUT, check_local_path
from pytest_retrace.evaluators.values import short

Conj = Literal["and", "or"]
_FLAT_KEYS = frozenset({"func", "result", "expected", "options", "conj", "negate"})
_NESTED_KEYS = frozenset({"checks", "conj", "negate"})
# Keys owned by the caller, tolerated and ignored here: OSWorld blocks carry `postconfig` steps,
# which the environment runs before calling evaluate().
CALLER_KEYS = frozenset({"postconfig"})


@dataclass(frozen=True)
class Check:
    """One metric applied to a result getter (and optionally an expected getter)."""

    where: str  # field path of its func, e.g. "evaluator.func[1]"
    metric: str
    result: Mapping[str, Any]
    result_where: str
    expected: Mapping[str, Any] | None
    expected_where: str
    options: Mapping[str, Any]  # without `negate`
    negate: bool


@dataclass(frozen=True)
class Group:
    """Checks or nested groups combined by ``and`` (min score) or ``or`` (max score)."""

    where: str
    conj: Conj
    items: tuple[Check | Group, ...]
    negate: bool


def compile_block(spec: Any, where: str) -> Group:
    if not isinstance(spec, Mapping):
        raise EvaluatorError(f"{where}: must be a mapping with 'func' or 'checks', got {short(spec)}")
    if "checks" in spec:
        return _compile_nested(spec, where)
    return _compile_flat(spec, where)


def _reject_unknown_keys(spec: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed and k not in CALLER_KEYS)
    if unknown:
        raise EvaluatorError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _conj(spec: Mapping[str, Any], where: str) -> Conj:
    conj = spec.get("conj", "and")
    if conj not in ("and", "or"):
        raise EvaluatorError(f"{where}.conj: must be 'and' or 'or', got {short(conj)}")
    return "and" if conj == "and" else "or"


def _negate(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise EvaluatorError(f"{where}: must be true or false, got {short(value)}")
    return value


def _compile_nested(spec: Mapping[str, Any], where: str) -> Group:
    _reject_unknown_keys(spec, _NESTED_KEYS, where)
    checks = spec["checks"]
    if not isinstance(checks, list) or not checks:
        raise EvaluatorError(f"{where}.checks: must be a non-empty list of evaluator blocks")
    items = tuple(compile_block(item, f"{where}.checks[{i}]") for i, item in enumerate(checks))
    return Group(where, _conj(spec, where), items, _negate(spec.get("negate"), f"{where}.negate"))


def _funcs(spec: Mapping[str, Any], where: str) -> tuple[list[Any], list[str], bool]:
    """The func names, their field paths, and whether func was given as a list."""
    if "func" not in spec:
        raise EvaluatorError(f"{where}: missing 'func' (or 'checks' for a nested block)")
    func = spec["func"]
    if isinstance(func, list):
        if not func:
            raise EvaluatorError(f"{where}.func: must not be an empty list")
        return func, [f"{where}.func[{i}]" for i in range(len(func))], True
    return [func], [f"{where}.func"], False


def _per_func(
    spec: Mapping[str, Any], key: str, n: int, listed: bool, where: str
) -> tuple[list[Any], list[str]]:
    """``result``/``expected``/``options`` split per func: a list of length n when func is a list."""
    value = spec.get(key)
    if not listed:
        return [value], [f"{where}.{key}"]
    paths = [f"{where}.{key}[{i}]" for i in range(n)]
    if value is None and key != "result":
        return [None] * n, paths
    if not isinstance(value, list):
        raise EvaluatorError(
            f"{where}.{key}: must be a list with one entry per func ({n}), got {short(value)}"
        )
    if len(value) != n:
        raise EvaluatorError(f"{where}.{key}: has {len(value)} entries but func has {n}")
    return value, paths


def _compile_flat(spec: Mapping[str, Any], where: str) -> Group:
    _reject_unknown_keys(spec, _FLAT_KEYS, where)
    funcs, func_paths, listed = _funcs(spec, where)
    n = len(funcs)
    results, result_paths = _per_func(spec, "result", n, listed, where)
    expecteds, expected_paths = _per_func(spec, "expected", n, listed, where)
    options, option_paths = _per_func(spec, "options", n, listed, where)
    checks = tuple(
        _compile_check(
            funcs[i],
            func_paths[i],
            results[i],
            result_paths[i],
            expecteds[i],
            expected_paths[i],
            options[i],
            option_paths[i],
        )
        for i in range(n)
    )
    return Group(where, _conj(spec, where), checks, _negate(spec.get("negate"), f"{where}.negate"))


def _compile_check(
    name: Any,
    where: str,
    result: Any,
    result_where: str,
    expected: Any,
    expected_where: str,
    options: Any,
    options_where: str,
) -> Check:
    if not isinstance(name, str) or name not in METRICS:
        raise EvaluatorError(f"{where}: unknown metric {short(name)} (known: {', '.join(sorted(METRICS))})")
    if result is None:
        raise EvaluatorError(f"{result_where}: missing (a getter block like {{type: vm_file, path: ...}})")
    _check_getter(result, result_where)
    if expected is not None:
        _check_getter(expected, expected_where)
    opts, negate = _check_options(name, options, options_where)
    _run_metric_check(name, where, CheckSpec(_literal(expected), opts, result))
    return Check(where, name, result, result_where, expected, expected_where, opts, negate)


def _check_getter(block: Any, where: str) -> None:
    if not isinstance(block, Mapping):
        raise EvaluatorError(f"{where}: must be a getter block like {{type: ..., ...}}, got {short(block)}")
    kind = block.get("type")
    if kind is None:
        raise EvaluatorError(f"{where}.type: missing")
    if not isinstance(kind, str) or kind not in GETTERS:
        raise EvaluatorError(
            f"{where}.type: unknown getter type {short(kind)} (known: {', '.join(sorted(GETTERS))})"
        )
    fields = GETTER_FIELDS.get(kind)
    if fields is not None:
        _check_fields(block, fields.required, fields.optional, where)
    if kind == "local_file" and (problem := check_local_path(block["path"])):
        raise EvaluatorError(f"{where}.path: {problem}")
    if "timeout" in block:  # a command getter's; NaN fails the comparison too
        timeout = block["timeout"]
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if not (number and 0 < timeout <= MAX_TIMEOUT):
            raise EvaluatorError(f"{where}.timeout: must be seconds in (0, {MAX_TIMEOUT:g}], "
                                 f"got {short(timeout)}")


def _check_fields(
    block: Mapping[str, Any],
    required: Mapping[str, type | tuple[type, ...]],
    optional: Mapping[str, type | tuple[type, ...]] | None,
    where: str,
) -> None:
    for field in required:
        if field not in block:
            raise EvaluatorError(f"{where}.{field}: missing (required by getter {block['type']!r})")
    known = {**required, **(optional or {})}
    for field, value in block.items():
        if field == "type":
            continue
        if field not in known:
            if optional is not None:
                raise EvaluatorError(f"{where}.{field}: unknown field for getter {block['type']!r}")
            continue
        if not _type_ok(value, _as_tuple(known[field])):
            raise EvaluatorError(f"{where}.{field}: wrong type {type(value).__name__}")
        if isinstance(value, str) and not value.strip() and field in required:
            raise EvaluatorError(f"{where}.{field}: must not be empty")


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _type_ok(value: Any, kinds: tuple[type, ...]) -> bool:
    # YAML `true` is a bool, and bool subclasses int: don't let it pass as a number.
    if isinstance(value, bool) and bool not in kinds and object not in kinds:
        return False
    return isinstance(value, kinds)


def _check_options(metric: str, options: Any, where: str) -> tuple[dict[str, Any], bool]:
    """Options as keyword arguments for the metric (minus ``negate``), checked against its signature."""
    if options is None:
        return {}, False
    if not isinstance(options, Mapping):
        raise EvaluatorError(f"{where}: must be a mapping of options, got {short(options)}")
    opts = dict(options)
    negate = _negate(opts.pop("negate", None), f"{where}.negate")
    accepted, takes_any = metric_options(METRICS[metric])
    for key, value in opts.items():
        param = accepted.get(key)
        if param is None:
            if takes_any and not str(key).startswith("_"):
                continue
            known = ", ".join(sorted([*accepted, "negate"]))
            raise EvaluatorError(f"{where}.{key}: unknown option for {metric} (known: {known})")
        _check_option_type(value, param.default, f"{where}.{key}")
    return opts, negate


def _check_option_type(value: Any, default: Any, where: str) -> None:
    """Options whose default is a bool/number/str must be given as one (None-defaults take anything)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise EvaluatorError(f"{where}: expected {type(default).__name__}, got {short(value)}")


def _literal(expected: Any) -> Any:
    """What a load-time check can know about ``expected``: a rule literal, None, or NOT_LITERAL."""
    if expected is None or expected.get("type") == "none":
        return None
    if expected.get("type") == "rule":
        return expected["rules"]
    return NOT_LITERAL


def _run_metric_check(name: str, where: str, spec: CheckSpec) -> None:
    check = METRIC_CHECKS.get(name)
    if check is None:
        return
    try:
        check(spec)
    except (EvaluatorError, ValueError, TypeError) as exc:
        raise EvaluatorError(f"{where} ({name}): {exc}") from None
