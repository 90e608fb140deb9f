"""Small value helpers shared by the metrics: decoding getter output, reading expected shapes, reasons."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_retrace.evaluators.base import CheckFailed, CommandResult, EvaluatorError
from pytest_retrace.text import show

_SHORT = 40


def short(value: Any, limit: int = _SHORT) -> str:
    """repr() cut to ``limit`` characters, so a detail line stays one short line."""
    return show(value, limit)


def as_text(value: Any) -> str:
    """Getter output as text: bytes are decoded as strict UTF-8, a CommandResult gives its stdout.

    A missing file (None) fails the check; a value that can never be text (a bool from
    vm_file_exists, a dict from a rule) is a spec error.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError -> the engine scores 0 with the reason
    if isinstance(value, CommandResult):
        return value.stdout
    if value is None:
        raise CheckFailed("file does not exist")
    raise EvaluatorError(f"result is a {type(value).__name__}, not text (wrong getter for this metric?)")


def expected_text(expected: Any, key: str = "text") -> str:
    """The expected text: a str/bytes, or a mapping ``{key: str}`` (OSWorld's rules style)."""
    if expected is None:
        raise EvaluatorError("expected is required for this metric")
    if isinstance(expected, Mapping):
        if set(expected) != {key}:
            raise EvaluatorError(f"expected must be a string or {{{key}: ...}}, got keys {sorted(expected)}")
        expected = expected[key]
    if isinstance(expected, bytes):
        return expected.decode("utf-8")
    if isinstance(expected, str):
        return expected
    raise EvaluatorError(f"expected must be a string or {{{key}: ...}}, got {type(expected).__name__}")


def first_difference(actual: str, wanted: str) -> str:
    """A one-line description of where two texts differ (line-wise for multi-line texts)."""
    if "\n" not in actual.rstrip("\n") and "\n" not in wanted.rstrip("\n"):
        return f"{short(actual)} != {short(wanted)}"
    got, want = actual.splitlines(), wanted.splitlines()
    for index in range(max(len(got), len(want))):
        line_got = got[index] if index < len(got) else "<end of file>"
        line_want = want[index] if index < len(want) else "<end of file>"
        if line_got != line_want:
            return f"line {index + 1}: {short(line_got)} != {short(line_want)}"
    return f"{short(actual)} != {short(wanted)}"  # differ only in line endings


def same_value(actual: Any, wanted: Any) -> bool:
    """Equality that, unlike ==, does not treat True as 1 (JSON true must not match 1)."""
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return type(actual) is type(wanted) and actual == wanted
    return bool(actual == wanted)


def mapping_or_error(value: Any, what: str = "expected") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise EvaluatorError(f"{what} must be a mapping, got {short(value)}")
    return value
