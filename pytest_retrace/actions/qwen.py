"""Parse Qwen-VL ``computer_use`` tool calls into :class:`Action` values.

Qwen2.5-VL / Qwen3-VL act through one function, ``computer_use``, whose ``action`` argument picks what
to do.  The calls arrive either inside the reply text, in Hermes-style blocks::

    I need to open the File menu.
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [34, 12]}}
    </tool_call>

or already split off by an OpenAI-compatible server as ``tool_calls`` (``{"name", "arguments"}``, the
arguments a JSON string or a mapping; the OpenAI ``{"function": {...}}`` wrapper is accepted too).

Model output is untrusted: each block is size-checked before :func:`json.loads`, every exception json can
raise (syntax, recursion on deep nesting, over-long integers) becomes :class:`ActionError`, ``NaN`` /
``Infinity`` and duplicate keys are refused, and the decoded value is then checked field by field against
the whitelist below: the tool name, the action, exactly the fields that action takes, and their types
(a coordinate is a list of two non-negative finite numbers, never a string or a bool).  Coordinates stay
in the model's own space (Qwen2.5-VL: pixels of the resized image; Qwen3-VL: 0..1000); the caller scales
them to the screen.  The rest of the text, ``<think>`` content included, is the rationale.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_retrace.actions.action import Action, ActionError, ParsedReply, relabel, typeable
from pytest_retrace.actions.limits import MAX_NUMBER, MAX_REPLY_CHARS, MAX_TURN_ACTIONS
from pytest_retrace.text import clip

MAX_TOOL_CALL_CHARS = 20_000  # one tool call's JSON; a type action of MAX_TEXT_CHARS escaped fits

TOOL_NAME = "computer_use"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK_TAGS = ("<think>", "</think>")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")  # left where blocks and tags were cut out


def _no_constant(name: str) -> Any:
    raise ActionError(f"{name} is not a number JSON allows")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ActionError(f"the field {key!r} is given twice")
        out[key] = value
    return out


def _json(text: str, what: str) -> Any:
    if len(text) > MAX_TOOL_CALL_CHARS:
        raise ActionError(f"{what} is too long ({len(text)} characters, limit {MAX_TOOL_CALL_CHARS})")
    try:
        # strict=False: a raw newline inside a JSON string (a model typing two lines) is kept, not refused.
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates, strict=False)
    except ActionError as exc:
        raise ActionError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ActionError(f"{what} is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError, MemoryError, TypeError) as exc:  # int too long, nesting too deep
        detail = str(exc)[:100]
        raise ActionError(f"{what} cannot be decoded ({type(exc).__name__}: {detail})") from None


# --- argument values ---------------------------------------------------------------------------------


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ActionError(f"{what} must be a number, got {_show(value)}")
    if isinstance(value, int) and abs(value) > MAX_NUMBER:  # before any float(): no OverflowError
        raise ActionError(f"{what} is too large (magnitude over {MAX_NUMBER})")
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ActionError(f"{what} must be a finite number up to {MAX_NUMBER} in magnitude, got {_show(value)}")
    return float(value)


def _show(value: Any) -> str:
    """A short repr for error messages (never repr() of a huge int: that raises past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
        return "a very large integer"
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    if not isinstance(value, (str, int, float, type(None))):  # native tool_calls may hold any object
        return f"a {type(value).__name__}"
    return clip(repr(value), 60)


def _coordinate(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ActionError(f"coordinate must be a list [x, y] of two numbers, got {_show(value)}")
    x, y = (_number(v, "coordinate") for v in value)
    if x < 0 or y < 0:
        raise ActionError(f"coordinate must be non-negative, got [{x:g}, {y:g}]")
    return round(x), round(y)


def _point(args: dict[str, Any]) -> tuple[int, int] | tuple[None, None]:
    return _coordinate(args["coordinate"]) if "coordinate" in args else (None, None)


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{what} must be a string, got {_show(value)}")
    return value


# --- actions -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    build: Callable[[dict[str, Any], float], Action]  # (arguments, pixels_per_click) -> Action
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


def _key(args: dict[str, Any], _: float) -> Action:
    keys = args["keys"]
    if not isinstance(keys, list) or not keys:
        raise ActionError(f"keys must be a non-empty list of key names, got {_show(keys)}")
    names = tuple(_string(k, "each of keys") for k in keys)
    return Action("key" if len(names) == 1 else "hotkey", keys=names)


def _clicker(clicks: int = 1, button: str = "left") -> Callable[[dict[str, Any], float], Action]:
    def build(args: dict[str, Any], _: float) -> Action:
        x, y = _point(args)
        return Action("click", x, y, clicks=clicks, button=button)

    return build


def _drag(args: dict[str, Any], _: float) -> Action:
    x2, y2 = _coordinate(args["coordinate"])
    return Action("drag", x2=x2, y2=y2)  # from wherever the pointer is


def _scroll(axis: str) -> Callable[[dict[str, Any], float], Action]:
    def build(args: dict[str, Any], pixels_per_click: float) -> Action:
        clicks = _number(args["pixels"], "pixels") / pixels_per_click
        if not math.isfinite(clicks) or abs(clicks) > MAX_NUMBER:
            raise ActionError(f"pixels {args['pixels']!r} is too many wheel clicks")
        amount = round(clicks)
        if amount == 0:
            raise ActionError(f"scroll of 0 clicks (pixels {args['pixels']!r}, {pixels_per_click:g} per click)")
        x, y = _point(args)
        return Action("scroll", x, y, **{axis: amount})

    return build


def _answer(args: dict[str, Any], _: float) -> Action:
    _string(args["text"], "text")  # the text joins the rationale (see _action)
    return Action("done")


def _terminate(args: dict[str, Any], _: float) -> Action:
    status = args["status"]
    if status not in ("success", "failure"):
        raise ActionError(f"status must be 'success' or 'failure', got {_show(status)}")
    return Action("done" if status == "success" else "fail")


_ACTIONS: dict[str, _Spec] = {
    "key": _Spec(_key, ("keys",)),
    "type": _Spec(lambda args, _: Action("type", text=typeable(_string(args["text"], "text"), "text")), ("text",)),
    "mouse_move": _Spec(lambda args, _: Action("move", *_coordinate(args["coordinate"])), ("coordinate",)),
    "left_click": _Spec(_clicker(), optional=("coordinate",)),
    "right_click": _Spec(_clicker(button="right"), optional=("coordinate",)),
    "middle_click": _Spec(_clicker(button="middle"), optional=("coordinate",)),
    "double_click": _Spec(_clicker(clicks=2), optional=("coordinate",)),
    "triple_click": _Spec(_clicker(clicks=3), optional=("coordinate",)),
    "left_click_drag": _Spec(_drag, ("coordinate",)),
    "scroll": _Spec(_scroll("dy"), ("pixels",), ("coordinate",)),
    "hscroll": _Spec(_scroll("dx"), ("pixels",), ("coordinate",)),
    "wait": _Spec(lambda args, _: Action("wait", seconds=_number(args["time"], "time")), ("time",)),
    "terminate": _Spec(_terminate, ("status",)),
    "answer": _Spec(_answer, ("text",)),
}


def _action(call: Any, pixels_per_click: float) -> tuple[Action, str | None]:
    """One decoded tool call -> its Action, plus the text of an ``answer`` (None for other actions)."""
    if not isinstance(call, dict):
        raise ActionError(f"a tool call must be a JSON object with name and arguments, got {_show(call)}")
    if isinstance(call.get("function"), dict) and set(call) <= {"function", "type", "id", "index"}:
        call = call["function"]  # the OpenAI wrapper: {"type": "function", "function": {...}}
    unknown = sorted(_show(field) for field in set(call) - {"name", "arguments"})
    if unknown:
        raise ActionError(f"unknown tool call field(s) {', '.join(unknown)} (expected name, arguments)")
    name = call.get("name")
    if name != TOOL_NAME:
        raise ActionError(f"unknown tool {_show(name)} (the only tool is {TOOL_NAME!r})")
    args = call.get("arguments", {})
    if isinstance(args, str):
        args = _json(args, "the arguments")
    if not isinstance(args, dict):
        raise ActionError(f"arguments must be a JSON object, got {_show(args)}")
    kind = args.get("action")
    if not isinstance(kind, str) or kind not in _ACTIONS:
        raise ActionError(f"unknown action {_show(kind)} (expected one of {', '.join(_ACTIONS)})")
    spec = _ACTIONS[kind]
    unknown = sorted(_show(field) for field in set(args) - {"action", *spec.required, *spec.optional})
    if unknown:
        allowed = ", ".join(spec.required + spec.optional) or "none"
        raise ActionError(f"{kind}: unknown argument(s) {', '.join(unknown)} (allowed: {allowed})")
    missing = [field for field in spec.required if field not in args]
    if missing:
        raise ActionError(f"{kind}: missing argument(s) {', '.join(map(repr, missing))}")
    try:
        action = spec.build(args, pixels_per_click)
    except ActionError as exc:  # from Action's own checks: swap its "kind: " prefix for the Qwen action
        raise relabel(exc, kind) from None
    return action, args["text"] if kind == "answer" else None


def _blocks(text: str) -> tuple[list[str], str]:
    """The contents of the <tool_call> blocks in `text`, and the text without them.

    Scans with str.find (linear, however many tags a reply holds).  An unclosed last block runs to the
    end of the text: servers often cut the reply at the closing tag.
    """
    blocks: list[str] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        outside.append(text[pos:start])
        end = text.find(_CLOSE, start + len(_OPEN))
        blocks.append(text[start + len(_OPEN): end if end != -1 else len(text)])
        pos = len(text) if end == -1 else end + len(_CLOSE)
    outside.append(text[pos:])
    rest = "".join(outside)
    for tag in _THINK_TAGS:  # keep the thinking, drop the tags
        rest = rest.replace(tag, "\n")
    return blocks, _BLANK_LINES.sub("\n\n", rest.replace(_CLOSE, "")).strip()


def parse_qwen(text: str, tool_calls: list[dict] | None = None, *, pixels_per_click: float = 1.0) -> ParsedReply:
    """Parse a Qwen-VL reply into its rationale and Actions (coordinates in the model's own space).

    `tool_calls` (when given and non-empty) are the calls the server already parsed; otherwise the
    ``<tool_call>`` blocks in `text` are read.  `pixels_per_click` converts the ``pixels`` of a scroll into
    wheel clicks.  No tool call at all gives no actions (the caller decides what that means).  Anything
    outside the whitelist raises :class:`ActionError` naming the tool call (1-based).
    """
    if not isinstance(text, str):
        raise ActionError(f"a model reply must be a string, got {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:
        raise ActionError(f"the reply is too long ({len(text)} characters, limit {MAX_REPLY_CHARS})")
    per_click = _number(pixels_per_click, "pixels_per_click")
    if per_click <= 0:
        raise ActionError(f"pixels_per_click must be positive, got {per_click:g}")
    blocks, rationale = _blocks(text)
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise ActionError(f"tool_calls must be a list, got {type(tool_calls).__name__}")
    calls: list[Any]
    if tool_calls:
        calls = list(tool_calls)
    else:
        calls = []
        for i, block in enumerate(blocks, 1):
            try:
                calls.append(_json(block.strip(), "the tool call"))
            except ActionError as exc:
                raise ActionError(f"tool call {i}: {exc}") from None
    if len(calls) > MAX_TURN_ACTIONS:
        raise ActionError(f"too many tool calls ({len(calls)}, limit {MAX_TURN_ACTIONS})")
    actions: list[Action] = []
    answers: list[str] = []
    for i, call in enumerate(calls, 1):
        try:
            action, answer = _action(call, per_click)
        except ActionError as exc:
            raise ActionError(f"tool call {i}: {exc}") from None
        actions.append(action)
        if answer and answer.strip():
            answers.append(answer.strip())
    return ParsedReply("\n\n".join(part for part in [rationale, *answers] if part), actions)


__all__ = ["MAX_TOOL_CALL_CHARS", "TOOL_NAME", "parse_qwen"]
