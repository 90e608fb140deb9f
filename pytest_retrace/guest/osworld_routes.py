"""The routes of OSWorld's VM server beyond the remote provider's subset, which desktop-env's own
PythonController, SetupController and getters call (the package docstring lists them all). Each checks its
request's fields first (a JSON 4xx naming the field), then does its work in the thread pool
(guest/osworld_work.py) on the `GuestBackend`.

The accessibility tree (guest/accessibility.py) is read inside the desktop; a 501 that says why for a task
without AT-SPI on (the default), so a getter needing it fails as unsupported rather than judging a wrong value.
Recording (guest/recording.py) is a 501 on a desktop without ffmpeg.
"""

from __future__ import annotations

from typing import Any

from pytest_retrace.guest import osworld_work as work
from pytest_retrace.guest.accessibility import accessibility_tree
from pytest_retrace.guest.backend import GuestBackend
from pytest_retrace.guest.config import MAX_COMMAND_TIMEOUT, GuestConfig
from pytest_retrace.guest.recording import Recorder
from pytest_retrace.guest.requests import (
    bad_request,
    command_field,
    error_response,
    expand_home,
    json_object,
    path_field,
    timeout_field,
)
from pytest_retrace.text import show

MAX_VERIFY_WAIT = 600.0  # seconds an execute_with_verification may wait for its verification at most
_VERIFICATIONS = ("window_exists", "command_success")


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise bad_request(400, f"{name} must be true or false, got {show(value)}")
    return value


def _seconds(data: dict[str, Any], name: str, default: float, limit: float) -> float:
    return timeout_field(data, name, default, limit)


def _verification(data: dict[str, Any]) -> dict[str, str]:
    value = data.get("verification") or {}
    if not isinstance(value, dict):
        raise bad_request(400, f"verification must be an object, got {show(value)}")
    unknown = sorted(set(value) - set(_VERIFICATIONS))
    if unknown:
        raise bad_request(400, f"verification: unknown key {unknown[0]!r} (known: {', '.join(_VERIFICATIONS)})")
    for key, text in value.items():
        path_field(text, f"verification.{key}")  # a non-empty string without NUL
    return value


def _window_request(data: dict[str, Any]) -> tuple[str, bool, bool]:
    if not data.get("window_name"):
        raise bad_request(400, "window_name required")
    return path_field(data["window_name"], "window_name"), _flag(data, "strict"), _flag(data, "by_class")


