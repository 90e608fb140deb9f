"""Screenshots as a model sees them, and its coordinates back on the real screen.

Three sizes matter: the **screen** (what the desktop is), the **image** sent (the screen scaled down to the
provider's limits), and the **coordinate space** the model answers in — the image itself for Claude and
OpenAI, Qwen2.5-VL's ``smart_resize`` of it for UI-TARS, a 0–1000 grid for Qwen3-VL. A model's point is
the centre of one coordinate cell; it maps to the screen pixel that holds that centre, so the mapping is
exact for integer ratios and never leaves the screen. A point outside the coordinate space is the model's
mistake (an :class:`ActionError`), not something to clamp silently.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from pytest_retrace.actions import Action, ActionError

CoordinateSpace = Literal["image", "smart-resize", "relative-1000"]


def fit(size: tuple[int, int], max_long_edge: int | None = None, max_pixels: int | None = None) -> tuple[int, int]:
    """The largest size with `size`'s aspect ratio within both limits (never upscaled): Anthropic's rule
    scale = min(1, long_edge_limit / long_edge, sqrt(pixel_limit / pixels))."""
    w, h = size
    scale = 1.0
    if max_long_edge:
        scale = min(scale, max_long_edge / max(w, h))
    if max_pixels:
        scale = min(scale, math.sqrt(max_pixels / (w * h)))
    return max(1, math.floor(w * scale)), max(1, math.floor(h * scale))


def smart_resize(size: tuple[int, int], factor: int = 28, min_pixels: int = 100 * 28 * 28,
                 max_pixels: int = 16384 * 28 * 28) -> tuple[int, int]:
    """Qwen2.5-VL's resize (the image processor UI-TARS-1.5 and Qwen2.5-VL see): both sides multiples of
    `factor`, the area within [min_pixels, max_pixels], the aspect ratio kept as closely as that allows."""
    w, h = size
    h_bar, w_bar = max(factor, round(h / factor) * factor), max(factor, round(w / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h_bar, w_bar = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar, w_bar = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return w_bar, h_bar


@dataclass(frozen=True)
class Scaler:
    screen: tuple[int, int]
    image: tuple[int, int]  # the size of the PNG sent
    space: tuple[int, int]  # the model's coordinate space

    @classmethod
    def build(cls, screen: tuple[int, int], *, max_long_edge: int | None = None, max_pixels: int | None = None,
              coordinates: CoordinateSpace = "image") -> Scaler:
        image = fit(screen, max_long_edge, max_pixels)
        space = {"image": image, "smart-resize": smart_resize(image), "relative-1000": (1000, 1000)}[coordinates]
        return cls(tuple(screen), image, space)  # type: ignore[arg-type]

    # -- points --------------------------------------------------------------------------------------
    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        """A point in the model's coordinate space -> the screen pixel holding its cell's centre."""
        (sw, sh), (cw, ch) = self.screen, self.space
        for value, limit, axis in ((x, cw, "x"), (y, ch, "y")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ActionError(f"{axis} must be a number, got {value!r}")
            if not 0 <= value < limit:
                raise ActionError(f"{axis}={value!r} is outside the {cw}x{ch} screenshot the model was given")
        return min(sw - 1, math.floor((x + 0.5) * sw / cw)), min(sh - 1, math.floor((y + 0.5) * sh / ch))

    def to_model(self, x: int, y: int) -> tuple[int, int]:
        """A screen pixel -> the model's coordinate cell holding its centre (for showing past actions)."""
        (sw, sh), (cw, ch) = self.screen, self.space
        return min(cw - 1, math.floor((x + 0.5) * cw / sw)), min(ch - 1, math.floor((y + 0.5) * ch / sh))

    def action_to_screen(self, action: Action) -> Action:
        return self._map(action, self.to_screen)

    def action_to_model(self, action: Action) -> Action:
        return self._map(action, self.to_model)

    @staticmethod
    def _map(action: Action, f) -> Action:  # noqa: ANN001 - one of the two point maps above
        changes = {}
        if action.x is not None:
            changes["x"], changes["y"] = f(action.x, action.y)
        if action.x2 is not None:
            changes["x2"], changes["y2"] = f(action.x2, action.y2)
        return replace(action, **changes) if changes else action

    # -- pixels --------------------------------------------------------------------------------------
    def resize(self, screenshot: np.ndarray) -> np.ndarray:
        if (screenshot.shape[1], screenshot.shape[0]) == self.image:
            return screenshot
        from PIL import Image

        return np.asarray(Image.fromarray(screenshot).resize(self.image, Image.Resampling.LANCZOS))

    def png(self, screenshot: np.ndarray) -> bytes:
        return encode_png(self.resize(screenshot))


def encode_png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    # level 1: a 1280x800 screenshot in ~15 ms instead of ~60 ms, for a few percent more bytes
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + b64(png)


def crop_zoom(screenshot: np.ndarray, region: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """Claude's zoom: the screen region (x0, y0, x1, y1) scaled up to fill `size` (aspect kept)."""
    from PIL import Image

    x0, y0, x1, y1 = region
    crop = Image.fromarray(screenshot[y0:y1, x0:x1])
    w, h = crop.size
    scale = min(size[0] / w, size[1] / h)
    return np.asarray(crop.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS))
