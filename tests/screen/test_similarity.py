"""R_O's SSIM: exactly skimage's structural_similarity without masks; masks really ignore what they cover."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image
from skimage.metrics import structural_similarity

from pytest_retrace.screen.frames import apply_masks, changed_pixels
from pytest_retrace.screen.similarity import diff_image, differing_pixels, screen_diff, ssim, ssim_map
from tests.helpers import REPO

CASES = REPO / "cases"
PAIRS = sorted(p for p in CASES.glob("*/*") if (p / "target.png").is_file() and (p / "error.png").is_file())


def load(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def skimage_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """The reference: skimage's own mean, on ITU-R 601 luma in float64, data_range 255, default window."""

    def gray(rgb: np.ndarray) -> np.ndarray:
        f = rgb.astype(np.float64)
        return f[..., 0] * 0.299 + f[..., 1] * 0.587 + f[..., 2] * 0.114

    return float(structural_similarity(gray(a), gray(b), data_range=255))


def screen(seed: int, size: tuple[int, int] = (120, 160)) -> np.ndarray:
    """A screenshot-like frame: flat background, a title bar, a few 'windows' and text-like noise."""
    rng = np.random.default_rng(seed)
    h, w = size
    img = np.full((h, w, 3), 235, dtype=np.uint8)
    img[:12] = (40, 60, 90)
    for _ in range(4):
        y, x = int(rng.integers(12, h - 20)), int(rng.integers(0, w - 30))
        img[y : y + 18, x : x + 28] = rng.integers(0, 256, 3, dtype=np.uint8)
    text = rng.random((h, w)) < 0.04
    img[text] = 0
    return img


@pytest.mark.skipif(not PAIRS, reason="no case screenshots in the checkout")
def test_equals_skimage_on_every_suite_pair() -> None:
    differing = 0
    for case in PAIRS:
        target, error = load(case / "target.png"), load(case / "error.png")
        assert ssim(error, target) == skimage_ssim(error, target), case.name
        differing += not np.array_equal(target, error)
    assert differing  # the suite's errors do show on screen, so the comparison above computed real maps


def test_equals_skimage_on_synthetic_screens() -> None:
    base = screen(0)
    for seed in range(1, 6):
        other = screen(seed)
        assert ssim(base, other) == skimage_ssim(base, other)
    edited = base.copy()
    edited[40:52, 30:90] = 255  # an erased line of text
    assert ssim(base, edited) == skimage_ssim(base, edited) < 1.0
    edge = base.copy()
    edge[:, -2:] = 0  # a change only in the 3 px border skimage crops: still seen through the windows
    value = ssim(base, edge)
    assert value == skimage_ssim(base, edge) < 1.0


def test_differs_from_the_full_map_mean() -> None:
    """The old score (mean of the whole map, border included) is not what skimage reports."""
    a, b = screen(0), screen(7)
    smap = ssim_map(a, b)
    assert smap is not None and smap.shape == a.shape[:2]
    assert float(smap.mean()) != ssim(a, b)
    assert float(smap[3:-3, 3:-3].mean()) == pytest.approx(ssim(a, b), abs=1e-12)


def test_identical_frames_score_exactly_one() -> None:
    a = screen(3)
    assert ssim(a, a.copy()) == 1.0
    assert skimage_ssim(a, a) == 1.0  # the shortcut returns what skimage would
    assert ssim_map(a, a.copy()) is None


def test_size_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="differ in size: 160x120 vs 150x120"):
        ssim(screen(0), screen(0)[:, :150])
    with pytest.raises(ValueError, match="differ in size"):
        ssim_map(screen(0), screen(0)[:100])


MASK = (50, 40, 30, 20)  # x, y, w, h


def test_changes_inside_a_mask_do_not_change_the_score() -> None:
    target, recovered = screen(0), screen(0)
    recovered[10:15, 100:140] = 0  # a real difference outside the mask
    baseline = ssim(recovered, target, [MASK])
    assert baseline < 1.0
    x, y, w, h = MASK
    for seed in range(3):
        noisy = recovered.copy()
        noisy[y : y + h, x : x + w] = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
        assert ssim(noisy, target, [MASK]) == baseline  # bit-equal, not approximately
        clock = target.copy()
        clock[y : y + h, x : x + w] = 255 - clock[y : y + h, x : x + w]
        assert ssim(noisy, clock, [MASK]) == baseline


