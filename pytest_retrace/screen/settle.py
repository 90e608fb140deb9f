"""Wait until the screen is stable after an action, instead of sleeping a fixed time.

The paper applies a fixed 10 s post-action settle window (``mode="fixed"``, ``--retrace-settle-mode fixed``);
sleeping 10 s after every action makes a case take minutes. The adaptive mode (the default) polls screenshots:

1. it waits for the action's effect to *start*: the screen differs from the one grabbed before the action,
   for at most ``react`` seconds (an action with no visible effect costs that much);
2. then for ``quiet`` seconds without a change,

capped at ``timeout`` (the paper's window, ``--retrace-settle``). Without step 1, quiet alone declared a
screen stable before a slow app reacted: at -n 16 a menu took longer than 0.3 s to open, and the next click
of a replayed perturbation landed in the document instead of the menu.

A desktop that can tell when something drew (``Changes``: X DAMAGE, envs/damage.py) spares the grabs of a
screen nobody draws on: the loop then grabs only after drawing, and once more before declaring it settled.

Whether the screen really settled before the cap is part of the result (``Settled.stable``): a replayed
ground-truth step that did not settle is an infrastructure error, and R_O is computed on a settled screen only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from pytest_retrace.screen.frames import Rect, apply_masks, changed_pixels

MODES = ("adaptive", "fixed")
SIGNALS = ("damage", "poll")


@dataclass(frozen=True)
class SettleConfig:
    timeout: float = 10.0  # cap: an app that animates forever must not hang the run
    quiet: float = 0.3  # how long the screen must stay unchanged
    react: float = 1.0  # adaptive: how long to wait for an action's effect to start showing
    interval: float = 0.03  # polling period (a 1280x800 grab costs ~1-2 ms)
    tolerance: int = 0  # changed pixels still counted as "unchanged" (e.g. a blinking text cursor)
    mode: Literal["adaptive", "fixed"] = "adaptive"
    # adaptive: "damage" grabs only after the display reports drawing, where the environment can tell (xvfb);
    # "poll" grabs every `interval` (what every environment can do; the same verdicts at more CPU)
    signal: Literal["damage", "poll"] = "damage"

    def at_least(self, quiet: float | None) -> SettleConfig:
        """This config with a task's longer quiet window (a task never shortens the run's)."""
        return self if quiet is None or quiet <= self.quiet else replace(self, quiet=quiet)


@dataclass(frozen=True)
class Settled:
    seconds: float
    stable: bool  # False when the cap was hit while the screen still changed
    frame: np.ndarray  # the last frame grabbed (RGB): callers reuse it as the observation


def _differ(a: np.ndarray, b: np.ndarray, tolerance: int) -> bool:
    if a.shape != b.shape:
        return True
    return changed_pixels(a, b) > tolerance if tolerance else not np.array_equal(a, b)


class Changes(Protocol):
    """Tells whether anything drew on the screen, so settling need not grab a screen nobody touched."""

    def clear(self) -> None:
        """Forget the drawing so far (called just before a grab)."""

    def wait(self, timeout: float) -> bool:
        """True once anything drew since ``clear``; False after ``timeout`` seconds without drawing."""


def wait_stable(grab: Callable[[], np.ndarray], cfg: SettleConfig, masks: Sequence[Rect] = (),
                before: np.ndarray | None = None, changes: Changes | None = None) -> Settled:
    """Wait until the screen is stable. ``before``: the screen grabbed just before the action, whose effect
    the adaptive mode waits to start (None: nothing is expected to happen, e.g. after a reset). ``changes``:
    grab only after drawing instead of every ``interval``; the verdicts are the same, the CPU is not."""
    if cfg.mode == "fixed":
        return _fixed(grab, cfg, masks)
    start = time.monotonic()

    def fresh() -> np.ndarray:
        if changes is not None:
            changes.clear()
        return grab()

    last = apply_masks(frame := fresh(), masks)
    started = before is None or _differ(last, apply_masks(before, masks), cfg.tolerance)
    quiet_since = start
    checked = changes is None  # with a change signal: whether the last frame was grabbed after the quiet window
    while True:
        now = time.monotonic()
        quiet = now - quiet_since
        if quiet >= cfg.quiet and (started or quiet >= cfg.react):
            if checked:
                return Settled(now - start, True, frame)
            # no drawing was reported for the whole window: one grab confirms it (and would catch drawing the
            # signal missed) before the screen counts as settled
            drew = True
        elif now - start >= cfg.timeout:
            # an action without visible effect, still quiet at the cap (react >= timeout): settled all the same
            return Settled(now - start, quiet >= cfg.quiet, frame)
        elif changes is None:
            time.sleep(cfg.interval)
            drew = True
        else:
            window = cfg.quiet if started else max(cfg.quiet, cfg.react)
            drew = changes.wait(min(quiet_since + window, start + cfg.timeout) - now)
            if drew:
                time.sleep(cfg.interval)  # a burst of drawing: grab once it has had time to finish
        if not drew:
            continue
        frame = fresh()
        checked = changes is None or time.monotonic() - quiet_since >= cfg.quiet
        current = apply_masks(frame, masks)
        if _differ(current, last, cfg.tolerance):
            started = True
            quiet_since = time.monotonic()
            checked = changes is None
            last = current


def _fixed(grab: Callable[[], np.ndarray], cfg: SettleConfig, masks: Sequence[Rect]) -> Settled:
    """The paper's fixed window: sleep ``timeout`` seconds, then check that the screen holds still for
    ``quiet`` seconds (so ``stable`` means the same in both modes)."""
    start = time.monotonic()
    time.sleep(cfg.timeout)
    first = apply_masks(grab(), masks)
    time.sleep(cfg.quiet)
    frame = grab()
    return Settled(time.monotonic() - start, not _differ(apply_masks(frame, masks), first, cfg.tolerance), frame)
