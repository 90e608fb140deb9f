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


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    diff = a != b
    return int(diff.any(axis=2).sum() if diff.ndim == 3 else diff.sum())