def test_only_masked_changes_score_one() -> None:
    target = screen(1)
    x, y, w, h = MASK
    changed = target.copy()
    changed[y : y + h, x : x + w] = 17
    assert ssim(changed, target) < 1.0
    assert ssim(changed, target, [MASK]) == 1.0


def test_masked_mean_leaves_out_windows_touching_a_mask() -> None:
    """The documented rule: skimage's map over the interior minus the masks grown by the 3 px window radius."""
    target, recovered = screen(2), screen(2)
    recovered[70:80, 20:60] = 255
    x, y, w, h = MASK
    smap = ssim_map(recovered, target, [MASK])
    assert smap is not None
    keep = np.zeros(smap.shape, dtype=bool)
    keep[3:-3, 3:-3] = True
    keep[y - 3 : y + h + 3, x - 3 : x + w + 3] = False
    assert ssim(recovered, target, [MASK]) == float(smap[keep].mean(dtype=np.float64))


def test_counted_pixels_do_not_see_the_blanked_mask() -> None:
    """Every pixel in the masked mean has the local SSIM skimage computes on the unmasked frames: the blank
    rectangle (identical in both frames) cannot flatter a difference right beside it."""
    target = np.full((100, 100, 3), 200, dtype=np.uint8)
    target[::4] = 30  # text-like stripes
    recovered = target.copy()
    recovered[45:55, 61:65] = 255  # a difference starting 1 px right of the mask
    mask = (40, 40, 20, 20)
    unmasked = ssim_map(recovered, target)
    assert unmasked is not None
    keep = np.zeros(unmasked.shape, dtype=bool)
    keep[3:-3, 3:-3] = True
    keep[37:63, 37:63] = False
    assert ssim(recovered, target, [mask]) == pytest.approx(float(unmasked[keep].mean()), abs=1e-12)
    # Why those pixels are left out: next to the mask the blanked map is not skimage's value on the screens.
    blanked = ssim_map(recovered, target, [mask])
    assert blanked is not None
    ring = (slice(45, 55), slice(60, 63))
    assert not np.allclose(blanked[ring], unmasked[ring])


def test_masks_leaving_no_window_are_an_error() -> None:
    a = screen(0)
    b = a.copy()
    b[116:, :] = 0  # differs only in the 5 rows the mask leaves: no 7x7 window fits there
    with pytest.raises(ValueError, match="leave no 7x7 window"):
        ssim(a, b, [(0, 0, 160, 115)])
    assert ssim(a, b, [(0, 0, 160, 120)]) == 1.0  # everything masked: nothing differs


# -- pixel-exact comparison (the reconstruction check, settling, the failure pictures) -----------------------------

_frames = st.tuples(st.integers(1, 12), st.integers(1, 12)).flatmap(
    lambda hw: st.tuples(*[arrays(np.uint8, (*hw, 3), elements=st.integers(0, 2))] * 2))
_masks = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 6), st.integers(0, 6)),
                  max_size=3)


@settings(max_examples=300, deadline=None)
@given(_frames, _masks)
def test_a_pixel_differs_when_any_of_its_channels_does_outside_the_masks(frames, masks) -> None:
    a, b = frames
    by_definition = (apply_masks(a, masks) != apply_masks(b, masks)).any(axis=2)  # the slow, obvious form
    assert differing_pixels(a, b, masks) == int(by_definition.sum())
    assert changed_pixels(apply_masks(a, masks), apply_masks(b, masks)) == int(by_definition.sum())
    diff = screen_diff(a, b, masks)
    assert diff.pixels == int(by_definition.sum())
    if diff.bbox is None:
        assert not by_definition.any()
    else:
        x, y, w, h = diff.bbox
        ys, xs = np.nonzero(by_definition)
        assert (x, y, x + w - 1, y + h - 1) == (xs.min(), ys.min(), xs.max(), ys.max())
    red = (diff_image(a, b) == (255, 0, 0)).all(axis=2)
    assert (red | ~(a != b).any(axis=2)).all() and red[(a != b).any(axis=2)].all()


def test_a_single_channel_change_is_a_changed_pixel() -> None:
    a = np.zeros((800, 1280, 3), np.uint8)
    for channel in range(3):
        b = a.copy()
        b[799, 1279, channel] = 1
        assert changed_pixels(a, b) == differing_pixels(a, b) == 1
        assert differing_pixels(a, b, [(1270, 790, 10, 10)]) == 0
