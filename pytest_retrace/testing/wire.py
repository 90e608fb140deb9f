"""What the loopback server and every provider's checks and replies share: the provider names, the `Request`
the server received and the `Reply` it sends, `WireError` (a request the real API would refuse) with the
provider-shaped error bodies, fresh ids, and the PNG data-URL decoding every provider's image check uses."""

from __future__ import annotations

import base64
import binascii
import io
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

ANTHROPIC = "anthropic"
OPENAI_RESPONSES = "openai-responses"
OPENAI_CHAT = "openai-chat"
PROVIDERS = (ANTHROPIC, OPENAI_RESPONSES, OPENAI_CHAT)


def new_id(prefix: str, n: int = 24) -> str:
    """A fresh id in the provider's style: `new_id("msg_")` -> `msg_3f9c...` (n hex digits)."""
    return f"{prefix}{uuid.uuid4().hex[:n]}"


@dataclass
class Request:
    """One request the server received (rejected ones too: then `error` holds the message it answered)."""

    provider: str  # "anthropic" | "openai-responses" | "openai-chat"
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict
    index: int  # 0-based count of requests to this provider so far (rejected ones count)
    images: list[tuple[int, int]] = field(default_factory=list)  # (width, height) of every image, in order
    query: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the strict check's message when the server rejected the request

    @property
    def betas(self) -> list[str]:
        """The `anthropic-beta` header's values."""
        return [b.strip() for b in self.headers.get("anthropic-beta", "").split(",") if b.strip()]


def error_body(provider: str, status: int, message: str, *, param: str | None = None) -> dict:
    """The error body the provider's API sends for `status` (the SDKs read their message from it)."""
    if provider == ANTHROPIC:
        kinds = {
            400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
            403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
            500: "api_error", 504: "timeout_error", 529: "overloaded_error",
        }  # fmt: skip
        kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": new_id("req_")}
    if provider in (OPENAI_RESPONSES, OPENAI_CHAT, "openai"):
        code = None
        if status == 429:
            kind, code = "requests", "rate_limit_exceeded"
        elif status == 401:
            kind, code = "invalid_request_error", "invalid_api_key"
        elif status >= 500:
            kind = "server_error"
        else:
            kind = "invalid_request_error"
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    raise ValueError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")


@dataclass
class Reply:
    """What the server answers: a JSON body (None: an empty body), a status, extra headers, a delay."""

    body: dict | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (await asyncio.sleep: other requests go on)

    @classmethod
    def error(
        cls, provider: str, status: int, message: str, headers: dict | None = None, delay: float = 0.0
    ) -> Reply:
        """A provider-shaped error reply, e.g. `Reply.error("anthropic", 429, "slow down", {"retry-after": "1"})`."""
        return cls(error_body(provider, status, message), status, dict(headers or {}), delay)


Responder = Callable[[Request], Reply]


class WireError(Exception):
    """A request the real API would refuse; the server answers `status` with a provider-shaped body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*);base64,(?P<data>.*)", re.DOTALL)


def png_size(data_url: object, where: str) -> tuple[int, int]:
    """The size of a `data:image/png;base64,...` image; WireError when it is anything else."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data_url, str):
        raise WireError(
            f"{where}: expected an image data URL string, got {type(data_url).__name__}", param=where
        )
    match = _DATA_URL.fullmatch(data_url)
    if not match:
        raise WireError(
            f"{where}: loopback accepts only base64 data URLs (data:image/png;base64,...), got {data_url[:40]!r}",
            param=where,
        )
    if match["mime"] != "image/png":
        raise WireError(f"{where}: image media type must be image/png, got {match['mime']!r}", param=where)
    try:
        raw = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}: the image's base64 data is invalid", param=where) from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            fmt, size = image.format, image.size
            image.verify()  # chunk CRCs and structure: catches truncated or corrupt data ~25x faster than load()
    except UnidentifiedImageError:
        raise WireError(f"{where}: the data is not an image", param=where) from None
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise WireError(f"{where}: the image could not be decoded ({exc})", param=where) from None
    if fmt != "PNG":
        raise WireError(
            f"{where}: Image does not match the provided media type image/png (it is {fmt})", param=where
        )
    return size
