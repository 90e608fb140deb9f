"""The one structured action type every agent, case file and environment speaks: :class:`Action`, its kinds and
key names, the error every parser raises, and the check of one turn against the caps of :mod:`.limits`."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_retrace.actions.limits import (
    MAX_HOLD,
    MAX_KEYS,
    MAX_NUMBER,
    MAX_PRESSES,
    MAX_SCROLL,
    MAX_TEXT_CHARS,
    MAX_TURN_ACTIONS,
    MAX_TURN_WAIT,
    MAX_WAIT,
)
from pytest_retrace.text import show

ActionKind = Literal[
    "click",  # button + clicks (1 single, 2 double, 3 triple) at (x, y) or the current position
    "move",
    "drag",  # press at (x, y) or the current position, release at (x2, y2)
    "mouse_down",
    "mouse_up",
    "scroll",  # dy > 0 scrolls up (pyautogui convention), dx > 0 right; at (x, y) if given
    "type",  # text, any Unicode
    "key",  # press (and release) each key in `keys` in turn, `presses` times
    "hotkey",  # hold keys[:-1], press keys[-1]: a chord like ctrl+s (held for `seconds` if given)
    "key_down",
    "key_up",
    "wait",  # seconds
    "done",  # the agent declares it finished
    "fail",  # the agent declares the task infeasible
]
ACTION_KINDS: tuple[str, ...] = ActionKind.__args__  # type: ignore[attr-defined]
BUTTONS = ("left", "right", "middle")

# Canonical key names are pyautogui's (what most agents emit). Aliases seen in the wild map here.
KEY_ALIASES: dict[str, str] = {
    "return": "enter",
    "escape": "esc",
    "control": "ctrl",
    # X keysym names (Claude's key syntax): the left keys are the generic ones, as xdotool types them
    "ctrl_l": "ctrl",
    "ctrl_r": "ctrlright",
    "control_l": "ctrl",
    "control_r": "ctrlright",
    "shift_l": "shift",
    "shift_r": "shiftright",
    "alt_l": "alt",
    "alt_r": "altright",
    "super_l": "win",
    "super_r": "winright",
    "windows": "win",
    "kp_enter": "enter",
    "prior": "pageup",
    "next": "pagedown",
    "caps_lock": "capslock",
    "num_lock": "numlock",
    "scroll_lock": "scrolllock",
    "print": "printscreen",
    "cmd": "win",
    "command": "win",
    "super": "win",
    "meta": "win",
    "option": "alt",
    "del": "delete",
    "page_up": "pageup",
    "page_down": "pagedown",
    "pgup": "pageup",
    "pgdn": "pagedown",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    " ": "space",
    "\n": "enter",
    "\t": "tab",
}
_NAMED_KEYS = frozenset(
    """enter esc tab space backspace delete insert home end pageup pagedown up down left right
    ctrl shift alt win capslock numlock printscreen menu pause scrolllock
    ctrlleft ctrlright shiftleft shiftright altleft altright winleft winright""".split()
    + [f"f{i}" for i in range(1, 25)]
)

POINTER_KINDS = frozenset({"click", "move", "drag", "mouse_down", "mouse_up", "scroll"})


def check_turn(actions: Sequence[Action]) -> None:
    """Raise ActionError if one turn asks for more than a turn may (the caps in limits.py)."""
    if len(actions) > MAX_TURN_ACTIONS:
        raise ActionError(f"too many actions in one turn ({len(actions)}, limit {MAX_TURN_ACTIONS})")
    waited = sum(a.seconds * (a.presses if a.kind == "hotkey" else 1) for a in actions)
    if waited > MAX_TURN_WAIT:
        raise ActionError(f"the turn waits or holds keys {waited:g} s in total (limit {MAX_TURN_WAIT:g} s)")


def untypeable(char: str) -> bool:
    """A control character other than the ones a keyboard types (Return, Tab)."""
    return char not in "\n\r\t" and (ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0)


class ActionError(ValueError):
    """An action that is not in the whitelist or has invalid arguments."""


_KIND_PREFIX = re.compile(rf"^(?:{'|'.join(ACTION_KINDS)}): ")


def relabel(error: ActionError, label: str) -> ActionError:
    """An error of Action's own checks with its "kind: " prefix swapped for `label`: the name of what the
    model wrote (a pyautogui function, a UI-TARS call, a Qwen action)."""
    return ActionError(f"{label}: {_KIND_PREFIX.sub('', str(error))}")


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text`, if any ('\\ud800' is a valid Python literal and JSON escape): no key
    types one, and it cannot even be encoded to send it."""
    return next((c for c in text if "\ud800" <= c <= "\udfff"), None)


