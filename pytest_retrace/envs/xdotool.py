"""Actions as xdotool commands: how the xvfb provider performs every action on its display, and how the docker
provider performs them in its container (through the guest's /execute), so both send the X server the same
events. One mapping, because a different typing delay or click timing is a different screen.

Standard library only. Text with characters the keymap lacks is not mapped here (``typable`` is False): the
xvfb provider types it through keymap.py, the docker provider through pyautogui's path (envs/remote/actions.py).
"""

from __future__ import annotations

import math
import shlex

from pytest_retrace.actions import Action
from pytest_retrace.envs.steps import ActivateStep

# pyautogui key names -> X keysyms understood by xdotool
KEYSYMS = {
    "enter": "Return", "esc": "Escape", "tab": "Tab", "space": "space", "backspace": "BackSpace",
    "delete": "Delete", "insert": "Insert", "home": "Home", "end": "End", "pageup": "Prior",
    "pagedown": "Next", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "ctrl": "ctrl", "shift": "shift", "alt": "alt", "win": "super", "capslock": "Caps_Lock",
    "numlock": "Num_Lock", "printscreen": "Print", "menu": "Menu", "pause": "Pause",
    "scrolllock": "Scroll_Lock", "ctrlleft": "Control_L", "ctrlright": "Control_R",
    "shiftleft": "Shift_L", "shiftright": "Shift_R", "altleft": "Alt_L", "altright": "Alt_R",
    "winleft": "Super_L", "winright": "Super_R",
    "-": "minus", "=": "equal", ",": "comma", ".": "period", "/": "slash", ";": "semicolon",
    "'": "apostrophe", "[": "bracketleft", "]": "bracketright", "\\": "backslash", "`": "grave",
    "+": "plus", "*": "asterisk", "!": "exclam", "@": "at", "#": "numbersign", "$": "dollar",
    "%": "percent", "^": "asciicircum", "&": "ampersand", "(": "parenleft", ")": "parenright",
    "_": "underscore", ":": "colon", '"': "quotedbl", "<": "less", ">": "greater", "?": "question",
    "{": "braceleft", "}": "braceright", "|": "bar", "~": "asciitilde",
} | {f"f{i}": f"F{i}" for i in range(1, 25)}
BUTTONS = {"left": "1", "middle": "2", "right": "3"}
# Between keys, as a person types; characters the keymap lacks go through keymap.py, not a delay.
TYPE_DELAY_MS = "25"
# Time limits of one xdotool call: a base plus the time the action itself asks for (typing speed, wheel
# clicks, key presses, a held chord). The caps on Action keep every accepted action well inside them.
BASE_TIMEOUT = 15.0


def keysym(key: str) -> str:
    return KEYSYMS.get(key, key)


def typable(text: str) -> bool:
    """Whether xdotool's `type` can type every line of `text` as is (printable ASCII)."""
    return all(line.isascii() and line.isprintable() for line in text.split("\n"))


def type_command(line: str) -> tuple[list[str], float]:
    return ["type", "--delay", TYPE_DELAY_MS, "--", line], BASE_TIMEOUT + 0.05 * len(line)


def commands(a: Action) -> list[tuple[list[str], float]]:
    """The xdotool invocations (arguments, time limit) that perform `a`, in order; none for wait, done, fail.
    Raises ValueError for text that is not `typable`."""
    if a.kind == "wait" or a.terminal:
        return []
    if a.kind == "type":
        if not typable(a.text):
            raise ValueError("text with characters beyond printable ASCII: not typable by xdotool type")
        out: list[tuple[list[str], float]] = []
        for i, line in enumerate(a.text.split("\n")):  # xdotool drops "\n" inside `type` text: Return presses
            if i:
                out.append((["key", "Return"], BASE_TIMEOUT))
            if line:
                out.append(type_command(line))
        return out
    work = 0.05 * len(a.keys) * a.presses + 0.05 * (abs(a.dx) + abs(a.dy)) + a.seconds * a.presses
    return [(chain(a), BASE_TIMEOUT + work)]


