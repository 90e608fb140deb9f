"""Write an :class:`Action` as pyautogui code: how an agent is shown its past steps, in the one dialect every
model reads (the code parses back with :mod:`.pyautogui`)."""

from __future__ import annotations

from typing import Any

from pytest_retrace.actions.action import POINTER_KINDS, Action


def _args(*positional: Any, **keyword: Any) -> str:
    parts = [repr(p) for p in positional] + [f"{k}={v!r}" for k, v in keyword.items()]
    return ", ".join(parts)


def to_pyautogui(action: Action) -> str:
    """pyautogui code that does what `action` does: it parses back to `action`, or to the few actions
    pyautogui needs for it (a drag from a given point, keys held during a click). The caller scales
    coordinates into the model's image space first."""
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
    if a.hold and a.kind in POINTER_KINDS:
        downs = "".join(f"pyautogui.keyDown({k!r})\n" for k in a.hold)
        ups = "".join(f"\npyautogui.keyUp({k!r})" for k in reversed(a.hold))
        body = downs + body + ups
    return body


__all__ = ["to_pyautogui"]
