"""The one structured action type every agent, case file and environment speaks.

Models emit many dialects (pyautogui code, Claude / OpenAI computer-use tool calls, UI-TARS strings);
each dialect has a parser in this package that maps into :class:`Action`.  Environments only ever
execute :class:`Action` values, so nothing a model writes is ever executed as code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

ActionKind = Literal[
    "click",  # button + clicks (1 single, 2 double, 3 triple) at (x, y) or the current position
    "move",
    "drag",  # press at (x, y) or the current position, release at (x2, y2)
    "mouse_down",
    "mouse_up",
    "scroll",  # dy > 0 scrolls up (pyautogui convention), dx > 0 right; at (x, y) if given
    "type",  # text, any Unicode
    "key",  # press (and release) each key in `keys` in turn, `presses` times
    "hotkey",  # hold keys[:-1], press keys[-1]: a chord like ctrl+s
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
    "ctrl_l": "ctrl",
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


def untypeable(char: str) -> bool:
    """A control character other than the ones a keyboard types (Return, Tab)."""
    return char not in "\n\r\t" and (ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0)


class ActionError(ValueError):
    """An action that is not in the whitelist or has invalid arguments."""


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
    seconds: float = 0.0

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
        if self.kind == "type" and not isinstance(self.text, str):
            raise ActionError("type needs text")
        if self.kind == "type" and (bad := next((c for c in self.text if untypeable(c)), None)):
            raise ActionError(f"type: the text holds the control character {bad!r}, which no key types "
                              "(send keys such as 'esc' with key or hotkey)")
        if self.kind in ("key", "hotkey", "key_down", "key_up"):
            if not self.keys:
                raise ActionError(f"{self.kind} needs at least one key")
            object.__setattr__(self, "keys", tuple(normalize_key(k) for k in self.keys))
        if not isinstance(self.presses, int) or not 1 <= self.presses <= 100:
            raise ActionError(f"{self.kind}: presses must be an integer in 1..100, got {self.presses!r}")
        if not 0 <= float(self.seconds) <= 60:
            raise ActionError(f"{self.kind}: seconds must be in 0..60, got {self.seconds!r}")

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
        if not isinstance(data, dict) or "action" not in data:
            raise ActionError(f"an action mapping needs an 'action' field, got {data!r}")
        fields = {f.name for f in dataclasses.fields(cls)} - {"kind"}
        extra = set(data) - fields - {"action"}
        if extra:
            raise ActionError(f"{data['action']}: unknown field(s) {', '.join(sorted(extra))}")
        kwargs = {k: v for k, v in data.items() if k != "action"}
        if "keys" in kwargs:
            keys = kwargs["keys"]
            kwargs["keys"] = tuple([keys] if isinstance(keys, str) else keys)
        return cls(kind=data["action"], **kwargs)

    def describe(self) -> str:
        """One line for logs and failure messages."""
        d = self.to_dict()
        kind = d.pop("action")
        return kind + ("(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")" if d else "")


def parse_action(value: Any) -> list[Action]:
    """Parse one case-file entry: a mapping, or a string of pyautogui code (which may hold several calls)."""
    if isinstance(value, dict):
        return [Action.from_dict(value)]
    if isinstance(value, str):
        from .pyautogui import parse_pyautogui

        return parse_pyautogui(value)
    raise ActionError(f"an action must be a mapping or a pyautogui code string, got {type(value).__name__}")


__all__ = ["Action", "ActionError", "ActionKind", "ACTION_KINDS", "normalize_key", "parse_action"]
