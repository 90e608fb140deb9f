"""Parse UI-TARS(-1.5) replies into :class:`Action` values.

A UI-TARS reply is a few labelled sections, the last of which holds the actions::

    Thought: The file is saved; now close the dialog.
    Action: click(start_box='<|box_start|>(512,384)<|box_end|>')

``Reflection:`` and ``Action_Summary:`` sections may come before ``Action:``; everything before ``Action:``
is the rationale.  The Action section holds one call per line, in Python call syntax with keyword
arguments whose values are string literals: ``click(start_box='(x,y)')``, ``hotkey(key='ctrl c')``,
``type(content='hello\\n')``, ``scroll(start_box='(x,y)', direction='down')``, ``finished(content='...')``...

Model output is untrusted, so each call line is read with ``ast.parse`` and accepted only in exactly that
shape: a bare function name from the whitelist, no positional arguments, and keyword values that are plain
string constants (only those go through ``ast.literal_eval``, which also gives escapes such as ``\\n`` and
``\\'`` their Python meaning).  Points live inside those strings in several spellings seen in the wild
(``'(x,y)'``, ``'(x1,y1,x2,y2)'`` for a box, whose centre is taken, ``<|box_start|>`` tokens,
``'<point>x y</point>'``, ``'[x, y]'``); they are read with a bounded regular expression, never evaluated.
Coordinates stay in the model's own space: the caller scales them to the screen.  Any deviation raises
:class:`ActionError` naming the line of the reply.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from pytest_retrace.actions.action import Action, ActionError, ParsedReply, relabel, typeable
from pytest_retrace.actions.limits import MAX_NUMBER, MAX_REPLY_CHARS, MAX_TURN_ACTIONS
from pytest_retrace.actions.syntax import callee, describe, parse_python

MAX_CALL_CHARS = 5_000  # one call line: a type() of MAX_TEXT_CHARS characters, escaped, fits
MAX_POINT_CHARS = 200  # a box string; bounds the regular expression's work

# `Action:` at the start of a line ([ \t], not \s: `^\s*` over many blank lines would be quadratic).
_ACTION_HEADER = re.compile(r"^[ \t]*Action[ \t]*:", re.MULTILINE)
_THOUGHT_HEADER = re.compile(r"^\s*Thought[ \t]*:[ \t]*")
_POINT_TOKENS = re.compile(r"<\|box_start\|>|<\|box_end\|>|</?point>|</?bbox>")
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_POINT = re.compile(
    rf"\s*(?:\(\s*(?P<paren>.*?)\s*\)|\[\s*(?P<bracket>.*?)\s*\]|(?P<bare>{_NUMBER}.*?))\s*", re.DOTALL
)
_SEPARATOR = re.compile(r"\s*,\s*|\s+")

Args = dict[str, str]


# --- argument values ---------------------------------------------------------------------------------


def _coordinate(text: str, what: str) -> float:
    if not re.fullmatch(_NUMBER, text):
        raise ActionError(f"{what}: {text!r} is not a number")
    value = float(text)  # never OverflowError: a long digit string becomes inf, rejected below
    if not math.isfinite(value) or value > MAX_NUMBER:
        raise ActionError(f"{what}: coordinate {text[:20]!r} is not a finite number up to {MAX_NUMBER}")
    if value < 0:
        raise ActionError(f"{what}: coordinates must be non-negative, got {text!r}")
    return value


def _point(value: str, what: str) -> tuple[int, int]:
    """(x, y) from a point or box string, in any spelling UI-TARS uses; a box (4 numbers) gives its centre."""
    if len(value) > MAX_POINT_CHARS:
        raise ActionError(f"{what} is too long ({len(value)} characters)")
    inner = _POINT_TOKENS.sub(" ", value)
    match = _POINT.fullmatch(inner)
    if match is None:
        raise ActionError(f"{what} must be a point like '(x,y)' or a box '(x1,y1,x2,y2)', got {value!r}")
    body = next(group for group in match.group("paren", "bracket", "bare") if group is not None)
    parts = _SEPARATOR.split(body.strip())
    if len(parts) not in (2, 4):
        raise ActionError(
            f"{what} must hold 2 numbers (a point) or 4 (a box), got {len(parts)} in {value!r}"
        )
    numbers = [_coordinate(part, what) for part in parts]
    if len(numbers) == 4:
        numbers = [(numbers[0] + numbers[2]) / 2, (numbers[1] + numbers[3]) / 2]
    return round(numbers[0]), round(numbers[1])


def _keys(value: str, what: str) -> tuple[str, ...]:
    keys = tuple(value.split())
    if not keys:
        raise ActionError(f"{what} names no key")
    return keys


# --- calls -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    scroll_clicks: int  # wheel clicks one scroll(direction=...) means
    wait_seconds: float  # how long wait() waits


Builder = Callable[[Args, _Options], Action]


@dataclass(frozen=True)
class _Spec:
    """The accepted keyword arguments of one UI-TARS action function."""

    build: Builder
    allowed: tuple[str, ...] = ()
    required: tuple[tuple[str, ...], ...] = ()  # each entry: one of these (synonymous) names must be given


_START = ("start_box", "point", "start_point")
_END = ("end_box", "end_point")


def _one_of(args: Args, names: tuple[str, ...]) -> tuple[str, str] | None:
    """The (name, value) of whichever of the synonymous arguments `names` was given (at most one may be)."""
    given = [name for name in names if name in args]
    if len(given) > 1:
        raise ActionError(f"give only one of {', '.join(given)}")
    return (given[0], args[given[0]]) if given else None


def _start(args: Args) -> tuple[int, int] | tuple[None, None]:
    found = _one_of(args, _START)
    return _point(found[1], found[0]) if found else (None, None)


def _clicker(clicks: int = 1, button: str = "left") -> Builder:
    def build(args: Args, options: _Options) -> Action:
        x, y = _start(args)
        return Action("click", x, y, clicks=clicks, button=button)

    return build


def _drag(args: Args, options: _Options) -> Action:
    x, y = _start(args)
    found = _one_of(args, _END)
    assert found is not None  # required
    x2, y2 = _point(found[1], found[0])
    return Action("drag", x, y, x2, y2)


def _hotkey(args: Args, options: _Options) -> Action:
    keys = _keys(args["key"], "key")
    return Action("hotkey" if len(keys) > 1 else "key", keys=keys)


def _single_key(kind: str) -> Builder:
    def build(args: Args, options: _Options) -> Action:
        keys = _keys(args["key"], "key")
        if len(keys) != 1:
            raise ActionError(f"key must name one key, got {args['key']!r} (use hotkey for a chord)")
        return Action(kind, keys=keys)  # type: ignore[arg-type]

    return build


def _type(args: Args, options: _Options) -> Action:
    return Action("type", text=typeable(args["content"], "content"))


_DIRECTIONS = {"down": ("dy", -1), "up": ("dy", 1), "right": ("dx", 1), "left": ("dx", -1)}


def _scroll(args: Args, options: _Options) -> Action:
    direction = args["direction"].strip().lower()
    if direction not in _DIRECTIONS:
        raise ActionError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {args['direction']!r}")
    axis, sign = _DIRECTIONS[direction]
    x, y = _start(args)
    return Action("scroll", x, y, **{axis: sign * options.scroll_clicks})


_CALLS: dict[str, _Spec] = {
    "click": _Spec(_clicker(), _START, (_START,)),
    "left_single": _Spec(_clicker(), _START, (_START,)),
    "left_double": _Spec(_clicker(clicks=2), _START, (_START,)),
    "right_single": _Spec(_clicker(button="right"), _START, (_START,)),
    "drag": _Spec(_drag, _START + _END, (_START, _END)),
    "hotkey": _Spec(_hotkey, ("key",), (("key",),)),
    "press": _Spec(_single_key("key"), ("key",), (("key",),)),
    "keydown": _Spec(_single_key("key_down"), ("key",), (("key",),)),
    "keyup": _Spec(_single_key("key_up"), ("key",), (("key",),)),
    "type": _Spec(_type, ("content",), (("content",),)),
    "scroll": _Spec(_scroll, _START + ("direction",), (("direction",),)),
    "wait": _Spec(lambda args, options: Action("wait", seconds=options.wait_seconds)),
    "finished": _Spec(lambda args, options: Action("done"), ("content",)),
    "call_user": _Spec(lambda args, options: Action("fail")),
}


def _call(line: str) -> tuple[str, Args]:
    """One call line -> (function name, its string arguments), reading only string constants."""
    if len(line) > MAX_CALL_CHARS:
        raise ActionError(f"the call is too long ({len(line)} characters, limit {MAX_CALL_CHARS})")
    tree = parse_python(line, "eval", "the call")
    assert isinstance(tree, ast.Expression)
    call = tree.body
    if not isinstance(call, ast.Call):
        raise ActionError(f"expected a call like click(start_box='(x,y)'), got {describe(call)}")
    if not isinstance(call.func, ast.Name):
        raise ActionError(f"call of {callee(call.func)} is not allowed (only the UI-TARS action functions)")
    name = call.func.id
    if name not in _CALLS:
        raise ActionError(f"unknown action function {name!r} (expected one of {', '.join(_CALLS)})")
    if call.args:
        raise ActionError(f"{name}: positional arguments are not allowed (write {name}(name='value'))")
    args: Args = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionError(f"{name}: **kwargs are not allowed")
        if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)):
            raise ActionError(f"{name}: argument {kw.arg!r} must be a string literal, got {describe(kw.value)}")
        if kw.arg in args:  # ast.parse already refuses repeated keywords; keep the check local
            raise ActionError(f"{name}: argument {kw.arg!r} given twice")
        args[kw.arg] = ast.literal_eval(kw.value)
    return name, args


def _action(line: str, options: _Options) -> tuple[Action, str | None]:
    """One call line -> its Action, plus finished()'s content (None for every other call)."""
    name, args = _call(line)
    spec = _CALLS[name]
    unknown = [arg for arg in args if arg not in spec.allowed]
    if unknown:
        allowed = ", ".join(spec.allowed) or "none"
        raise ActionError(f"{name}: unknown argument(s) {', '.join(map(repr, unknown))} (allowed: {allowed})")
    for names in spec.required:
        if not any(n in args for n in names):
            raise ActionError(f"{name}: missing argument {' / '.join(map(repr, names))}")
    try:
        action = spec.build(args, options)
    except ActionError as exc:  # from Action's own checks: swap its "kind: " prefix for the function name
        raise relabel(exc, name) from None
    return action, args.get("content") if name == "finished" else None