def osworld_routes(backend: GuestBackend, config: GuestConfig, recorder: Recorder) -> list[Any]:
    """The starlette routes of the endpoints above, on `backend`; `recorder` runs its recordings (the app stops
    one still running at its shutdown)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    def text(status: int, message: str) -> Any:
        return PlainTextResponse(message) if status == 200 else error_response(status, message)

    async def terminal(request: Any) -> Any:
        # OSWorld reads the focused gnome-terminal's text through AT-SPI; without AT-SPI, its answer when no
        # terminal is active (SetupController.setup polls this before every setup: it must answer)
        return JSONResponse({"output": None, "status": "success"})

    async def accessibility(request: Any) -> Any:
        status, body = await run_in_threadpool(accessibility_tree, backend)
        return JSONResponse({"AT": body}) if status == 200 else error_response(status, body)

    async def start_recording(request: Any) -> Any:
        status, body = await run_in_threadpool(recorder.start)
        return JSONResponse(body) if status == 200 else error_response(status, body["message"])

    async def end_recording(request: Any) -> Any:
        status, body = await run_in_threadpool(recorder.end)
        if isinstance(body, bytes):
            return Response(body, media_type="video/mp4",
                            headers={"Content-Disposition": "attachment; filename=recording.mp4"})
        return error_response(status, body["message"])

    async def run_python(request: Any) -> Any:
        data = await json_object(request)
        if not data.get("code"):
            raise bad_request(400, "Code not supplied!")
        status, body = await run_in_threadpool(work.run_python, backend, path_field(data["code"], "code"))
        return JSONResponse(body, status_code=status)

    async def run_bash_script(request: Any) -> Any:
        data = await json_object(request)
        if not data.get("script"):
            raise bad_request(400, "Script not supplied!")
        script = path_field(data["script"], "script")
        timeout = _seconds(data, "timeout", work.BASH_TIMEOUT, MAX_COMMAND_TIMEOUT)
        working_dir = data.get("working_dir")
        if working_dir is not None:
            working_dir = path_field(working_dir, "working_dir")
        status, body = await run_in_threadpool(work.run_bash_script, backend, script, timeout, working_dir)
        return JSONResponse(body, status_code=status)

    async def execute_with_verification(request: Any) -> Any:
        data = await json_object(request)
        command, shell = command_field(data, backend.home)
        verification = _verification(data)
        max_wait = _seconds(data, "max_wait_time", 10.0, MAX_VERIFY_WAIT)
        interval = _seconds(data, "check_interval", 1.0, MAX_VERIFY_WAIT)
        status, body = await run_in_threadpool(work.execute_with_verification, backend, command, shell,
                                               config.command_timeout, verification, max_wait, interval)
        return JSONResponse(body, status_code=status)

    async def activate_window(request: Any) -> Any:
        name, strict, by_class = _window_request(await json_object(request))
        return text(*await run_in_threadpool(work.activate_window, backend, name, strict, by_class))

    async def close_window(request: Any) -> Any:
        name, strict, by_class = _window_request(await json_object(request))
        return text(*await run_in_threadpool(work.close_window, backend, name, strict, by_class))

    async def change_wallpaper(request: Any) -> Any:
        data = await json_object(request)
        if not data.get("path"):
            raise bad_request(400, "Path not supplied!")
        return text(*await run_in_threadpool(work.change_wallpaper, backend, path_field(data["path"], "path")))

    async def get_wallpaper(request: Any) -> Any:
        status, body = await run_in_threadpool(work.wallpaper, backend)
        if status != 200:
            return error_response(status, str(body))
        return Response(body, media_type="image/png")  # OSWorld's type, whatever the file is

    async def window_size(request: Any) -> Any:
        async with request.form(max_files=0, max_fields=16, max_part_size=64 * 1024) as form:
            if "app_class_name" not in form:
                raise bad_request(400, "app_class_name is required (a form field)")
            name = path_field(form["app_class_name"], "app_class_name")
        status, body = await run_in_threadpool(work.window_size, backend, name)
        return JSONResponse(body, status_code=status) if status == 200 else error_response(status, body["error"])

    async def desktop_path(request: Any) -> Any:
        status, body = await run_in_threadpool(work.desktop_path, backend)
        return JSONResponse(body) if status == 200 else error_response(status, body["error"])

    async def list_directory(request: Any) -> Any:
        data = await json_object(request)
        if "path" not in data:
            raise bad_request(400, "Missing 'path' parameter")
        path = await run_in_threadpool(_directory, backend, path_field(data["path"], "path"))
        status, body = await run_in_threadpool(work.directory_tree, backend, path)
        return JSONResponse(body) if status == 200 else error_response(status, body["error"])

    return [
        Route("/terminal", terminal, methods=["GET"]),
        Route("/accessibility", accessibility, methods=["GET"]),
        Route("/run_python", run_python, methods=["POST"]),
        Route("/run_bash_script", run_bash_script, methods=["POST"]),
        Route("/setup/execute_with_verification", execute_with_verification, methods=["POST"]),
        Route("/execute_with_verification", execute_with_verification, methods=["POST"]),  # OSWorld serves both
        Route("/setup/activate_window", activate_window, methods=["POST"]),
        Route("/setup/close_window", close_window, methods=["POST"]),
        Route("/setup/change_wallpaper", change_wallpaper, methods=["POST"]),
        Route("/wallpaper", get_wallpaper, methods=["POST"]),
        Route("/window_size", window_size, methods=["POST"]),
        Route("/desktop_path", desktop_path, methods=["POST"]),
        Route("/list_directory", list_directory, methods=["POST"]),
        Route("/start_recording", start_recording, methods=["POST"]),
        Route("/end_recording", end_recording, methods=["POST"]),
    ]


def _directory(backend: GuestBackend, path: str) -> str:
    """`path` (``~`` expanded) as the directory it names with every link resolved, which must lie in the
    allowed roots (403) and be a directory (400, OSWorld's answer)."""
    full = expand_home(path, backend.home)
    res = backend.run(["realpath", "-e", "--", full], False, 10)
    real = res["output"].strip()
    inside = [root for root in backend.roots if real == root or real.startswith(root.rstrip("/") + "/")]
    if res["returncode"] == 0 and not inside:
        raise bad_request(403, f"{path}: outside the allowed roots ({', '.join(backend.roots)})")
    if res["returncode"] != 0 or backend.run(["test", "-d", real], False, 10)["returncode"] != 0:
        raise bad_request(400, "The provided path is not a directory")
    return real
