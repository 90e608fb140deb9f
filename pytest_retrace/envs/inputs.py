"""Input state that outlives the apps of a task: keys and mouse buttons an agent left held down
(``keyDown('shift')``, ``mouseDown()``) and the Caps Lock / Num Lock state live in the X server, not in any
process that reset kills. Left alone they would leak into the next case on the same worker: every letter
typed upper case, every click a drag. Reset releases them through XTest and puts the locks back off, as
the server starts."""

from __future__ import annotations

from Xlib import XK, X
from Xlib import display as xdisplay
from Xlib.ext import xtest

from . import EnvError

_BUTTON_MASKS = ((1, X.Button1Mask), (2, X.Button2Mask), (3, X.Button3Mask), (4, X.Button4Mask),
                 (5, X.Button5Mask))
# (modifier mask, the key that toggles it): locks are states, not held keys, so they are tapped off
_LOCKS = ((X.LockMask, XK.XK_Caps_Lock), (X.Mod2Mask, XK.XK_Num_Lock))


def held_state(dpy: xdisplay.Display) -> tuple[list[int], list[int], int]:
    """(keycodes held down, mouse buttons held down, modifier mask) as the X server sees them now."""
    keymap = dpy.query_keymap()
    keys = [i * 8 + bit for i, byte in enumerate(keymap) for bit in range(8) if byte >> bit & 1]
    mask = dpy.screen().root.query_pointer().mask
    return keys, [b for b, m in _BUTTON_MASKS if mask & m], mask


def release_all(display: str) -> list[str]:
    """Release every held key and button and switch the locks off; returns what was changed (for logs)."""
    try:
        dpy = xdisplay.Display(display)
    except Exception as exc:  # Xlib raises several unrelated types
        raise EnvError(f"cannot connect to {display} to release held input: {exc}") from exc
    changed: list[str] = []
    try:
        keys, buttons, _ = held_state(dpy)
        for code in keys:
            xtest.fake_input(dpy, X.KeyRelease, code)
            changed.append(f"key {code}")
        for button in buttons:
            xtest.fake_input(dpy, X.ButtonRelease, button)
            changed.append(f"button {button}")
        dpy.sync()
        mask = dpy.screen().root.query_pointer().mask
        for lock_mask, sym in _LOCKS:
            if mask & lock_mask:
                code = dpy.keysym_to_keycode(sym)
                xtest.fake_input(dpy, X.KeyPress, code)
                xtest.fake_input(dpy, X.KeyRelease, code)
                changed.append(XK.keysym_to_string(sym) or str(sym))
        dpy.sync()
    finally:
        dpy.close()
    return changed
