"""A guest's ``GET /screenshot?format=rgb`` reply as an RGB array: the raw pixels ``retrace guest`` answers
(``application/octet-stream``, sized by its ``X-Screen-Width`` and ``X-Screen-Height`` headers), or the PNG
any other server answers (OSWorld's Flask route ignores the query). Asking for both in one request spares a
round trip to find out which guest it is; the reply's content type says which it was.

A guest's reply is untrusted: raw pixels are taken only with both sizes present, decimal, at most
`MAX_SIDE` each, and a body of exactly width * height * 3 bytes; anything else is an EnvError naming the URL
and what was wrong, never a reshape error or a huge allocation.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from pytest_retrace.envs import EnvError

if TYPE_CHECKING:
    import numpy as np

# The wire format, which guest/app.py answers with. This module imports numpy only when it decodes: the guest
# imports these names inside a container whose venv has no numpy.
RAW_TYPE = "application/octet-stream"
WIDTH_HEADER = "X-Screen-Width"
HEIGHT_HEADER = "X-Screen-Height"
MAX_SIDE = 16384  # pixels of a screen's width or height: beyond any display (8K is 7680x4320)
MAX_BODY = 256 * 1024 * 1024  # bytes read of one screenshot: a PNG, or raw pixels up to 8K and beyond
_DECIMAL = re.compile(r"[0-9]{1,5}")


def screen_array(body: bytes, content_type: str, headers: dict[str, str], where: str) -> np.ndarray:
    """The (height, width, 3) uint8 RGB array of a /screenshot reply from `where` (the URL asked)."""
    if content_type.split(";", 1)[0].strip().lower() == RAW_TYPE:
        return raw_array(body, headers, where)
    return png_array(body, where)


def raw_array(body: bytes, headers: dict[str, str], where: str) -> np.ndarray:
    """Raw RGB rows, sized by the headers (names lower-cased); read-only, as a decoded PNG's array."""
    import numpy as np

    width = _side(headers, WIDTH_HEADER, where)
    height = _side(headers, HEIGHT_HEADER, where)
    if len(body) != width * height * 3:
        raise EnvError(f"{where}: {len(body)} bytes of raw RGB, not {width}x{height}x3 = {width * height * 3}")
    return np.frombuffer(body, dtype=np.uint8).reshape(height, width, 3)


def _side(headers: dict[str, str], name: str, where: str) -> int:
    value = headers.get(name.lower())
    if value is None:
        raise EnvError(f"{where}: raw RGB without its {name} header")
    value = value.strip()
    if not _DECIMAL.fullmatch(value) or not 0 < int(value) <= MAX_SIDE:
        raise EnvError(f"{where}: raw RGB with {name} {value[:40]!r}, not a size from 1 to {MAX_SIDE} pixels")
    return int(value)


def png_array(body: bytes, where: str) -> np.ndarray:
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(body)) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise EnvError(f"{where}: not an image: {exc}") from None
