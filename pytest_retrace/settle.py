"""Wait until the screen is stable after an action, instead of sleeping a fixed time.

The paper applies a 10 s post-action settle window; sleeping 10 s after every action would make a
case take minutes.  We poll screenshots and call the screen settled once it has not changed (outside
masked regions) for `quiet` seconds, capped at `timeout` (the paper's window, `--retrace-settle`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Rect = tuple[int, int, int, int]


@dataclass(frozen=True)
class SettleConfig:
    timeout: float = 10.0  # cap: an app that animates forever must not hang the run
    quiet: float = 0.3  # how long the screen must stay unchanged
    interval: float = 0.03  # polling period (a 1280x800 grab costs ~1-2 ms)
    tolerance: int = 0  # changed pixels still counted as "unchanged" (e.g. a blinking text cursor)


@dataclass(frozen=True)
class Settled:
    seconds: float
    stable: bool  # False when the cap was hit
    frame: np.ndarray  # the last frame grabbed (RGB): callers reuse it as the observation


def apply_masks(frame: np.ndarray, masks: Sequence[Rect], fill: int = 0) -> np.ndarray:
    if not masks:
        return frame
    out = frame.copy()
    for x, y, w, h in masks:
        out[y : y + h, x : x + w] = fill
    return out


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    diff = a != b
    return int(diff.any(axis=2).sum() if diff.ndim == 3 else diff.sum())


def wait_stable(grab: Callable[[], np.ndarray], cfg: SettleConfig, masks: Sequence[Rect] = ()) -> Settled:
    start = time.monotonic()
    last = apply_masks(frame := grab(), masks)
    quiet_since = start
    while True:
        now = time.monotonic()
        if now - quiet_since >= cfg.quiet:
            return Settled(now - start, True, frame)
        if now - start >= cfg.timeout:
            return Settled(now - start, False, frame)
        time.sleep(cfg.interval)
        frame = grab()
        current = apply_masks(frame, masks)
        if cfg.tolerance:
            changed = changed_pixels(current, last) > cfg.tolerance
        else:
            changed = not np.array_equal(current, last)
        if changed:
            quiet_since = time.monotonic()
            last = current
