"""Parse pyautogui code, as computer-use agents emit it (OSWorld style), into :class:`Action` values.

Model output is untrusted, so this parser never executes anything: the code is read with :func:`ast.parse`
and only a whitelist of shapes is accepted — ``import pyautogui`` / ``import time``, and expression
statements that call ``pyautogui.<fn>(...)`` or ``time.sleep(n)`` with literal arguments.  Everything else
(other modules, names, arithmetic, f-strings, control flow, assignments, ``**kwargs`` ...) raises
:class:`ActionError` naming the construct and its line.  ``ast.literal_eval`` is applied only to nodes
already checked to be plain literals.

The OSWorld special strings ``WAIT``, ``DONE`` and ``FAIL`` (as the whole code) map to wait / done / fail.

Numbers are bounded where they are read (:data:`~pytest_retrace.actions.limits.MAX_NUMBER`): a literal such
as ``0xfff...`` with thousands of digits would otherwise overflow ``float()`` or exceed Python's int-to-str
limit in an error message, and only :class:`ActionError` may leave a parser.

A whole model reply (prose plus fenced code) is read by :mod:`.pyautogui_reply`; an Action is written back
as code by :mod:`.pyautogui_render`.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_retrace.actions.action import Action, ActionError, relabel
from pytest_retrace.actions.limits import MAX_NUMBER, MAX_TURN_ACTIONS
from pytest_retrace.actions.syntax import callee, describe, is_huge, parse_python

MAX_CODE_CHARS = 20_000  # agents emit a few lines; anything bigger is a mistake or an abuse attempt

_ALLOWED_IMPORTS = frozenset({"pyautogui", "time"})
# OSWorld's special strings, each the whole code (or, in a reply, a whole line)
SPECIAL = {"WAIT": Action("wait", seconds=1.0), "DONE": Action("done"), "FAIL": Action("fail")}
_BUTTON_ALIASES = {
    "left": "left",
    "right": "right",
    "middle": "middle",
    "primary": "left",
    "secondary": "right",
}
# pyautogui timing arguments: accepted so real agent code parses, validated as numbers, otherwise unused
# (an Action has no notion of animation speed).
_TIMING = frozenset({"interval", "duration"})
_RELATIVE = frozenset({"move", "moveRel", "drag", "dragRel"})

Args = dict[str, Any]


# --- literal arguments -------------------------------------------------------------------------------


def _is_scalar(node: ast.expr) -> bool:
    """A constant literal: str, number, True/False/None, or a negated number (``-5`` is a UnaryOp)."""
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (str, int, float))  # bool is an int
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and not isinstance(node.operand.value, bool)
    )


def _bounded(value: Any, what: str) -> Any:
    """`value`, unless it is an integer too large to convert to float or print."""
    if is_huge(value):
        raise ActionError(f"{what} is too large (magnitude over {MAX_NUMBER})")
    return value


def _literal(node: ast.expr, what: str) -> Any:
    """Evaluate an argument node that is a scalar literal or a flat list/tuple of them (returned as list)."""
    if _is_scalar(node):
        return _bounded(ast.literal_eval(node), what)
    if isinstance(node, (ast.List, ast.Tuple)) and all(_is_scalar(e) for e in node.elts):
        return [_bounded(v, what) for v in ast.literal_eval(node)]
    hint = " (variables are not allowed)" if isinstance(node, ast.Name) else ""
    raise ActionError(
        f"{what} must be a literal (number, string, list, True/False/None), got {describe(node)}{hint}"
    )


# --- argument converters -----------------------------------------------------------------------------


def _number(value: Any, what: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ActionError(f"{what} must be a finite number, got {value!r}")
    _bounded(value, what)  # an int too large for math.isfinite (OverflowError) or repr (ValueError)
    if not math.isfinite(value):
        raise ActionError(f"{what} must be a finite number, got {value!r}")
    return value


def _coord(value: Any, what: str) -> int | None:
    if value is None:
        return None
    number = _number(value, what)
    if abs(number) > MAX_NUMBER:  # a float like 1e308: round() would make a 309-digit int
        raise ActionError(f"{what} is too large (magnitude over {MAX_NUMBER}), got {value!r}")
    rounded = round(number)
    if rounded < 0:
        raise ActionError(f"{what} must be a non-negative number, got {value!r}")
    return rounded


def _point(args: Args) -> tuple[int | None, int | None]:
    """(x, y) from ``x=.., y=..`` or from pyautogui's ``fn((x, y))`` form."""
    x, y = args.get("x"), args.get("y")
    if isinstance(x, list) and y is None:
        if len(x) != 2:
            raise ActionError(f"a point must be (x, y), got {x!r}")
        x, y = x
    return _coord(x, "x"), _coord(y, "y")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"{what} must be an integer, got {value!r}")
    return _bounded(value, what)


def _button(value: Any) -> str:
    if not isinstance(value, str) or value not in _BUTTON_ALIASES:
        raise ActionError(f"button must be one of {', '.join(_BUTTON_ALIASES)}, got {value!r}")
    return _BUTTON_ALIASES[value]


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{what} must be a string, got {value!r}")
    return value


