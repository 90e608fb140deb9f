"""`LoopbackServer`: the providers' HTTP APIs on 127.0.0.1, routed to each provider's strict checks and
answered by a responder (see the package docstring)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

from pytest_retrace.testing.anthropic import anthropic_images, check_anthropic
from pytest_retrace.testing.openai import check_openai_responses, responses_images
from pytest_retrace.testing.openai_compat import chat_images, check_openai_chat
from pytest_retrace.testing.wire import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    PROVIDERS,
    Reply,
    Request,
    Responder,
    WireError,
    error_body,
    new_id,
    png_size,
)

_ROUTES = {
    "/v1/messages": ANTHROPIC,
    "/v1/responses": OPENAI_RESPONSES,
    "/v1/chat/completions": OPENAI_CHAT,
}
_IMAGES = {ANTHROPIC: anthropic_images, OPENAI_RESPONSES: responses_images, OPENAI_CHAT: chat_images}


def _is_response(body: object) -> bool:
    return isinstance(body, dict) and body.get("object") == "response" and isinstance(body.get("id"), str)


class LoopbackServer:
    """The provider APIs on 127.0.0.1:<free port>, answered by `responder`; a context manager.

    `url` is the ANTHROPIC_BASE_URL form, `openai_url` (url + "/v1") the OPENAI_BASE_URL form; `requests`
    records every request received, in arrival order. A sync responder runs in a worker thread (a slow one
    holds up nobody else); an `async def` responder is awaited. A responder that raises gets its request a 500
    carrying the exception text (the exception is also kept in `errors`)."""

    def __init__(
        self,
        responder: Responder | Callable[[Request], Awaitable[Reply]],
        *,
        host: str = "127.0.0.1",
        strict: bool = True,
    ) -> None:
        self.responder = responder
        self.host = host
        self.strict = strict
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(PROVIDERS, 0)
        self._outputs: dict[str, list[dict]] = {}  # Responses id -> output items, for previous_response_id
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port: int | None = None

    # --- addresses ---

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("LoopbackServer is not running; use it as a context manager")
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    def env(self, api_key: str = "sk-loopback") -> dict[str, str]:
        """Environment variables that point the official SDKs here (for monkeypatch.setenv / subprocesses)."""
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": api_key,
            "OPENAI_BASE_URL": self.openai_url,
            "OPENAI_API_KEY": api_key,
        }

    def requests_for(self, provider: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.provider == provider]

    # --- lifecycle ---

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> None:
        import uvicorn

        if self._thread is not None:
            raise RuntimeError("LoopbackServer already started")
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((self.host, 0))
        self.port = self._socket.getsockname()[1]
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=64, thread_name_prefix="loopback-responder"
        )
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            timeout_graceful_shutdown=3,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"loopback-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self.stop()
                raise RuntimeError("LoopbackServer failed to start (uvicorn exited)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"LoopbackServer did not start within {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._pool = self._socket = None

    # --- HTTP ---

    def _app(self) -> Any:
        """A Starlette app (the base of FastAPI; no request models here: the checks read the raw JSON)."""
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def health(_request: Any) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        routes = [Route("/health", health, methods=["GET"])]
        routes += [Route(path, self._handle, methods=["POST"]) for path in _ROUTES]
        return Starlette(routes=routes)

    async def _handle(self, request: Any) -> Any:
        """One provider request: record it, check it (strict), ask the responder, wait out the delay, answer."""
        from starlette.responses import JSONResponse, Response

        provider = _ROUTES[request.url.path]
        raw = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            index = self._counts[provider]
            self._counts[provider] += 1
        loop = asyncio.get_running_loop()
        query = dict(request.query_params)
        req, rejection = await loop.run_in_executor(
            self._pool, self._receive, provider, request.url.path, query, headers, raw, index
        )
        with self._lock:
            self.requests.append(req)
        if rejection is not None:
            body = error_body(provider, rejection.status, rejection.message, param=rejection.param)
            return JSONResponse(body, status_code=rejection.status, headers=self._id_headers(provider))
        reply = await self._respond(req, loop)
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)
        if provider == OPENAI_RESPONSES and reply.status == 200 and _is_response(reply.body):
            with self._lock:
                self._outputs[reply.body["id"]] = [
                    o for o in reply.body.get("output") or [] if isinstance(o, dict)
                ]
        headers_out = {**self._id_headers(provider), **reply.headers}
        if reply.body is None:
            return Response(status_code=reply.status, headers=headers_out)
        content = json.dumps(reply.body)
        return Response(content, status_code=reply.status, headers=headers_out, media_type="application/json")

    @staticmethod
    def _id_headers(provider: str) -> dict[str, str]:
        return {"request-id": new_id("req_")} if provider == ANTHROPIC else {"x-request-id": new_id("req_")}

    def _receive(
        self, provider: str, path: str, query: dict, headers: dict[str, str], raw: bytes, index: int
    ) -> tuple[Request, WireError | None]:
        """Parse and (in strict mode) check one request; runs in a worker thread (PNG decoding takes time)."""
        req = Request(provider, path, headers, {}, index, query=query)
        rejection = None
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise WireError(f"The request body must be a JSON object, got {type(body).__name__}")
            req.body = body
            if self.strict and provider == ANTHROPIC:
                check_anthropic(headers, body)
            elif self.strict and provider == OPENAI_RESPONSES:
                check_openai_responses(headers, body, self._previous_outputs)
            elif self.strict:
                check_openai_chat(headers, body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            rejection = WireError(f"The request body is not valid JSON: {exc}")
        except WireError as exc:
            rejection = exc
        except Exception as exc:  # noqa: BLE001 - a body odd enough to trip a check: say so instead of a bare 500
            self.errors.append(exc)
            rejection = WireError(
                f"loopback could not check this request ({type(exc).__name__}: {exc}); "
                "this is a bug in pytest_retrace.testing",
                status=500,
            )
        req.error = rejection.message if rejection else None
        for where, url in _IMAGES[provider](req.body):
            try:
                req.images.append(png_size(url, where))
            except WireError:
                pass  # strict mode has already answered for it; lenient mode records what decodes
        return req, rejection

    def _previous_outputs(self, response_id: str) -> list[dict] | None:
        with self._lock:
            return self._outputs.get(response_id)

    async def _respond(self, req: Request, loop: asyncio.AbstractEventLoop) -> Reply:
        try:
            if inspect.iscoroutinefunction(self.responder):
                reply: Any = await self.responder(req)
            else:  # a sync responder runs in a worker thread; an object with `async def __call__` lands here too
                reply = await loop.run_in_executor(self._pool, self.responder, req)
                if inspect.isawaitable(reply):
                    reply = await reply
        except Exception as exc:  # noqa: BLE001 - whatever the responder raises becomes the 500's message
            self.errors.append(exc)
            return Reply.error(req.provider, 500, f"loopback responder raised {type(exc).__name__}: {exc}")
        if isinstance(reply, Mapping):
            return Reply(body=dict(reply))
        if not isinstance(reply, Reply):
            return Reply.error(
                req.provider, 500, f"loopback responder returned {type(reply).__name__}; expected a Reply"
            )
        return reply
