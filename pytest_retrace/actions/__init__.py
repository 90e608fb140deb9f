"""The one structured action type every agent, case file and environment speaks.

Models emit many dialects (pyautogui code, Claude / OpenAI computer-use tool calls, UI-TARS strings, Qwen
tool calls); each dialect has a parser in this package that maps into :class:`Action`.  Environments only
ever execute :class:`Action` values, so nothing a model writes is ever executed as code.

The package's modules, bottom first: ``limits`` (the caps on an action, a turn, a reply), ``action`` (the
type, its kinds and keys, :class:`ActionError`), ``syntax`` (reading Python call syntax safely), then one
parser per dialect (``pyautogui``, ``pyautogui_reply``, ``uitars``, ``qwen``) and ``pyautogui_render``.
This module exports the names the rest of the package uses, and :func:`parse_action`, a case file's form.
"""

from __future__ import annotations

from typing import Any

from pytest_retrace.actions.action import (
    ACTION_KINDS,
    POINTER_KINDS,
    Action,
    ActionError,
    ActionKind,
    ParsedReply,
    check_turn,
    normalize_key,
    untypeable,
)
from pytest_retrace.actions.pyautogui import parse_pyautogui


def parse_action(value: Any) -> list[Action]:
    """Parse one case-file entry: a mapping, or a string of pyautogui code (which may hold several calls)."""
    if isinstance(value, dict):
        return [Action.from_dict(value)]
    if isinstance(value, str):
        return parse_pyautogui(value)
    raise ActionError(f"an action must be a mapping or a pyautogui code string, got {type(value).__name__}")


__all__ = ["ACTION_KINDS", "POINTER_KINDS", "Action", "ActionError", "ActionKind", "ParsedReply", "check_turn",
           "normalize_key", "parse_action", "untypeable"]
