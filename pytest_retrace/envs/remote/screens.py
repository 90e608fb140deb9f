"""Screenshots of a guest that may not afford many: a count per case, a cap, and settling that polls at
growing intervals.

OSWorld's ``GET /screenshot`` opens an X connection per call and never closes it (its cursor grab), so a VM's
display runs out of its client slots (Xorg's default is 256, less the desktop's own clients) after a few
hundred screenshots; settling, which polls screenshots every 30 ms, used them up within one or two cases. On
such a guest the environment takes at most ``max_screenshots`` per case (reset included), and settles with
:class:`Backoff`: the same verdicts as ``settle.wait_stable`` (the action's effect awaited for ``react``
seconds, then ``quiet`` seconds without a change, capped at ``timeout``), from polls 0.1, 0.16, 0.26, ... up
to 1 s apart instead of every 30 ms. ``retrace guest`` (which answers ``/health``) closes each grab's X
connection (guest/desktop.py), so a guest of ours is polled as the local desktop is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_retrace.envs import EnvError

MODES = ("auto", "on", "off")  # option screenshot_budget: auto = on for a guest that is not ours
DEFAULT_MAX = 150  # per case: well under 256 X client slots less a GNOME session's own clients
FIRST_POLL = 0.1  # seconds before the first poll after a grab
GROWTH = 1.6
LONGEST_POLL = 1.0


class ScreenshotBudgetSpent(EnvError):
    """The case took its ``max_screenshots``: the harness's own bound, an infrastructure error."""


class Backoff:
    """settle.Changes that reports "maybe drew" after each poll interval, the intervals growing: wait_stable
    then grabs at those times, and once more at the end of a quiet window, never every ``interval``."""

    def __init__(self, first: float = FIRST_POLL, growth: float = GROWTH, longest: float = LONGEST_POLL) -> None:
        self.delay = first
        self.growth = growth
        self.longest = longest

    def clear(self) -> None:
        """Nothing to forget: this signal knows nothing of drawing."""

    def wait(self, timeout: float) -> bool:
        if timeout <= 0:
            return False
        if self.delay > timeout:  # the window ends first: wait_stable makes its confirming grab then
            time.sleep(timeout)
            return False
        time.sleep(self.delay)
        self.delay = min(self.delay * self.growth, self.longest)
        return True


@dataclass
class Budget:
    """Screenshots of the current case (`taken`) and of the environment's life (`total`); `cap` per case, or
    None for no cap (a guest of ours)."""

    cap: int | None
    taken: int = 0
    total: int = 0
    spent: str | None = None  # the message once the cap was hit, until the next case

    def new_case(self) -> None:
        self.taken = 0
        self.spent = None

    def take(self, url: str) -> None:
        if self.cap is not None and self.taken >= self.cap:
            self.spent = (f"{url}/screenshot: this case took its {self.cap} screenshots (option max_screenshots), "
                          "the bound on a guest whose screenshot endpoint may leak an X connection per call "
                          "(OSWorld's); raise it if the guest's X server has slots to spare (its reset restarts "
                          "it), or settle less (a shorter --retrace-settle)")
            raise ScreenshotBudgetSpent(self.spent)
        self.taken += 1
        self.total += 1


def parse_budget(mode: object, cap: object) -> tuple[str, int]:
    """Options screenshot_budget (auto, on, off) and max_screenshots (a positive integer), checked."""
    if isinstance(mode, bool):  # YAML (and so --retrace-env-option) reads a bare on/off as a boolean
        mode = "on" if mode else "off"
    if mode not in MODES:
        raise ValueError(f"screenshot_budget: {mode!r} is not one of {', '.join(MODES)}")
    if isinstance(cap, str) and cap.strip().isdigit():
        cap = int(cap)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_screenshots: a positive number of screenshots per case, got {cap!r}")
    return str(mode), cap


__all__ = ["DEFAULT_MAX", "MODES", "Backoff", "Budget", "ScreenshotBudgetSpent", "parse_budget"]