def _keys(value: Any, what: str = "keys") -> tuple[str, ...]:
    """A key name or a list of them (pyautogui accepts both wherever it takes keys)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(_str(k, f"each of {what}") for k in value)
    raise ActionError(f"{what} must be a key name or a list of key names, got {value!r}")


# --- builders: bound arguments -> Action -------------------------------------------------------------


def _clicker(clicks: int | None = None, button: str | None = None) -> Callable[[Args], Action]:
    """click / doubleClick / rightClick ...: fixed clicks or button where the function name implies one."""

    def build(args: Args) -> Action:
        x, y = _point(args)
        return Action(
            "click",
            x,
            y,
            button=button or _button(args.get("button", "left")),
            clicks=clicks or _int(args.get("clicks", 1), "clicks"),
        )

    return build


def _move(args: Args) -> Action:
    x, y = _point(args)
    return Action("move", x, y)


def _drag(args: Args) -> Action:
    # dragTo drags from wherever the cursor is: the press point stays unset.
    x2, y2 = _point(args)
    return Action("drag", x2=x2, y2=y2, button=_button(args.get("button", "left")))


def _mouse(kind: str) -> Callable[[Args], Action]:
    def build(args: Args) -> Action:
        x, y = _point(args)
        return Action(kind, x, y, button=_button(args.get("button", "left")))  # type: ignore[arg-type]

    return build


def _scroll(axis: str) -> Callable[[Args], Action]:
    def build(args: Args) -> Action:
        amount = round(_number(args["clicks"], "clicks"))
        x, y = _point(args)
        return Action("scroll", x, y, **{axis: amount})

    return build


def _write(args: Args) -> Action:
    message = args["message"]
    if isinstance(message, list):  # typewrite(['a', 'enter']) presses those keys in turn
        return Action("key", keys=_keys(message, "message"))
    return Action("type", text=_str(message, "message"))


def _press(args: Args) -> Action:
    return Action("key", keys=_keys(args["keys"]), presses=_int(args.get("presses", 1), "presses"))


def _hotkey(args: Args) -> Action:
    keys = args["*"]
    if len(keys) == 1 and isinstance(keys[0], list):  # hotkey(['ctrl', 'c'])
        keys = keys[0]
    return Action("hotkey", keys=tuple(_str(k, "each key") for k in keys))


def _key_edge(kind: str) -> Callable[[Args], Action]:
    def build(args: Args) -> Action:
        return Action(kind, keys=(_str(args["key"], "key"),))  # type: ignore[arg-type]

    return build


def _sleep(args: Args) -> Action:
    return Action("wait", seconds=float(_number(args["seconds"], "seconds")))


@dataclass(frozen=True)
class _Spec:
    """The accepted signature of one whitelisted function (a subset of pyautogui's own)."""

    build: Callable[[Args], Action]
    positional: tuple[str, ...] = ()  # may also be passed by keyword
    keyword: tuple[str, ...] = ()  # keyword-only: pyautogui has parameters we don't accept in between
    required: tuple[str, ...] = ()
    varargs: bool = False  # hotkey(*keys): positional arguments collected under "*"


_CLICK_ARGS = ("x", "y", "clicks", "interval", "button", "duration")
_MULTI_CLICK_ARGS = ("x", "y", "interval", "button", "duration")

_PYAUTOGUI: dict[str, _Spec] = {
    "click": _Spec(_clicker(), _CLICK_ARGS),
    "leftClick": _Spec(_clicker(button="left"), ("x", "y", "interval", "duration")),
    "doubleClick": _Spec(_clicker(clicks=2), _MULTI_CLICK_ARGS),
    "tripleClick": _Spec(_clicker(clicks=3), _MULTI_CLICK_ARGS),
    "rightClick": _Spec(_clicker(button="right"), ("x", "y", "duration")),
    "middleClick": _Spec(_clicker(button="middle"), ("x", "y", "duration")),
    "moveTo": _Spec(_move, ("x", "y", "duration")),
    "dragTo": _Spec(_drag, ("x", "y", "duration"), keyword=("button",)),
    "mouseDown": _Spec(_mouse("mouse_down"), ("x", "y", "button", "duration")),
    "mouseUp": _Spec(_mouse("mouse_up"), ("x", "y", "button", "duration")),
    "scroll": _Spec(_scroll("dy"), ("clicks", "x", "y"), required=("clicks",)),
    "vscroll": _Spec(_scroll("dy"), ("clicks", "x", "y"), required=("clicks",)),
    "hscroll": _Spec(_scroll("dx"), ("clicks", "x", "y"), required=("clicks",)),
    "typewrite": _Spec(_write, ("message", "interval"), required=("message",)),
    "write": _Spec(_write, ("message", "interval"), required=("message",)),
    "press": _Spec(_press, ("keys", "presses", "interval"), required=("keys",)),
    "hotkey": _Spec(_hotkey, keyword=("interval",), varargs=True),
    "keyDown": _Spec(_key_edge("key_down"), ("key",), required=("key",)),
    "keyUp": _Spec(_key_edge("key_up"), ("key",), required=("key",)),
    "sleep": _Spec(_sleep, ("seconds",), required=("seconds",)),
}
_TIME: dict[str, _Spec] = {"sleep": _Spec(_sleep, ("seconds",), required=("seconds",))}
_MODULES: dict[str, dict[str, _Spec]] = {"pyautogui": _PYAUTOGUI, "time": _TIME}


# --- statements --------------------------------------------------------------------------------------


def _bind(name: str, spec: _Spec, call: ast.Call) -> Args:
    """Match a call's arguments to the spec, like Python would, but only ever reading literals."""
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            raise ActionError(f"{name}: starred arguments (*args) are not allowed")
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionError(f"{name}: **kwargs are not allowed")
    if spec.varargs:
        args: Args = {"*": [_literal(a, f"{name} argument {i + 1}") for i, a in enumerate(call.args)]}
    else:
        if len(call.args) > len(spec.positional):
            raise ActionError(
                f"{name} takes at most {len(spec.positional)} positional argument(s), got {len(call.args)}"
            )
        args = {p: _literal(a, f"{name} argument {p!r}") for p, a in zip(spec.positional, call.args)}
    allowed = spec.positional + spec.keyword
    for kw in call.keywords:
        assert kw.arg is not None  # checked above
        if kw.arg not in allowed:
            raise ActionError(
                f"{name}: unknown keyword argument {kw.arg!r} (allowed: {', '.join(allowed) or 'none'})"
            )
        if kw.arg in args:
            raise ActionError(f"{name}: got multiple values for argument {kw.arg!r}")
        args[kw.arg] = _literal(kw.value, f"{name} argument {kw.arg!r}")
    missing = [p for p in spec.required if p not in args]
    if missing:
        raise ActionError(f"{name}: missing required argument(s) {', '.join(map(repr, missing))}")
    if spec.varargs and not args["*"]:
        raise ActionError(f"{name} needs at least one key")
    for timing in _TIMING & args.keys():
        _number(args[timing], f"{name} argument {timing!r}")
    return args


def _statement(stmt: ast.stmt) -> Action | None:
    """One top-level statement -> an Action, None for an allowed import, or ActionError."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.name not in _ALLOWED_IMPORTS or alias.asname is not None:
                as_part = f" as {alias.asname}" if alias.asname else ""
                raise ActionError(f"import {alias.name}{as_part} is not allowed (only pyautogui and time)")
        return None
    if isinstance(stmt, ast.ImportFrom):
        raise ActionError(
            f"from {stmt.module or '.'} import ... is not allowed (only import pyautogui / time)"
        )
    if not isinstance(stmt, ast.Expr):
        raise ActionError(
            f"{type(stmt).__name__} statements are not allowed (only pyautogui.* and time.sleep calls)"
        )
    call = stmt.value
    if not isinstance(call, ast.Call):
        raise ActionError(f"only calls of pyautogui.* and time.sleep are allowed, got {describe(call)}")
    func = call.func
    # Exactly `module.fn` with module a bare name: rules out pyautogui.os.system, getattr(...)(...), etc.
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in _MODULES:
        name = f"{func.value.id}.{func.attr}"
        if func.value.id == "pyautogui" and func.attr in _RELATIVE:
            raise ActionError(
                f"{name} is a relative move, which is not supported (the parser does not know the cursor "
                "position); use moveTo / dragTo with absolute coordinates"
            )
        spec = _MODULES[func.value.id].get(func.attr)
        if spec is not None:
            args = _bind(name, spec, call)
            try:
                return spec.build(args)
            except ActionError as exc:  # from Action's own checks: swap its "kind: " prefix for ours
                raise relabel(exc, name) from None
    raise ActionError(f"call of {callee(func)} is not allowed")


def parse_pyautogui(code: str) -> list[Action]:
    """Parse agent-written pyautogui code into Actions, in order, without executing any of it.

    Raises :class:`ActionError` (with the offending line) for anything outside the whitelist.
    """
    if not isinstance(code, str):
        raise ActionError(f"pyautogui code must be a string, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise ActionError(f"pyautogui code is too long ({len(code)} characters, limit {MAX_CODE_CHARS})")
    special = SPECIAL.get(code.strip())
    if special is not None:
        return [special]
    tree = parse_python(code, "exec", "pyautogui code")
    assert isinstance(tree, ast.Module)
    actions: list[Action] = []
    for stmt in tree.body:
        try:
            action = _statement(stmt)
        except ActionError as exc:
            raise ActionError(f"line {stmt.lineno}: {exc}") from None
        if action is None:
            continue
        if len(actions) >= MAX_TURN_ACTIONS:
            raise ActionError(f"line {stmt.lineno}: too many actions (limit {MAX_TURN_ACTIONS})")
        actions.append(action)
    return actions

__all__ = ["MAX_CODE_CHARS", "SPECIAL", "parse_pyautogui"]