def chain(a: Action) -> list[str]:
    """One xdotool command chain for `a`, with the keys of `a.hold` held around pointer actions."""
    hold = "+".join(keysym(k) for k in a.hold)
    pointer = _pointer_args(a)
    if pointer is not None:
        return [*(["keydown", hold] if hold else []), *pointer, *(["keyup", hold] if hold else [])]
    if a.kind == "key":
        return ["key", "--delay", "40", "--repeat", str(a.presses), "--", *(keysym(k) for k in a.keys)]
    if a.kind == "hotkey":
        chord = "+".join(keysym(k) for k in a.keys)
        if a.seconds:  # Claude's hold_key: the chord stays down for `seconds`
            return [arg for _ in range(a.presses) for arg in ("keydown", chord, "sleep", str(a.seconds),
                                                               "keyup", chord)]
        return ["key", "--repeat", str(a.presses), "--", chord]
    if a.kind in ("key_down", "key_up"):
        return [a.kind.replace("_", ""), "--", *(keysym(k) for k in a.keys)]
    raise ValueError(f"action {a.kind!r} has no xdotool form")


def _pointer_args(a: Action) -> list[str] | None:
    move = ["mousemove", str(a.x), str(a.y)] if a.x is not None else []
    button = BUTTONS[a.button]
    if a.kind == "click":
        return [*move, "click", "--repeat", str(a.clicks), "--delay", "80", button]
    if a.kind == "move":
        return move
    if a.kind == "mouse_down":
        return [*move, "mousedown", button]
    if a.kind == "mouse_up":
        return [*move, "mouseup", button]
    if a.kind == "drag":
        # intermediate motion so toolkits see a real drag, not a teleport
        return [*move, "mousedown", button, "sleep", "0.05", "mousemove", str(a.x2), str(a.y2),
                "sleep", "0.05", "mouseup", button]
    if a.kind == "scroll":
        steps = []
        if a.dy:
            steps += ["click", "--repeat", str(abs(a.dy)), "--delay", "30", "4" if a.dy > 0 else "5"]
        if a.dx:
            steps += ["click", "--repeat", str(abs(a.dx)), "--delay", "30", "7" if a.dx > 0 else "6"]
        return [*move, *steps]
    return None


# `activate`, run by the environment's shell: OSWorld's server runs `wmctrl -a NAME` (-F: the exact title, -x:
# WM_CLASS), once. Here a launch returns before its window shows and OSWorld's `sleep` steps are not kept, so
# the window is waited for. xdotool first — only visible windows, matched below by wmctrl's rules: a
# substring ignoring case, or the whole string —, else wmctrl itself (an OSWorld VM has it, maybe not
# xdotool). Arguments: NAME exact|contains title|class SECONDS. Exit 3: no such window in time.
_ACTIVATE = r"""
name=$1 how=$2 field=$3 end=$(( $(date +%s) + $4 ))  # whole seconds: waits $4 to $4 + 1 s
value() {  # the title of window $1, or its WM_CLASS as instance.Class
  if [ "$field" = class ]; then
    xprop -id "$1" WM_CLASS 2>/dev/null | sed -n 's/^WM_CLASS([^)]*) = "\(.*\)", "\(.*\)"$/\1.\2/p'
  else
    xdotool getwindowname "$1" 2>/dev/null
  fi
}
first() {  # the first visible window that matches, as xdotool lists them
  opt=--name; [ "$field" = class ] && opt=--classname
  for id in $(xdotool search --onlyvisible $opt . 2>/dev/null); do
    v=$(value "$id")
    if [ "$how" = exact ]; then [ "$v" = "$name" ] || continue
    else printf '%s\n' "$v" | grep -qiF -e "$name" || continue; fi
    echo "$id"
    return
  done
}
if command -v xdotool >/dev/null 2>&1; then
  if [ "$field" = class ] && ! command -v xprop >/dev/null 2>&1; then
    echo "matching WM_CLASS needs xprop (x11-utils), which is not installed" >&2; exit 127
  fi
  while :; do
    id=$(first)
    [ -n "$id" ] && exec xdotool windowactivate --sync "$id"
    [ "$(date +%s)" -gt "$end" ] && exit 3
    sleep 0.1
  done
elif command -v wmctrl >/dev/null 2>&1; then
  flags=a; [ "$how" = exact ] && flags=Fa; [ "$field" = class ] && flags=x$flags
  while :; do
    wmctrl -$flags "$name" 2>/dev/null && exit 0
    [ "$(date +%s)" -gt "$end" ] && exit 3
    sleep 0.1
  done
fi
echo "neither xdotool nor wmctrl is installed" >&2
exit 127
"""


def activate_command(step: ActivateStep) -> str:
    """The shell command that performs `step` inside the environment."""
    args = [step.window, "exact" if step.exact else "contains", "class" if step.by_class else "title",
            str(math.ceil(step.timeout))]
    return "sh -c " + shlex.quote(_ACTIVATE) + " sh " + shlex.join(args)
