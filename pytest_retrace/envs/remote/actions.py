"""Actions as the Python programs the ``remote`` provider runs on a guest through ``/execute``.

The inverse of actions/pyautogui.py's parser, for execution rather than display (``to_pyautogui`` in
actions/pyautogui_render.py renders an action for a model to read): OSWorld's own client delivers every
action as ``python -c "import pyautogui; ...; <code>"`` through ``/execute``, so this is the one input channel
that both a real OSWorld VM and ``retrace guest`` offer. The program is generated here from a checked
:class:`~pytest_retrace.actions.Action`, never from model text: every value in it is a ``repr`` of a checked
field.

Timing follows the xvfb environment (25 ms between typed characters, 40 ms between key presses, 80 ms between
the clicks of a double click, 30 ms between wheel clicks, a drag moved through intermediate points), and
``pyautogui.PAUSE`` is 0 so that nothing else waits. Keys the guest's keymap lacks are a failure of the
program (a non-zero exit), never silently dropped as pyautogui would. Characters pyautogui cannot type (it
knows ASCII only) go through ``xdotool type`` on the guest; a guest without xdotool fails such an action. On a
Windows guest (``windows=True``: WindowsAgentArena) pyautogui is the same and such characters are sent as
Unicode key events with ``SendInput`` (envs/remote/windows.py).
"""

from __future__ import annotations

from pytest_retrace.actions import Action
from pytest_retrace.envs.remote.windows import UNICODE_TYPING

# Canonical key names (pyautogui's, actions.normalize_key) that pyautogui spells differently.
PYAUTOGUI_KEYS = {"menu": "apps"}
TYPE_INTERVAL = 0.025
KEY_INTERVAL = 0.04
CLICK_INTERVAL = 0.08
WHEEL_INTERVAL = 0.03

_PRELUDE = """\
import sys, time
import pyautogui
pyautogui.FAILSAFE = False
pyautogui.PAUSE = 0
_mapping = getattr(getattr(pyautogui, "platformModule", None), "keyboardMapping", None)
def _keys(*names):
    missing = [k for k in names if _mapping is not None and not _mapping.get(k)]
    if missing:
        sys.exit("retrace: the guest's keyboard has no key for " + ", ".join(missing))
"""


def pyautogui_key(key: str) -> str:
    return PYAUTOGUI_KEYS.get(key, key)


def _point(a: Action) -> str:
    return f"{a.x!r}, {a.y!r}, " if a.x is not None else ""


def _button(a: Action) -> str:
    return f"button={a.button!r}"


def _type_lines(text: str, windows: bool = False) -> list[str]:
    """ASCII runs through pyautogui.write; any other characters through xdotool type (pyautogui skips them),
    or on Windows through SendInput's Unicode events."""
    lines: list[str] = []
    run = ""
    ascii_run: bool | None = None
    for char in text + "\0":  # a sentinel that flushes the last run
        is_ascii = char.isascii()
        if char != "\0" and (ascii_run is None or is_ascii == ascii_run):
            run += char
            ascii_run = is_ascii
            continue
        if run and ascii_run:
            lines.append(f"pyautogui.write({run!r}, interval={TYPE_INTERVAL!r})")
        elif run and windows:
            lines.append(f"_unicode({run!r}, {TYPE_INTERVAL!r})")
        elif run:
            lines.append("import subprocess")
            lines.append(f"subprocess.run(['xdotool', 'type', '--delay', '25', '--', {run!r}], check=True)")
        run, ascii_run = char, is_ascii
    return lines


