"""How alike two screenshots are: SSIM with masks (R_O, the observation half of the oracle R = R_TC ∧ R_O),
pixel-exact comparison (the harness's own reconstruction check), and images that show where they differ.

R_O follows the paper: SSIM(recovered screenshot, recorded target) on grayscale images with
data_range 255, threshold 0.99 by default.  Masked rectangles (regions that legitimately change, such
as a clock) are blanked in both images and left out of the mean of the SSIM map.
R_TC is computed by replay (replay.py): the evaluator's verdict after the remaining gt actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .settle import Rect, apply_masks


def _gray(rgb: np.ndarray) -> np.ndarray:
    # ITU-R 601 luma, the same weights PIL's convert("L") uses
    rgb = rgb.astype(np.float64)
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def ssim(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> float:
    """Mean SSIM of two RGB screenshots over their unmasked pixels."""
    smap = ssim_map(a, b, masks)
    if smap is None:
        return 1.0  # identical frames, the common case for a correct recovery
    if masks:
        keep = np.ones(smap.shape, dtype=bool)
        for x, y, w, h in masks:
            keep[y : y + h, x : x + w] = False
        return float(smap[keep].mean())
    return float(smap.mean())


def ssim_map(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> np.ndarray | None:
    """The local SSIM of every pixel (masked regions blanked in both), or None for identical frames."""
    from skimage.metrics import structural_similarity

    if a.shape != b.shape:
        raise ValueError(f"screenshots differ in size: {a.shape[1]}x{a.shape[0]} vs {b.shape[1]}x{b.shape[0]}")
    ga, gb = _gray(apply_masks(a, masks)), _gray(apply_masks(b, masks))
    if np.array_equal(ga, gb):
        return None  # skip the expensive map
    _, smap = structural_similarity(ga, gb, data_range=255, full=True)
    return smap


def ssim_heatmap(target: np.ndarray, recovered: np.ndarray, masks: Sequence[Rect] = ()) -> np.ndarray:
    """The recovered screen dimmed to gray, red where its local SSIM to the target is low (1 - SSIM, so a
    reader sees what R_O saw, not just which pixels changed); masked regions, which R_O ignores, in blue."""
    gray = (_gray(recovered) / 3).astype(np.uint8)
    out = np.stack([gray, gray, gray], axis=2)
    smap = ssim_map(target, recovered, masks)
    if smap is not None:
        dissimilar = np.clip(1.0 - smap, 0.0, 1.0)
        red = np.clip(dissimilar * 4, 0.0, 1.0)  # 1 - SSIM of 0.25 and above is full red: small drops stay visible
        out[..., 0] = np.maximum(out[..., 0], (red * 255).astype(np.uint8))
    for x, y, w, h in masks:
        out[y : y + h, x : x + w] = (0, 0, 96)
    return out


def differing_pixels(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> int:
    """Count of unmasked pixels that differ: the harness's own reconstruction check.

    Not SSIM: on a mostly blank 1280x800 desktop two different documents score SSIM > 0.99 (measured:
    0.9946 for two different mousepad files), so a 0.99 SSIM could not tell a replay desync from a
    faithful replay. The xvfb desktop is deterministic, so replays are compared pixel for pixel."""
    if a.shape != b.shape:
        return a.shape[0] * a.shape[1]
    return int((apply_masks(a, masks) != apply_masks(b, masks)).any(axis=2).sum())


@dataclass(frozen=True)
class ScreenDiff:
    """Where two screenshots differ: bounding box (x, y, w, h) and the count of differing pixels."""

    pixels: int
    bbox: Rect | None

    def describe(self) -> str:
        if not self.bbox:
            return "screens are pixel-identical"
        x, y, w, h = self.bbox
        return f"{self.pixels} px differ within x={x}..{x + w - 1}, y={y}..{y + h - 1}"


def screen_diff(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> ScreenDiff:
    mask = (apply_masks(a, masks) != apply_masks(b, masks)).any(axis=2)
    if not mask.any():
        return ScreenDiff(0, None)
    ys, xs = np.nonzero(mask)
    x0, y0 = int(xs.min()), int(ys.min())
    return ScreenDiff(int(mask.sum()), (x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1))


def diff_image(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b dimmed, with differing pixels painted red: attached to failure reports."""
    out = (b.astype(np.uint16) // 3).astype(np.uint8)
    mask = (a != b).any(axis=2)
    out[mask] = (255, 0, 0)
    return out
