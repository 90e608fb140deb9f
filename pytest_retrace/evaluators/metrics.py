"""Built-in text/file/command metrics: ``func(result, expected, **options) -> float``.

Each returns a :class:`Score` (a float carrying a reason). Load-time ``check`` hooks validate
``rule`` literals and options so a malformed case fails when it is loaded, not after a run.
"""

from __future__ import annotations

import re
from typing import Any

from pytest_retrace.evaluators.base import (
    NOT_LITERAL,
    CheckSpec,
    CommandResult,
    EvaluatorError,
    Score,
    register_metric,
)
from pytest_retrace.evaluators.values import as_text, expected_text, first_difference, same_value, short

# --- exact_match ---------------------------------------------------------------------------------


def _decoded(value: Any, strip: bool) -> Any:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return value.strip() if strip and isinstance(value, str) else value


@register_metric("exact_match")
def exact_match(result: Any, expected: Any, *, strip: bool = False) -> Score:
    """result == expected; bytes on either side are decoded as UTF-8 first."""
    got, want = _decoded(result, strip), _decoded(expected, strip)
    if same_value(got, want):
        return Score.ok(f"== {short(want)}")
    return Score.fail(f"{short(got)} != {short(want)}")


# --- file_exists ---------------------------------------------------------------------------------


def _check_file_exists(spec: CheckSpec) -> None:
    if spec.expected is not NOT_LITERAL and spec.expected is not None and not isinstance(spec.expected, bool):
        raise EvaluatorError(f"expected must be true, false or absent, got {short(spec.expected)}")


@register_metric("file_exists", check=_check_file_exists)
def file_exists(result: Any, expected: Any = None) -> Score:
    """The file exists (``expected`` absent/true) or does not (``expected: false``).

    ``result`` is a bool (vm_file_exists) or file content / None (vm_file).
    """
    if isinstance(result, bool):
        exists = result
    elif result is None or isinstance(result, (bytes, str)):
        exists = result is not None
    else:
        raise EvaluatorError(f"result is a {type(result).__name__}; use vm_file or vm_file_exists")
    want = True if expected is None else expected
    if not isinstance(want, bool):
        raise EvaluatorError(f"expected must be true, false or absent, got {short(expected)}")
    state = "exists" if exists else "does not exist"
    return Score.of(exists == want, state if exists == want else f"{state}, expected the opposite")


# --- compare_text_file ---------------------------------------------------------------------------


def _normalise(text: str, strip: bool, ignore_blanks: bool, ignore_case: bool) -> str:
    if ignore_blanks:  # any whitespace run counts as one space, as OSWorld's ignore_blanks
        text = " ".join(text.split())
    elif strip:
        text = text.strip()
    return text.casefold() if ignore_case else text


def _check_text(spec: CheckSpec) -> None:
    if (literal := spec.expected) is not NOT_LITERAL:
        expected_text(literal)


@register_metric("compare_text_file", check=_check_text)
def compare_text_file(
    result: Any, expected: Any, *, strip: bool = False, ignore_blanks: bool = False, ignore_case: bool = False
) -> Score:
    """The file's text equals the expected text (str/bytes or ``{text: ...}``)."""
    got = _normalise(as_text(result), strip, ignore_blanks, ignore_case)
    want = _normalise(expected_text(expected), strip, ignore_blanks, ignore_case)
    return Score.ok("text matches") if got == want else Score.fail(first_difference(got, want))


# --- match_regex ---------------------------------------------------------------------------------


def _pattern(expected: Any, multiline: bool, ignorecase: bool, dotall: bool) -> re.Pattern[str]:
    source = expected_text(expected, key="pattern")
    flags = (
        (re.MULTILINE if multiline else 0)
        | (re.IGNORECASE if ignorecase else 0)
        | (re.DOTALL if dotall else 0)
    )
    try:
        return re.compile(source, flags)
    except re.error as exc:
        raise EvaluatorError(f"invalid regular expression {short(source)}: {exc}") from None


def _check_regex(spec: CheckSpec) -> None:
    if (literal := spec.expected) is not NOT_LITERAL:
        _pattern(literal, False, False, False)


@register_metric("match_regex", check=_check_regex)
def match_regex(
    result: Any, expected: Any, *, multiline: bool = False, ignorecase: bool = False, dotall: bool = False
) -> Score:
    """``re.search(pattern, text)`` finds a match; expected is a pattern or ``{pattern: ...}``."""
    pattern = _pattern(expected, multiline, ignorecase, dotall)
    text = as_text(result)
    if pattern.search(text):
        return Score.ok(f"matches {short(pattern.pattern)}")
    return Score.fail(f"no match for {short(pattern.pattern)} in {short(text)}")


# --- contains_text -------------------------------------------------------------------------------


def _needles(expected: Any) -> list[str]:
    """One required substring, or a list that must all be present."""
    if isinstance(expected, list):
        if not expected:
            raise EvaluatorError("expected list must not be empty")
        return [expected_text(item) for item in expected]
    return [expected_text(expected)]


def _check_contains(spec: CheckSpec) -> None:
    if (literal := spec.expected) is not NOT_LITERAL:
        _needles(literal)


@register_metric("contains_text", check=_check_contains)
def contains_text(result: Any, expected: Any, *, ignore_case: bool = False) -> Score:
    """Every expected substring (str, ``{text: ...}`` or a list of them) occurs in the result text."""
    text = as_text(result)
    haystack = text.casefold() if ignore_case else text
    missing = [n for n in _needles(expected) if (n.casefold() if ignore_case else n) not in haystack]
    if missing:
        return Score.fail(f"missing {', '.join(short(m) for m in missing[:3])} in {short(text)}")
    return Score.ok("contains expected text")


# --- command_succeeds ----------------------------------------------------------------------------


def _check_returncode(spec: CheckSpec) -> None:
    literal = spec.expected
    if literal is None or literal is NOT_LITERAL:
        return
    if isinstance(literal, bool) or not isinstance(literal, int):
        raise EvaluatorError(f"expected must be an exit status (int) or absent, got {short(literal)}")


@register_metric("command_succeeds", check=_check_returncode)
def command_succeeds(result: Any, expected: Any = None) -> Score:
    """The command exited 0 (or with the exit status given as ``expected``)."""
    if not isinstance(result, CommandResult):
        raise EvaluatorError(f"result is a {type(result).__name__}; use the vm_command_result getter")
    want = 0 if expected is None else expected
    if result.returncode == want:
        return Score.ok(f"exit {result.returncode}")
    stderr = result.stderr.strip()
    return Score.fail(f"exit {result.returncode}, expected {want}" + (f": {short(stderr)}" if stderr else ""))
