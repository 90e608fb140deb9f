"""Parse pyautogui code, as computer-use agents emit it (OSWorld style), into :class:`Action` values.

Model output is untrusted, so this parser never executes anything: the code is read with :func:`ast.parse`
and only a whitelist of shapes is accepted — ``import pyautogui`` / ``import time``, and expression
statements that call ``pyautogui.<fn>(...)`` or ``time.sleep(n)`` with literal arguments.  Everything else
(other modules, names, arithmetic, f-strings, control flow, assignments, ``**kwargs`` ...) raises
:class:`ActionError` naming the construct and its line.  ``ast.literal_eval`` is applied only to nodes
already checked to be plain literals.

The OSWorld special strings ``WAIT``, ``DONE`` and ``FAIL`` (as the whole code) map to wait / done / fail.

Numbers are bounded where they are read (:data:`MAX_NUMBER`): a literal such as ``0xfff...`` with thousands
of digits would otherwise overflow ``float()`` or exceed Python's int-to-str limit in an error message, and
only :class:`ActionError` may leave a parser.

:func:`parse_pyautogui_reply` reads a whole model reply in the EvoCUA / OSWorld style: prose plus the code
in fenced blocks.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_retrace.actions import ACTION_KINDS, Action, ActionError, ParsedReply

MAX_CODE_CHARS = 20_000  # agents emit a few lines; anything bigger is a mistake or an abuse attempt
MAX_ACTIONS = 200  # bounds the work an environment does for one model reply
MAX_REPLY_CHARS = 100_000  # a whole model reply (reasoning included) read by a dialect parser
# Largest magnitude of any number a model may write: far beyond any coordinate, duration or count, and
# small enough that scaling it, converting it to float or printing it can never overflow.
MAX_NUMBER = 10**9

_ALLOWED_IMPORTS = frozenset({"pyautogui", "time"})
_SPECIAL = {"WAIT": Action("wait", seconds=1.0), "DONE": Action("done"), "FAIL": Action("fail")}
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
_KIND_PREFIX = re.compile(rf"^(?:{'|'.join(ACTION_KINDS)}): ")

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


def _describe(node: ast.expr) -> str:
    """Name a rejected argument node in terms a model author understands."""
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.BinOp):
        return "an arithmetic expression"
    if isinstance(node, ast.Call):
        return "a call"
    if isinstance(node, ast.Constant):
        return f"a constant of type {type(node.value).__name__}"
    return f"an expression of type {type(node).__name__}"


def _is_huge(value: Any) -> bool:
    """An integer too large to convert to float or print (checked without doing either)."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER


def _bounded(value: Any, what: str) -> Any:
    """`value`, unless it is an integer too large to convert to float or print."""
    if _is_huge(value):
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
        f"{what} must be a literal (number, string, list, True/False/None), got {_describe(node)}{hint}"
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


_CALLEE_NODES = 40  # ast.unparse recurses: a callee larger than this is described, not printed


def _callee(func: ast.expr) -> str:
    """Readable name of what is being called, for error messages (never evaluated)."""
    # ast.walk is iterative; counting its nodes first keeps `a.a.a....a()` (thousands deep, which ast.parse
    # accepts) from exhausting the stack inside ast.unparse, and `0xfff...()` must not reach int.__repr__.
    nodes = [node for _, node in zip(range(_CALLEE_NODES + 1), ast.walk(func))]
    if len(nodes) > _CALLEE_NODES:
        return f"a long {type(func).__name__.lower()} expression"
    if any(isinstance(node, ast.Constant) and _is_huge(node.value) for node in nodes):
        kind = type(func).__name__.lower()
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} expression holding a huge number"
    text = ast.unparse(func)
    return text if len(text) <= 60 else text[:57] + "..."


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
        raise ActionError(f"only calls of pyautogui.* and time.sleep are allowed, got {_describe(call)}")
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
                raise ActionError(f"{name}: {_KIND_PREFIX.sub('', str(exc))}") from None
    raise ActionError(f"call of {_callee(func)} is not allowed")