def parse_uitars(text: str, *, scroll_clicks: int = 5, wait_seconds: float = 5.0) -> ParsedReply:
    """Parse a UI-TARS reply into its rationale and Actions (coordinates in the model's own space).

    `scroll_clicks` is the number of wheel clicks one ``scroll(direction=...)`` means; `wait_seconds` how
    long ``wait()`` waits.  Raises :class:`ActionError`, naming the line of the reply, for anything else.
    """
    if not isinstance(text, str):
        raise ActionError(f"a model reply must be a string, got {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:
        raise ActionError(f"the reply is too long ({len(text)} characters, limit {MAX_REPLY_CHARS})")
    header = _ACTION_HEADER.search(text)
    if header is None:
        raise ActionError("no Action: section in the reply (expected 'Action: click(start_box=...)' ...)")
    options = _Options(scroll_clicks, wait_seconds)
    rationale = _THOUGHT_HEADER.sub("", text[: header.start()], count=1).strip()
    first_line = text.count("\n", 0, header.start()) + 1
    actions: list[Action] = []
    summaries: list[str] = []
    for offset, line in enumerate(text[header.end():].split("\n")):
        if not line.strip():
            continue
        try:
            action, content = _action(line.strip(), options)
        except ActionError as exc:
            raise ActionError(f"line {first_line + offset}: {exc}") from None
        if len(actions) >= MAX_TURN_ACTIONS:
            raise ActionError(f"line {first_line + offset}: too many actions (limit {MAX_TURN_ACTIONS})")
        actions.append(action)
        if content and content.strip():
            summaries.append(content.strip())
    if not actions:
        raise ActionError(f"line {first_line}: the Action: section holds no call")
    return ParsedReply("\n\n".join(part for part in [rationale, *summaries] if part), actions)


__all__ = ["MAX_CALL_CHARS", "parse_uitars"]