def typeable(text: str, what: str) -> str:
    """`text`, unless it holds a lone surrogate (the parsers' check, naming their own argument)."""
    if (bad := lone_surrogate(text)) is not None:
        raise ActionError(f"{what} holds the lone surrogate {bad!r}, which is not a character")
    return text


def normalize_key(name: str) -> str:
    """Return the canonical (pyautogui) name of a key, or raise ActionError."""
    if not isinstance(name, str) or not name:
        raise ActionError(f"key must be a non-empty string, got {name!r}")
    key = name if len(name) == 1 else name.strip().lower()
    key = KEY_ALIASES.get(key.lower() if len(key) > 1 else key, key)
    if len(key) == 1 and key.isprintable():
        return key
    if key in _NAMED_KEYS:
        return key
    raise ActionError(f"unknown key {name!r}")


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    x: int | None = None
    y: int | None = None
    x2: int | None = None
    y2: int | None = None
    button: str = "left"
    clicks: int = 1
    dx: int = 0
    dy: int = 0
    text: str = ""
    keys: tuple[str, ...] = ()
    presses: int = 1
    seconds: float = 0.0  # wait: how long; hotkey: how long the chord is held
    hold: tuple[str, ...] = ()  # keys held down during a pointer action (shift+click); released after

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ActionError(f"unknown action {self.kind!r}; expected one of {', '.join(ACTION_KINDS)}")
        for name in ("x", "y", "x2", "y2"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ActionError(f"{self.kind}: {name} must be a non-negative integer, got {value!r}")
        if (self.x is None) != (self.y is None):
            raise ActionError(f"{self.kind}: give both x and y or neither")
        if self.button not in BUTTONS:
            raise ActionError(f"{self.kind}: button must be one of {BUTTONS}, got {self.button!r}")
        if self.clicks not in (1, 2, 3):
            raise ActionError(f"{self.kind}: clicks must be 1, 2 or 3, got {self.clicks!r}")
        if self.kind == "move" and self.x is None:
            raise ActionError("move needs x and y")
        if self.kind == "drag" and (self.x2 is None or self.y2 is None):
            raise ActionError("drag needs x2 and y2 (the release point)")
        if self.kind == "scroll" and not (self.dx or self.dy):
            raise ActionError("scroll needs a non-zero dx or dy")
        if not isinstance(self.text, str) or (self.text and self.kind != "type"):
            raise ActionError(f"{self.kind}: text is a string, and only for type")
        if self.kind == "type" and (bad := lone_surrogate(self.text)):
            raise ActionError(f"type: the text holds the lone surrogate {bad!r}, which is no character")
        if self.kind == "type" and (bad := next((c for c in self.text if untypeable(c)), None)):
            raise ActionError(f"type: the text holds the control character {bad!r}, which no key types "
                              "(send keys such as 'esc' with key or hotkey)")
        if self.kind in ("key", "hotkey", "key_down", "key_up"):
            if not self.keys:
                raise ActionError(f"{self.kind} needs at least one key")
            object.__setattr__(self, "keys", tuple(normalize_key(k) for k in self.keys))
        elif self.keys:
            raise ActionError(f"{self.kind}: keys are only for key, hotkey, key_down and key_up (held keys go in hold)")
        if self.hold:
            if self.kind not in POINTER_KINDS:
                raise ActionError(f"{self.kind}: hold (keys held down) is only for mouse actions")
            object.__setattr__(self, "hold", tuple(normalize_key(k) for k in self.hold))
        if len(self.keys) + len(self.hold) > MAX_KEYS:
            raise ActionError(f"{self.kind}: at most {MAX_KEYS} keys per action, got {len(self.keys) + len(self.hold)}")
        if isinstance(self.presses, bool) or not isinstance(self.presses, int) or not 1 <= self.presses <= MAX_PRESSES:
            raise ActionError(f"{self.kind}: presses must be an integer in 1..{MAX_PRESSES}, got {self.presses!r}")
        if self.presses * max(1, len(self.keys)) > MAX_PRESSES:
            raise ActionError(f"{self.kind}: {self.presses} presses of {len(self.keys)} keys is over the limit of "
                              f"{MAX_PRESSES} key presses per action")
        if len(self.text) > MAX_TEXT_CHARS:
            raise ActionError(f"{self.kind}: at most {MAX_TEXT_CHARS} characters per action, got {len(self.text)}")
        for name in ("dx", "dy"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_SCROLL:
                raise ActionError(f"{self.kind}: {name} must be an integer in -{MAX_SCROLL}..{MAX_SCROLL}, got {value!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not math.isfinite(self.seconds):
            raise ActionError(f"{self.kind}: seconds must be a finite number, got {self.seconds!r}")
        limit = {"wait": MAX_WAIT, "hotkey": MAX_HOLD}.get(self.kind, 0.0)
        if not 0 <= self.seconds <= limit:
            what = "only for wait and hotkey" if limit == 0 else f"in 0..{limit:g}"
            raise ActionError(f"{self.kind}: seconds must be {what}, got {self.seconds!r}")

    @property
    def terminal(self) -> bool:
        """`done` and `fail` end an agent's turn sequence."""
        return self.kind in ("done", "fail")

    def to_dict(self) -> dict[str, Any]:
        """Compact dict (defaults omitted): the form written to case files and results."""
        out: dict[str, Any] = {"action": self.kind}
        for f in dataclasses.fields(self):
            if f.name == "kind":
                continue
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        """An action from its mapping form (case files, results). The mapping is untrusted input: every
        field's type is checked here, before __post_init__ checks ranges, so that any bad value is an
        ActionError naming the field rather than a TypeError from deep inside."""
        if not isinstance(data, dict) or "action" not in data:
            raise ActionError(f"an action mapping needs an 'action' field, got {show(data)}")
        kind = data["action"]
        if not isinstance(kind, str):
            raise ActionError(f"action must be a string naming the kind, got {show(kind)}")
        fields = {f.name for f in dataclasses.fields(cls)} - {"kind"}
        extra = sorted(str(k) for k in data if k not in fields and k != "action")
        if extra:
            raise ActionError(f"{kind}: unknown field(s) {', '.join(extra)}")
        kwargs = {k: _mapping_field(kind, k, v) for k, v in data.items() if k != "action"}
        return cls(kind=kind, **kwargs)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line for logs and failure messages."""
        d = self.to_dict()
        kind = d.pop("action")
        return kind + ("(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")" if d else "")


_COORDINATES = frozenset({"x", "y", "x2", "y2"})
_INTEGERS = _COORDINATES | {"clicks", "dx", "dy", "presses"}


def _mapping_field(kind: str, name: str, value: Any) -> Any:
    """One field of an action mapping, type-checked (ranges are __post_init__'s job); keys become a tuple."""
    if name in ("keys", "hold"):
        keys = [value] if isinstance(value, str) else value
        if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
            raise ActionError(f"{kind}: {name} must be a key name or a list of key names, got {show(value)}")
        return tuple(keys)
    if name in _INTEGERS:
        # bool is an int in Python, but `clicks: true` in a case file is a mistake, not 1 click
        integer = isinstance(value, int) and not isinstance(value, bool)
        ok, expected = integer or (value is None and name in _COORDINATES), "an integer"
    elif name == "seconds":
        ok, expected = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:  # button, text
        ok, expected = isinstance(value, str), "a string"
    if not ok:
        raise ActionError(f"{kind}: {name} must be {expected}, got {show(value)}")
    if isinstance(value, int) and abs(value) > MAX_NUMBER:
        raise ActionError(f"{kind}: {name} is too large (magnitude over {MAX_NUMBER})")
    return value


@dataclass(frozen=True)
class ParsedReply:
    """A model's reply read by one of the dialect parsers: its reasoning text and its actions, with
    coordinates still in the model's own coordinate space (the adapter scales them to the screen)."""

    rationale: str
    actions: list[Action]