def _body(a: Action, windows: bool) -> list[str]:
    keys = [pyautogui_key(k) for k in a.keys]
    if a.kind == "click":
        return [f"pyautogui.click({_point(a)}clicks={a.clicks!r}, interval={CLICK_INTERVAL!r}, {_button(a)})"]
    if a.kind == "move":
        return [f"pyautogui.moveTo({a.x!r}, {a.y!r})"]
    if a.kind == "drag":
        start = [f"pyautogui.moveTo({a.x!r}, {a.y!r})"] if a.x is not None else []
        return [*start, f"pyautogui.mouseDown({_button(a)})", "time.sleep(0.05)",
                f"pyautogui.moveTo({a.x2!r}, {a.y2!r}, duration=0.2)", "time.sleep(0.05)",
                f"pyautogui.mouseUp({_button(a)})"]
    if a.kind in ("mouse_down", "mouse_up"):
        name = "mouseDown" if a.kind == "mouse_down" else "mouseUp"
        return [f"pyautogui.{name}({_point(a)}{_button(a)})"]
    if a.kind == "scroll":
        at = f", x={a.x!r}, y={a.y!r}" if a.x is not None else ""
        lines = []
        for name, amount in (("scroll", a.dy), ("hscroll", a.dx)):
            if amount:
                step = 1 if amount > 0 else -1
                lines += [f"for _ in range({abs(amount)!r}):",
                          f"    pyautogui.{name}({step!r}{at})", f"    time.sleep({WHEEL_INTERVAL!r})"]
        return lines
    if a.kind == "type":
        return _type_lines(a.text, windows)
    if a.kind == "key":
        return [f"_keys(*{keys!r})", f"pyautogui.press({keys!r}, presses={a.presses!r}, interval={KEY_INTERVAL!r})"]
    if a.kind == "hotkey":
        if a.seconds:
            chord = [*(f"pyautogui.keyDown({k!r})" for k in keys), f"time.sleep({a.seconds!r})",
                     *(f"pyautogui.keyUp({k!r})" for k in reversed(keys))]
        else:
            chord = [f"pyautogui.hotkey(*{keys!r}, interval=0.02)"]
        lines = [f"_keys(*{keys!r})"]
        for i in range(a.presses):
            lines += ([f"time.sleep({KEY_INTERVAL!r})"] if i else []) + chord
        return lines
    if a.kind in ("key_down", "key_up"):
        name = "keyDown" if a.kind == "key_down" else "keyUp"
        return [f"_keys(*{keys!r})", *(f"pyautogui.{name}({k!r})" for k in keys)]
    raise ValueError(f"{a.kind} is not performed on the guest")


def action_program(action: Action, windows: bool = False) -> str | None:
    """The Python program that performs `action` on a guest with pyautogui (a Windows guest's with
    `windows`), or None for the kinds that need no input at all (``wait`` is a sleep on the harness's side;
    ``done`` and ``fail`` do nothing)."""
    if action.kind in ("wait", "done", "fail"):
        return None
    body = _body(action, windows)
    if action.hold:
        held = [pyautogui_key(k) for k in action.hold]
        body = [f"_keys(*{held!r})", *(f"pyautogui.keyDown({k!r})" for k in held), "try:",
                *(f"    {line}" for line in body), "finally:",
                *(f"    pyautogui.keyUp({k!r})" for k in reversed(held))]
    prelude = _PRELUDE + UNICODE_TYPING if windows and any("_unicode(" in line for line in body) else _PRELUDE
    return prelude + "\n".join(body) + "\n"


def release_program(keys: tuple[str, ...] = ("shift", "ctrl", "alt", "win", "shiftright", "ctrlright", "altright",
                                              "winright"),
                    park: tuple[int, int] | None = None) -> str:
    """Release modifier keys and mouse buttons an earlier case may have left down, then park the pointer."""
    lines = [*(f"pyautogui.keyUp({k!r})" for k in keys),
             *(f"pyautogui.mouseUp(button={b!r})" for b in ("left", "middle", "right"))]
    if park is not None:
        lines.append(f"pyautogui.moveTo({park[0]!r}, {park[1]!r})")
    return _PRELUDE + "\n".join(lines) + "\n"


__all__ = ["PYAUTOGUI_KEYS", "action_program", "pyautogui_key", "release_program"]
