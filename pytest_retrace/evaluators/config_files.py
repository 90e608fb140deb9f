"""Metrics over configuration files: JSON keys and INI / GLib keyfile keys (incl. ``dconf dump``)."""

from __future__ import annotations

import configparser
import json
import re
from collections.abc import Mapping
from typing import Any

from pytest_retrace.evaluators.base import NOT_LITERAL, CheckSpec, EvaluatorError, Score, register_metric
from pytest_retrace.evaluators.values import as_text, mapping_or_error, same_value, short

_MISSING = object()


def _wanted_keys(expected: Any) -> dict[str, Any]:
    """``{key: K, value: V}`` or ``{keys: {K: V, ...}}`` as one ``{K: V}`` dict."""
    spec = mapping_or_error(expected)
    if set(spec) == {"key", "value"}:
        if not isinstance(spec["key"], str) or not spec["key"]:
            raise EvaluatorError("expected.key must be a non-empty string")
        return {spec["key"]: spec["value"]}
    if set(spec) == {"keys"}:
        keys = mapping_or_error(spec["keys"], "expected.keys")
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise EvaluatorError("expected.keys must map non-empty key strings to values")
        return dict(keys)
    raise EvaluatorError(f"expected must be {{key, value}} or {{keys: {{...}}}}, got keys {sorted(spec)}")


def _check_wanted(spec: CheckSpec) -> None:
    if spec.expected is not NOT_LITERAL:
        _wanted_keys(spec.expected)


def _score_keys(found: Mapping[str, Any], wanted: Mapping[str, Any], equal: Any) -> Score:
    """All wanted keys present with equal values -> 1; else 0 naming the first few problems."""
    problems = []
    for key, want in wanted.items():
        got = found[key]
        if got is _MISSING:
            problems.append(f"{key}: missing")
        elif not equal(got, want):
            problems.append(f"{key}: {short(got)} != {short(want)}")
    if problems:
        return Score.fail(
            "; ".join(problems[:3]) + (f"; +{len(problems) - 3} more" if len(problems) > 3 else "")
        )
    return Score.ok(f"{len(wanted)} key(s) match")


# --- JSON ----------------------------------------------------------------------------------------


def _json_lookup(document: Any, dotted: str) -> Any:
    """Follow ``a.b.0.c`` through objects (by key) and arrays (by index); _MISSING when absent.

    Keys that themselves contain dots cannot be addressed; none of the configs we check need it.
    """
    node = document
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and re.fullmatch(r"-?\d+", part) and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


@register_metric("check_json_key", check=_check_wanted)
def check_json_key(result: Any, expected: Any) -> Score:
    """Dotted keys in the JSON document have the expected values (JSON types compared strictly)."""
    document = json.loads(as_text(result))
    wanted = _wanted_keys(expected)
    return _score_keys({k: _json_lookup(document, k) for k in wanted}, wanted, same_value)


# --- INI / GLib keyfile --------------------------------------------------------------------------


def _ini_wanted(expected: Any) -> dict[tuple[str, str], Any]:
    """``{section, key, value}`` or ``{keys: {"section/key": value}}`` as ``{(section, key): value}``.

    The split is on the *last* slash, because dconf dumps use paths like ``[org/gnome/desktop/interface]``.
    """
    spec = mapping_or_error(expected)
    if set(spec) == {"section", "key", "value"}:
        if not all(isinstance(spec[f], str) and spec[f] for f in ("section", "key")):
            raise EvaluatorError("expected.section and expected.key must be non-empty strings")
        return {(spec["section"], spec["key"]): spec["value"]}
    if set(spec) == {"keys"}:
        keys = mapping_or_error(spec["keys"], "expected.keys")
        if not keys:
            raise EvaluatorError("expected.keys must not be empty")
        wanted = {}
        for name, value in keys.items():
            section, sep, key = str(name).rpartition("/")
            if not (sep and section and key):
                raise EvaluatorError(f"expected.keys: {name!r} is not 'section/key'")
            wanted[(section, key)] = value
        return wanted
    raise EvaluatorError(
        f"expected must be {{section, key, value}} or {{keys: {{...}}}}, got keys {sorted(spec)}"
    )


def _check_ini(spec: CheckSpec) -> None:
    if spec.expected is not NOT_LITERAL:
        _ini_wanted(spec.expected)


def _parse_ini(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(
        strict=False,  # duplicate keys/sections: last one wins, as GLib does
        allow_no_value=True,
        default_section="\0no-default",  # a real [DEFAULT] section must not leak into every other one
        empty_lines_in_values=False,
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # GLib keys are case-sensitive
    parser.read_string(text)
    return parser


def _unquote(value: str) -> str:
    """GVariant text form of a string (``'Monospace 12'``) -> ``Monospace 12``; else unchanged."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _ini_text(value: Any, unquote: bool) -> str:
    if isinstance(value, bool):  # YAML true/false vs keyfile true/false
        text = "true" if value else "false"
    else:
        text = "" if value is None else str(value).strip()
    return _unquote(text) if unquote else text


@register_metric("check_ini_key", check=_check_ini)
def check_ini_key(result: Any, expected: Any, *, unquote: bool = False) -> Score:
    """INI / GLib keyfile keys have the expected values, compared as stripped strings.

    ``unquote: true`` strips GVariant quotes (``font='Monospace 12'`` matches ``Monospace 12``).
    """
    parser = _parse_ini(as_text(result))
    wanted = _ini_wanted(expected)
    found = {
        f"{section}/{key}": parser.get(section, key) if parser.has_option(section, key) else _MISSING
        for section, key in wanted
    }
    wanted_text = {f"{section}/{key}": value for (section, key), value in wanted.items()}
    return _score_keys(
        found, wanted_text, lambda got, want: _ini_text(got, unquote) == _ini_text(want, unquote)
    )
