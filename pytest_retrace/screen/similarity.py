"""How alike two screenshots are: SSIM with masks (R_O, the observation half of the oracle R = R_TC ∧ R_O),
pixel-exact comparison (the harness's own reconstruction check), and images that show where they differ.

R_O follows the paper: SSIM(recovered screenshot, recorded target) on grayscale images (ITU-R 601 luma)
with data_range 255 and skimage's default 7x7 uniform window, threshold 0.99 by default.  Without masks
the score *is* ``skimage.metrics.structural_similarity(gray_a, gray_b, data_range=255)``: the mean of the
local-SSIM map over the pixels whose whole window lies inside the image (skimage crops a
``(win_size - 1) // 2`` = 3 px border, whose windows would reach into the reflected padding).
Masked rectangles (regions that legitimately change, such as a clock) extend that rule: they are blanked
in both images, and the mean leaves out every pixel whose window touches a mask, i.e. each mask grown by
3 px on every side (see ``_kept``).  So a counted pixel's local SSIM is computed from unmasked pixels
only, exactly as skimage would compute it, and nothing inside a mask can change the score.
R_TC is computed by the replay (replay/scoring.py): the evaluator's verdict after the remaining gt actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_retrace.screen.frames import Rect, apply_masks, changed_mask, changed_pixels


def _gray(rgb: np.ndarray) -> np.ndarray:
    # ITU-R 601 luma, the same weights PIL's convert("L") uses
    rgb = rgb.astype(np.float64)
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


_WIN_SIZE = 7  # skimage's default window for structural_similarity (uniform filter, no Gaussian weights)
_PAD = (_WIN_SIZE - 1) // 2  # skimage leaves this border out of its mean


def ssim(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> float:
    """SSIM of two RGB screenshots (R_O).

    Without masks: exactly ``structural_similarity(gray(a), gray(b), data_range=255)``.  With masks: the
    mean of the same SSIM map over the pixels ``_kept`` leaves, so a masked region cannot affect the score.
    Identical frames (after masking) score 1.0 without computing the map: skimage gives exactly 1.0 for them
    too (every local term is x/x).  Raises ValueError for screenshots of different sizes, and for masks that
    leave no complete window to compare."""
    result = _ssim(a, b, masks)
    if result is None:
        return 1.0  # identical frames, the common case for a correct recovery
    mean, smap = result
    if not masks:
        return mean  # skimage's own value, not recomputed
    keep = _kept(smap.shape, masks)
    if not keep.any():
        raise ValueError(f"masks {list(masks)} leave no {_WIN_SIZE}x{_WIN_SIZE} window outside them to compare")
    return float(smap[keep].mean(dtype=np.float64))


def _kept(shape: tuple[int, ...], masks: Sequence[Rect]) -> np.ndarray:
    """The pixels the mean runs over: skimage's cropped interior, minus every pixel whose window overlaps a mask.

    Why not just the unmasked pixels: a pixel next to a mask has part of the (blanked) mask in its window.
    The blank is identical in both images, so it pulls that pixel's local SSIM towards 1 and hides a real
    difference beside a mask; where a mask meets content, it adds an edge neither screen shows.  Dropping
    those windows treats a mask like the image border, which skimage already leaves out for the same reason.
    The masked pixels themselves are still blanked before filtering, so even rounding in the running-sum
    filter cannot carry their content into a counted pixel: changes inside a mask leave the score bit-equal.
    """
    height, width = shape[:2]
    keep = np.zeros((height, width), dtype=bool)
    keep[_PAD : height - _PAD, _PAD : width - _PAD] = True
    for x, y, w, h in masks:
        keep[max(0, y - _PAD) : max(0, y + h + _PAD), max(0, x - _PAD) : max(0, x + w + _PAD)] = False
    return keep


def _ssim(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect]) -> tuple[float, np.ndarray] | None:
    """skimage's (mean SSIM, SSIM map) of the masked grayscale frames, or None for identical frames."""
    from skimage.metrics import structural_similarity

    if a.shape != b.shape:
        raise ValueError(f"screenshots differ in size: {a.shape[1]}x{a.shape[0]} vs {b.shape[1]}x{b.shape[0]}")
    ma, mb = apply_masks(a, masks), apply_masks(b, masks)
    if np.array_equal(ma, mb):
        return None  # identical pixels: neither the grayscale conversions (24 MB of float64 each) nor the map
    ga, gb = _gray(ma), _gray(mb)
    if np.array_equal(ga, gb):
        return None  # skip the expensive map
    mean, smap = structural_similarity(ga, gb, data_range=255, win_size=_WIN_SIZE, full=True)
    return float(mean), smap


def ssim_map(a: np.ndarray, b: np.ndarray, masks: Sequence[Rect] = ()) -> np.ndarray | None:
    """The local SSIM of every pixel (masked regions blanked in both), or None for identical frames.

    For pictures (the heatmap): it covers the whole frame, including the border and mask-adjacent pixels
    that :func:`ssim` leaves out of its mean."""
    result = _ssim(a, b, masks)
    return None if result is None else result[1]


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
    return changed_pixels(apply_masks(a, masks), apply_masks(b, masks))


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
    mask = changed_mask(apply_masks(a, masks), apply_masks(b, masks))
    if not mask.any():
        return ScreenDiff(0, None)
    ys, xs = np.nonzero(mask)
    x0, y0 = int(xs.min()), int(ys.min())
    return ScreenDiff(int(mask.sum()), (x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1))


def diff_image(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b dimmed, with differing pixels painted red: attached to failure reports."""
    out = (b.astype(np.uint16) // 3).astype(np.uint8)
    out[changed_mask(a, b)] = (255, 0, 0)
    return out