def parse_pyautogui(code: str) -> list[Action]:
    """Parse agent-written pyautogui code into Actions, in order, without executing any of it.

    Raises :class:`ActionError` (with the offending line) for anything outside the whitelist.
    """
    if not isinstance(code, str):
        raise ActionError(f"pyautogui code must be a string, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise ActionError(f"pyautogui code is too long ({len(code)} characters, limit {MAX_CODE_CHARS})")
    special = _SPECIAL.get(code.strip())
    if special is not None:
        return [special]
    try:
        # Invalid escapes like '\d' in a typed string only warn; they must not fail (or spam) the run.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno else ""
        raise ActionError(f"{where}syntax error: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurdly deep nesting
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ActionError(f"pyautogui code cannot be parsed ({detail})") from None
    actions: list[Action] = []
    for stmt in tree.body:
        try:
            action = _statement(stmt)
        except ActionError as exc:
            raise ActionError(f"line {stmt.lineno}: {exc}") from None
        if action is None:
            continue
        if len(actions) >= MAX_ACTIONS:
            raise ActionError(f"line {stmt.lineno}: too many actions (limit {MAX_ACTIONS})")
        actions.append(action)
    return actions


# --- whole replies: prose plus fenced code (EvoCUA / OSWorld) -------------------------------------------

_FENCE = "```"
_INFO_STRING = re.compile(r"[A-Za-z0-9_+.#-]*")  # the language tag after an opening fence: python, py ...
_LINE_PREFIX = re.compile(r"^line (\d+): ")


def _fenced_blocks(text: str) -> tuple[list[tuple[int, str]], str]:
    """The code of each fenced block with the reply line its code starts on, and the text outside blocks.

    Scans with str.find (linear even for a reply full of unmatched fences). A block's first line is a
    language tag only if it is a bare word; ```` ```pyautogui.click(1, 2)``` ```` is code. An unclosed
    last fence runs to the end of the reply (replies are often cut at a stop sequence).
    """
    blocks: list[tuple[int, str]] = []
    outside: list[str] = []
    pos, line = 0, 1
    while (start := text.find(_FENCE, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(_FENCE)
        line += text.count("\n", pos, body_start)
        end = text.find(_FENCE, body_start)
        body = text[body_start:] if end == -1 else text[body_start:end]
        first, newline, rest = body.partition("\n")
        code, code_line = body, line
        if newline and _INFO_STRING.fullmatch(first.strip()) and first.strip() not in _SPECIAL:
            code, code_line = rest, line + 1
        blocks.append((code_line, code))
        pos = len(text) if end == -1 else end + len(_FENCE)
        line += text.count("\n", body_start, pos)
    outside.append(text[pos:])
    return blocks, "".join(outside)


def _parse_at(code: str, first_line: int) -> list[Action]:
    """parse_pyautogui, with its error's line number counted in the reply rather than in `code`."""
    try:
        return parse_pyautogui(code)
    except ActionError as exc:
        message = str(exc)
        match = _LINE_PREFIX.match(message)
        if match is None:
            raise ActionError(f"line {first_line}: {message}") from None
        line = first_line + int(match.group(1)) - 1
        raise ActionError(f"line {line}: {message[match.end():]}") from None


def parse_pyautogui_reply(text: str) -> ParsedReply:
    """Parse a whole reply: prose plus pyautogui code in fenced blocks, or a WAIT / DONE / FAIL line.

    The code of all blocks is parsed, in order, by :func:`parse_pyautogui`; a line that is exactly
    WAIT / DONE / FAIL inside a block is that action (so ```` ```DONE``` ```` after a block of clicks works).
    Without any block, the reply (stripped) or its last non-empty line must be WAIT / DONE / FAIL.
    The rationale is the text outside the blocks.  Errors name the line of the reply.
    """
    if not isinstance(text, str):
        raise ActionError(f"a model reply must be a string, got {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:
        raise ActionError(f"the reply is too long ({len(text)} characters, limit {MAX_REPLY_CHARS})")
    blocks, outside = _fenced_blocks(text)
    if not blocks:
        lines = text.strip().split("\n")
        special = _SPECIAL.get(lines[-1].strip())
        if special is None:
            raise ActionError(
                "no pyautogui code block (```python ... ```) in the reply, and its last line is not "
                "WAIT, DONE or FAIL"
            )
        return ParsedReply("\n".join(lines[:-1]).strip(), [special])
    total = sum(len(code) for _, code in blocks)
    if total > MAX_CODE_CHARS:
        raise ActionError(f"pyautogui code is too long ({total} characters, limit {MAX_CODE_CHARS})")
    actions: list[Action] = []
    for first_line, code in blocks:
        segment: list[str] = []
        segment_line = first_line
        for offset, line in enumerate(code.split("\n")):
            special = _SPECIAL.get(line.strip())
            if special is None:
                segment.append(line)
                continue
            actions += _parse_at("\n".join(segment), segment_line)
            actions.append(special)
            segment, segment_line = [], first_line + offset + 1
            if len(actions) > MAX_ACTIONS:
                raise ActionError(f"line {first_line + offset}: too many actions (limit {MAX_ACTIONS})")
        actions += _parse_at("\n".join(segment), segment_line)
        if len(actions) > MAX_ACTIONS:
            raise ActionError(f"line {first_line}: too many actions (limit {MAX_ACTIONS})")
    return ParsedReply(outside.strip(), actions)


__all__ = ["MAX_ACTIONS", "MAX_CODE_CHARS", "MAX_NUMBER", "MAX_REPLY_CHARS", "parse_pyautogui",
           "parse_pyautogui_reply"]


# --- rendering: Action -> pyautogui code ---------------------------------------------------------------


def _args(*positional: Any, **keyword: Any) -> str:
    parts = [repr(p) for p in positional] + [f"{k}={v!r}" for k, v in keyword.items()]
    return ", ".join(parts)


def to_pyautogui(action: Action) -> str:
    """pyautogui code that does what `action` does: it parses back to `action`, or to the few actions
    pyautogui needs for it (a drag from a given point, keys held during a click). Shows an agent its past steps in the one dialect every model reads; the
    caller scales coordinates into the model's image space first."""
    a = action
    point = (a.x, a.y) if a.x is not None else ()
    button = {} if a.button == "left" else {"button": a.button}
    if a.kind == "click":
        name = {1: "click", 2: "doubleClick", 3: "tripleClick"}[a.clicks]
        body = f"pyautogui.{name}({_args(*point, **button)})"
    elif a.kind == "move":
        body = f"pyautogui.moveTo({_args(*point)})"
    elif a.kind == "drag":
        start = f"pyautogui.moveTo({_args(*point)})\n" if point else ""
        body = f"{start}pyautogui.dragTo({_args(a.x2, a.y2, **button)})"
    elif a.kind in ("mouse_down", "mouse_up"):
        body = f"pyautogui.{'mouseDown' if a.kind == 'mouse_down' else 'mouseUp'}({_args(*point, **button)})"
    elif a.kind == "scroll":
        at = {"x": a.x, "y": a.y} if point else {}
        lines = ([f"pyautogui.scroll({_args(a.dy, **at)})"] if a.dy else []) + (
            [f"pyautogui.hscroll({_args(a.dx, **at)})"] if a.dx else [])
        body = "\n".join(lines)
    elif a.kind == "type":
        body = f"pyautogui.write({a.text!r})"
    elif a.kind == "key":
        keys: Any = a.keys[0] if len(a.keys) == 1 else list(a.keys)
        body = f"pyautogui.press({_args(keys, **({'presses': a.presses} if a.presses != 1 else {}))})"
    elif a.kind == "hotkey":
        if a.seconds:
            downs = "\n".join(f"pyautogui.keyDown({k!r})" for k in a.keys)
            ups = "\n".join(f"pyautogui.keyUp({k!r})" for k in reversed(a.keys))
            body = f"{downs}\ntime.sleep({a.seconds!r})\n{ups}"
        else:
            body = f"pyautogui.hotkey({_args(*a.keys)})"
        body = "\n".join([body] * a.presses)
    elif a.kind in ("key_down", "key_up"):
        name = "keyDown" if a.kind == "key_down" else "keyUp"
        body = "\n".join(f"pyautogui.{name}({k!r})" for k in a.keys)
    elif a.kind == "wait":
        body = f"time.sleep({a.seconds!r})"
    else:
        body = a.kind.upper()  # DONE / FAIL, OSWorld's special strings
    if a.hold and a.kind in ("click", "move", "drag", "mouse_down", "mouse_up", "scroll"):
        downs = "".join(f"pyautogui.keyDown({k!r})\n" for k in a.hold)
        ups = "".join(f"\npyautogui.keyUp({k!r})" for k in reversed(a.hold))
        body = downs + body + ups
    return body


__all__ += ["to_pyautogui"]
