"""Typing characters the X keymap lacks (é, €, 中) without losing any.

``xdotool type`` binds such a character to a spare keycode, sends the key, and unbinds it right
away. An app does not translate the key when it arrives: GTK re-reads the server's keymap lazily
after the MappingNotify, and by then the binding may already be gone, so the character is dropped
(measured: "é" lost in 1 of 5 runs of the unicode test with two workers busy, even at a 25 ms
delay). Here every missing character is bound *before* its key is sent and stays bound for the rest
of the task, so there is no window in which the app can read a keymap without it. Keys are sent by
keysym name (``xdotool key U00E9``), which finds the bound keycode and changes no mapping.

The connection lives on a thread of its own (xthread.py): a task holding a server grab makes its calls miss
their deadline, never hang the worker.
"""

from __future__ import annotations

from collections.abc import Callable

from Xlib import display as xdisplay

from pytest_retrace.actions import untypeable
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.xvfb.xthread import XThread

_CONTROL_KEYS = {"\t": "Tab", "\r": "Return"}


def keysym(char: str) -> int:
    """The keysym X uses for `char` (what XStringToKeysym("U<hex>") returns)."""
    code = ord(char)
    return code if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF else code | 0x01000000


def key_name(char: str) -> str:
    """An xdotool key name that types exactly `char`."""
    if char in _CONTROL_KEYS:
        return _CONTROL_KEYS[char]
    if untypeable(char):  # Action refuses these already; a direct caller gets an error, not a wrong key
        raise EnvError(f"cannot type the control character {char!r}")
    return f"U{ord(char):04X}"


class Keymap:
    """Spare keycodes of one X display, each holding up to two bound characters (plain and shifted)."""

    def __init__(self, display: str) -> None:
        self._x = XThread(display)
        try:
            self._dpy = self._x.call(xdisplay.Display, display, what="keymap connection")
        except EnvError:
            self._x.close(lambda: None)
            raise
        except Exception as exc:  # Xlib raises several unrelated types
            self._x.close(lambda: None)
            raise EnvError(f"cannot connect to {display} for the keymap: {exc}") from exc
        lo, hi = self._dpy.display.info.min_keycode, self._dpy.display.info.max_keycode
        mapping = self._x.call(self._dpy.get_keyboard_mapping, lo, hi - lo + 1, what="keymap request")
        self._width = len(mapping[0])
        self._present = {sym for syms in mapping for sym in syms if sym}
        self._spare = [lo + i for i, syms in enumerate(mapping) if not any(syms)]
        self._slots: dict[int, list[int]] = {}  # keycode -> its bound keysyms, in use

    @property
    def free(self) -> int:
        return 2 * len(self._spare) - sum(map(len, self._slots.values()))

    def _unbound(self, char: str) -> int | None:
        """The keysym `char` needs bound, or None if the keymap already types it."""
        if char in _CONTROL_KEYS:
            return None
        sym = keysym(char)
        return None if sym in self._present or any(sym in s for s in self._slots.values()) else sym

    def bind(self, syms: list[int]) -> None:
        if len(syms) > self.free:
            raise EnvError(f"{len(syms)} characters to bind, {self.free} spare slots")
        codes = []
        for sym in syms:
            code = next(c for c in self._spare if len(self._slots.get(c, [])) < 2)
            self._slots.setdefault(code, []).append(sym)
            codes.append(code)
        # synced: the server has the new mapping before any key that needs it is sent
        self._x.call(self._write_all, {c: list(self._slots[c]) for c in codes}, what="keymap change")

    def clear(self) -> None:
        """Unbind everything (only when no app can still be translating a key that used a binding)."""
        if not self._slots:
            return
        codes = dict.fromkeys(self._slots, [])
        self._slots.clear()
        self._x.call(self._write_all, codes, what="keymap change")

    def _write_all(self, rows: dict[int, list[int]]) -> None:
        for code, syms in rows.items():
            self._write(code, syms)
        self._dpy.sync()

    def _write(self, code: int, syms: list[int]) -> None:
        row = (syms + syms[:1])[:2] if syms else []  # one symbol: the same on both levels
        self._dpy.change_keyboard_mapping(code, [tuple(row + [0] * (self._width - len(row)))])

    def close(self) -> None:
        self._x.close(self._dpy.close)

    def type(self, text: str, send: Callable[[list[str]], None], settle: Callable[[], object]) -> None:
        """Type `text` (no newlines): bind what is missing, then `send` the key names.

        A text with more distinct missing characters than there are spare slots goes in parts; before
        slots are reused, `settle` waits for the screen to stop changing, i.e. for the app to have
        handled the keys that used the old bindings."""
        start = 0
        while start < len(text):
            need: list[int] = []
            end = start
            while end < len(text):
                sym = self._unbound(text[end])
                if sym is not None and sym not in need:
                    if len(need) == self.free:
                        break
                    need.append(sym)
                end += 1
            if end == start:  # not even the next character fits
                settle()
                self.clear()
                continue
            self.bind(need)
            send([key_name(c) for c in text[start:end]])
            start = end
