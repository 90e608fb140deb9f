"""The guest's starlette application: its routes (see the package docstring for the endpoints; OSWorld's
others are in guest/osworld_routes.py), middleware and exception handlers.

Every handler validates its request before doing anything (guest/requests.py) and answers a bad one with a
JSON error and a 4xx; an unexpected failure is a 500 of the same shape, a desktop that is gone a 503. None of
them stops the server. Blocking work (commands, files, X calls) runs in starlette's thread pool on the
`GuestBackend` (guest/backend.py: this machine's, guest/work.py, or an Environment's), so a slow command never
holds up a screenshot.
"""

from __future__ import annotations

import contextlib
import posixpath
from typing import Any
from urllib.parse import quote

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.remote.decode import HEIGHT_HEADER, RAW_TYPE, WIDTH_HEADER
from pytest_retrace.guest.backend import GuestBackend
from pytest_retrace.guest.config import (
    MAX_COMMAND_TIMEOUT,
    MAX_OPEN_FILE_TIMEOUT,
    OPEN_FILE_TIMEOUT,
    GuestConfig,
)
from pytest_retrace.guest.desktop import DesktopError, DisplayBlocked
from pytest_retrace.guest.middleware import Auth, BodyLimit
from pytest_retrace.guest.osworld_routes import osworld_routes
from pytest_retrace.guest.recording import Recorder
from pytest_retrace.guest.requests import (
    bad_request,
    command_field,
    error_response,
    json_object,
    path_field,
    timeout_field,
)
from pytest_retrace.guest.work import Guest

_MULTIPART_SLACK = 64 * 1024  # an upload's body is the file plus its multipart framing and fields
_UPLOAD_PATH = "/setup/upload"


def create_app(config: GuestConfig, backend: GuestBackend | None = None) -> Any:
    """The starlette application of a guest with this configuration, acting on `backend` (default: this
    machine, as `config` describes it)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    guest: GuestBackend = backend if backend is not None else Guest(config)
    recorder = Recorder(guest)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await run_in_threadpool(recorder.abort)  # no ffmpeg outlives the server

    async def health(request: Any) -> Any:
        return JSONResponse({"status": "ok"})

    async def screenshot(request: Any) -> Any:
        kind = request.query_params.get("format", "png")
        if kind == "png":  # OSWorld's reply, for its clients
            return Response(await run_in_threadpool(guest.screenshot_png), media_type="image/png")
        if kind != "rgb":
            raise bad_request(400, f"format: {kind[:40]!r} is not one of png, rgb")
        # ours: the raw pixels, which settling polls without a PNG encode here and a decode in the harness
        width, height, data = await run_in_threadpool(guest.screenshot_rgb)
        return Response(data, media_type=RAW_TYPE, headers={WIDTH_HEADER: str(width), HEIGHT_HEADER: str(height)})

    async def execute(request: Any) -> Any:
        data = await json_object(request)
        command, shell = command_field(data, guest.home)
        timeout = timeout_field(data, "timeout", config.command_timeout, MAX_COMMAND_TIMEOUT)
        return JSONResponse(await run_in_threadpool(guest.run, command, shell, timeout))

    async def get_file(request: Any) -> Any:
        async with request.form(max_files=0, max_fields=16, max_part_size=64 * 1024) as form:
            if "file_path" not in form:
                raise bad_request(400, "file_path is required (a form field)")
            path = path_field(form["file_path"], "file_path")
        data = await run_in_threadpool(guest.read, path)
        if data is None:
            return error_response(404, f"File not found: {path}")
        name = quote(posixpath.basename(path) or "file")
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{name}"})

    async def upload(request: Any) -> Any:
        async with request.form(max_files=2, max_fields=16, max_part_size=64 * 1024) as form:
            if "file_path" not in form or "file_data" not in form:
                raise bad_request(400, "file_path and file_data are required (multipart form fields)")
            path = form["file_path"]
            if isinstance(path, UploadFile):
                raise bad_request(400, "file_path must be a plain form field, not a file")
            path = path_field(path, "file_path")
            data = form["file_data"]
            if not isinstance(data, UploadFile):
                raise bad_request(400, "file_data must be a file part (with a filename)")
            written = await run_in_threadpool(guest.write, path, data.file)
        return PlainTextResponse(f"File Uploaded: {written} bytes")

    async def launch(request: Any) -> Any:
        data = await json_object(request)
        command, shell = command_field(data, guest.home)
        return PlainTextResponse(await run_in_threadpool(guest.launch, command, shell))

    async def open_file(request: Any) -> Any:
        data = await json_object(request)
        if "path" not in data:
            raise bad_request(400, "path is required")
        path = path_field(data["path"], "path")
        window = data.get("window_name")
        if window is not None:
            window = path_field(window, "window_name")
        timeout = timeout_field(data, "timeout_seconds", OPEN_FILE_TIMEOUT, MAX_OPEN_FILE_TIMEOUT)
        status, message = await run_in_threadpool(guest.open_file, path, window, timeout)
        return PlainTextResponse(message) if status == 200 else error_response(status, message)

    async def get_platform(request: Any) -> Any:
        return PlainTextResponse(await run_in_threadpool(guest.platform))

    async def screen_size(request: Any) -> Any:
        width, height = await run_in_threadpool(guest.screen_size)
        return JSONResponse({"width": width, "height": height})

    async def cursor_position(request: Any) -> Any:
        x, y = await run_in_threadpool(guest.cursor_position)
        return JSONResponse([x, y])

    async def task_cpu(request: Any) -> Any:
        seconds = await run_in_threadpool(guest.task_cpu)
        return JSONResponse({"seconds": seconds})

    async def http_error(request: Any, exc: HTTPException) -> Any:
        return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    async def desktop_error(request: Any, exc: DesktopError) -> Any:
        # 409: the display is there but held by a client's grab, which waiting or retrying does not end
        return error_response(409 if isinstance(exc, DisplayBlocked) else 503, str(exc))

    async def env_error(request: Any, exc: EnvError) -> Any:
        return error_response(503, f"the desktop failed: {exc}")  # the harness's, never the request's fault

    async def internal_error(request: Any, exc: Exception) -> Any:
        return error_response(500, f"internal error: {type(exc).__name__}: {str(exc)[:500]}")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/screenshot", screenshot, methods=["GET"]),
        Route("/execute", execute, methods=["POST"]),
        Route("/setup/execute", execute, methods=["POST"]),  # OSWorld serves both paths
        Route("/file", get_file, methods=["POST"]),
        Route(_UPLOAD_PATH, upload, methods=["POST"]),
        Route("/setup/launch", launch, methods=["POST"]),
        Route("/setup/open_file", open_file, methods=["POST"]),
        Route("/platform", get_platform, methods=["GET"]),
        Route("/screen_size", screen_size, methods=["POST"]),
        Route("/cursor_position", cursor_position, methods=["GET"]),
        Route("/task_cpu", task_cpu, methods=["GET"]),  # retrace's own: see Environment.task_cpu_seconds
        *osworld_routes(guest, config, recorder),
    ]
    middleware = [
        Middleware(Auth, token=config.token),
        Middleware(BodyLimit, default=config.max_json, limits={_UPLOAD_PATH: config.max_upload + _MULTIPART_SLACK}),
    ]
    handlers = {HTTPException: http_error, DesktopError: desktop_error, EnvError: env_error, Exception: internal_error}
    return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)
