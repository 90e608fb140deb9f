"""Whether anything drew on an X display: the DAMAGE extension on the root window.

Settling compares screenshots (settle.py), and grabbing one costs ~3.4 ms of CPU (a 4 MB copy out of the
server, the RGB conversion, the comparison). Polling every 30 ms made a waiting desktop cost 13 % of a core,
so 16 desktops settling at once, what ``-n 16`` does most of the time, kept this 2-core machine busy grabbing
screens that had not changed (benchmarks/bench_settle.py measures it). The X server knows when something
draws: with this watch, settling grabs only after drawing, and a quiet screen costs nothing.

The server reports damage to the root window for every window drawn into (inferiors included), mapped,
unmapped or moved, so no change of the framebuffer goes unreported; settling still grabs once more before it
declares the screen settled (``wait_stable``), which would catch one that did.
"""

from __future__ import annotations

import select

from Xlib import display as xdisplay
from Xlib.error import DisplayError
from Xlib.ext import damage

from pytest_retrace.envs import EnvError


class DamageWatch:
    """A connection of its own to ``display``, notified once per burst of drawing (``DamageReportNonEmpty``:
    one event when the damaged region stops being empty, none more until ``clear``)."""

    def __init__(self, display: str) -> None:
        try:
            self._x = xdisplay.Display(display)
        except DisplayError as exc:
            raise EnvError(f"cannot connect to display {display}: {exc}") from None
        if not self._x.has_extension("DAMAGE"):
            self._x.close()
            raise EnvError(f"display {display} lacks the DAMAGE extension")
        self._x.damage_query_version()  # the extension's handshake, before its first request
        self._damage = self._x.screen().root.damage_create(damage.DamageReportNonEmpty)
        self._x.sync()

    def clear(self) -> None:
        """Forget the drawing so far. Synchronous: once this returns the server has emptied the region, so a
        screenshot taken next (on another connection) shows everything this watch will not report."""
        self._drain()
        self._x.damage_subtract(self._damage)
        self._x.sync()

    def wait(self, timeout: float) -> bool:
        """True as soon as anything drew since ``clear``; False after ``timeout`` seconds without drawing."""
        if self._drain():
            return True
        ready, _, _ = select.select([self._x], [], [], max(0.0, timeout))
        return bool(ready) and self._drain()

    def root_has(self, name: str) -> bool:
        """Whether the root window carries the property ``name`` (the window manager announces itself with
        ``_NET_SUPPORTING_WM_CHECK``): read on this connection, where an ``xprop`` per poll was a process each."""
        atom = self._x.intern_atom(name, only_if_exists=True)
        return atom != 0 and self._x.screen().root.get_full_property(atom, 0) is not None

    def _drain(self) -> bool:
        seen = False
        while self._x.pending_events():
            seen |= isinstance(self._x.next_event(), damage.DamageNotify)
        return seen

    def close(self) -> None:
        self._x.close()
