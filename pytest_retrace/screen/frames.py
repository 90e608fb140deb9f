"""Screen frames: the default screen size, the rectangle type (x, y, w, h) that masks and boxes use, and the two
pixel operations every comparison shares: blanking masked rectangles and counting changed pixels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only methods of the frames are called: the guest imports DEFAULT_SCREEN without numpy
    import numpy as np

DEFAULT_SCREEN = (1280, 800)  # width, height: every built-in case's screen, and every environment's default
Rect = tuple[int, int, int, int]  # x, y, w, h


def park_point(size: tuple[int, int]) -> tuple[int, int]:
    """Where every reset leaves the pointer: the bottom-right corner, where hover effects never depend on the
    previous case, one pixel in on each axis. The corner pixel itself is one of pyautogui's fail-safe points:
    a task's own ``python -c "import pyautogui; ..."`` step (OSWorld's configs and postconfigs, 186 of its Linux
    tasks) raised FailSafeException there before the pointer had moved."""
    return size[0] - 2, size[1] - 2


def apply_masks(frame: np.ndarray, masks: Sequence[Rect], fill: int = 0) -> np.ndarray:
    if not masks:
        return frame
    out = frame.copy()
    for x, y, w, h in masks:
        out[y : y + h, x : x + w] = fill
    return out


def changed_mask(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where two frames of one size differ: an H x W boolean map (a pixel differs if any channel does).

    The channels are or-ed one by one: ``(a != b).any(axis=2)`` reduces along a 3-wide axis and takes 14 ms
    on a 1280x800 frame, this 1.2 ms (measured); settling and every state check compare frames often."""
    diff = a != b
    if diff.ndim != 3:
        return diff
    out = diff[..., 0].copy()
    for channel in range(1, diff.shape[2]):
        out |= diff[..., channel]
    return out


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    import numpy as np

    if a.shape == b.shape and np.array_equal(a, b):
        return 0  # the common answer, in 0.2 ms
    return int(changed_mask(a, b).sum())
