"""The guest's ASGI middleware, plain ASGI so that it answers before anything reads the body: the bearer
token and the request body limits."""

from __future__ import annotations

import hmac
from typing import Any

from pytest_retrace.guest.requests import bad_request, error_response


class Auth:
    """Every endpoint but /health needs ``Authorization: Bearer TOKEN`` when a token is set."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            response = error_response(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                              {"WWW-Authenticate": "Bearer"})
        elif not hmac.compare_digest(value.strip().encode(), self.token):
            response = error_response(401, "wrong bearer token", {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        else:
            return await self.app(scope, receive, send)
        await response(scope, receive, send)


_DRAIN = 16 * 1024 * 1024  # bytes of an over-limit body read and dropped so that the client sees the 413


class BodyLimit:
    """A request body over the endpoint's limit is a 413, when Content-Length says so or as soon as the bytes
    received pass it (a chunked body). Up to _DRAIN more bytes are read and dropped first: a client still
    sending its body when the server answers and closes gets a broken pipe instead of the 413. A body
    declared larger than that is answered at once, unread."""

    def __init__(self, app: Any, default: int, limits: dict[str, int]) -> None:
        self.app = app
        self.default = default
        self.limits = limits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        limit = self.limits.get(scope["path"], self.default)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                return await error_response(400, f"bad Content-Length {declared[:40]!r}")(scope, receive, send)
            if int(declared) > limit:
                if int(declared) <= limit + _DRAIN:
                    await _drain(receive, _DRAIN)
                message = f"the request body is {int(declared)} bytes, over this endpoint's limit of {limit}"
                return await error_response(413, message)(scope, receive, send)
        received = 0

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if message.get("more_body", False):
                        await _drain(receive, _DRAIN)
                    raise bad_request(413, f"the request body is over this endpoint's limit of {limit} bytes")
            return message

        await self.app(scope, limited, send)


async def _drain(receive: Any, most: int) -> None:
    """Read and drop the rest of a request's body, at most `most` bytes of it."""
    dropped = 0
    while dropped <= most:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
