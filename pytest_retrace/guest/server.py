"""The guest server: a starlette app served by uvicorn (see the package docstring for the endpoints).

Every handler validates its request before doing anything and answers a bad one with
``{"status": "error", "error": MESSAGE, "message": MESSAGE}`` (``message`` too because OSWorld's own errors
use that key) and a 4xx; an unexpected failure is a 500 of the same shape. None of them stops the server.
Blocking work (commands, files, X calls) runs in starlette's thread pool, so a slow command never holds up
a screenshot.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import platform
import posixpath
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_retrace.envs import FileRefused
from pytest_retrace.envs.guestfs import MAX_READ, GuestFS
from pytest_retrace.envs.procfs import cpu_seconds
from pytest_retrace.guest.desktop import Desktop, DesktopError, DisplayBlocked

MAX_JSON = 1024 * 1024  # the body of any request but an upload
MAX_UPLOAD = 64 * 1024 * 1024  # one uploaded file (as envs/guestfs.py's MAX_READ for reads)
_MULTIPART_SLACK = 64 * 1024  # an upload's body is the file plus its multipart framing and fields
MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr (as the xvfb environment's run())
COMMAND_TIMEOUT = 120.0  # seconds a command may run unless the request asks for less (OSWorld's limit)
MAX_COMMAND_TIMEOUT = 3600.0  # what a request's own "timeout" field may ask for at most
OPEN_FILE_TIMEOUT = 30.0  # seconds /setup/open_file waits for the window unless asked (OSWorld: 1800)
MAX_OPEN_FILE_TIMEOUT = 300.0
_UPLOAD_PATH = "/setup/upload"


class GuestError(RuntimeError):
    """The server cannot start as configured (the message says why); `retrace guest` exits 2."""


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or ``localhost``): reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


@dataclass
class GuestConfig:
    home: Path = field(default_factory=Path.home)  # "~" in a request; with /tmp, the roots files may be in
    token: str | None = None  # required as "Authorization: Bearer TOKEN" on every endpoint but /health
    command_timeout: float = COMMAND_TIMEOUT
    max_upload: int = MAX_UPLOAD
    max_json: int = MAX_JSON
    max_output: int = MAX_OUTPUT
    display: str | None = None  # default: $DISPLAY
    env: dict[str, str] | None = None  # of commands and apps; default: this process's environment
    # (uid, gid) every command and app runs as, when the server itself is root (the desktop image: the agent's
    # processes must not be able to kill the server or the X server, or its own case would become an
    # infrastructure error). Files the API writes are given to that user too. None: as the server.
    run_as: tuple[int, int] | None = None
    nproc_limit: int | None = None  # RLIMIT_NPROC of run_as's processes: a fork bomb stops at its own desk
    fsize_limit: int | None = None  # RLIMIT_FSIZE of run_as's processes: no file fills the disk alone

    @property
    def roots(self) -> tuple[str, ...]:
        """The allowed roots, resolved (``/tmp`` may be a link on some systems)."""
        return tuple(dict.fromkeys(os.path.realpath(p) for p in (str(self.home), "/tmp")))


# -- errors and request parsing ---------------------------------------------------------------------------


def _error_body(message: str) -> dict[str, str]:
    return {"status": "error", "error": message, "message": message}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(_error_body(message), status_code=status, headers=headers)


def _bad(status: int, message: str) -> Exception:
    from starlette.exceptions import HTTPException

    return HTTPException(status_code=status, detail=message)


def _show(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _json_object(request: Any) -> dict[str, Any]:
    body = await request.body()
    if not body.strip():
        raise _bad(400, "the request needs a JSON object body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise _bad(400, f"the JSON body must be an object, got {type(data).__name__}")
    return data


def _expand(arg: str, home: Path) -> str:
    """``~`` and ``~/...`` are the home (OSWorld expands ``~/`` in command arguments and every path)."""
    return str(home) + arg[1:] if arg == "~" or arg.startswith("~/") else arg


def _command(data: dict[str, Any], home: Path) -> tuple[list[str] | str, bool]:
    """The ``command`` and ``shell`` fields, checked; a string without shell is split like OSWorld does."""
    shell = data.get("shell", False)
    if not isinstance(shell, bool):
        raise _bad(400, f"shell must be true or false, got {_show(shell)}")
    if "command" not in data:
        raise _bad(400, "command is required: a list of arguments, or a string")
    command = data["command"]
    if isinstance(command, str):
        if not command.strip():
            raise _bad(400, "command is empty")
        if "\0" in command:
            raise _bad(400, "command must not contain a NUL character")
        if shell:
            return command, True
        try:
            command = shlex.split(command)
        except ValueError as exc:
            raise _bad(400, f"command cannot be split into arguments ({exc})") from None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise _bad(400, f"command must be a list of strings or a string, got {_show(command)}")
    if not command:
        raise _bad(400, "command is empty")
    if any("\0" in a for a in command):
        raise _bad(400, "command must not contain a NUL character")
    return [_expand(a, home) for a in command], shell


def _timeout(data: dict[str, Any], name: str, default: float, limit: float) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise _bad(400, f"{name} must be a positive number of seconds, got {_show(value)}")
    return min(float(value), limit)


def _path_field(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(400, f"{name} must be a non-empty string, got {_show(value)}")
    if "\0" in value:
        raise _bad(400, f"{name} must not contain a NUL character")
    return value


# -- the guest's work (blocking; run in the thread pool) -------------------------------------------------


class Guest:
    def __init__(self, config: GuestConfig) -> None:
        self.config = config
        self.home = Path(os.path.realpath(config.home))
        roots = config.roots
        self.fs = GuestFS({root: Path(root) for root in roots}, str(self.home))
        self.roots = roots
        self.desktop = Desktop(config.display)
        self.env = dict(config.env if config.env is not None else os.environ)
        if config.display:
            self.env["DISPLAY"] = config.display  # apps and commands show on the display served

    # processes
    def task_pids(self) -> list[int]:
        """The task's processes: every process of ``run_as``'s user, or, when commands run as the server's own
        user, the server's descendants (what it started)."""
        parents: dict[int, int] = {}
        owners: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry.name}/status").read_text()
            except OSError:
                continue  # exited meanwhile
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            parents[int(entry.name)] = int(fields["PPid"])
            owners[int(entry.name)] = int(fields["Uid"].split()[0])  # the real uid
        if self.config.run_as is not None:
            return [pid for pid, uid in owners.items() if uid == self.config.run_as[0]]
        found, frontier = [], [os.getpid()]
        while frontier:
            children = [pid for pid, parent in parents.items() if parent in frontier]
            found += children
            frontier = children
        return found

    # paths
    def absolute(self, path: str) -> str:
        """A request's path as an absolute path, ``..`` resolved lexically (links are the callers' business)."""
        return posixpath.normpath(self.fs.absolute(path))

    def inside(self, path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in self.roots)

    def _confine(self, shown: str, full: str) -> str:
        """`full` with every link resolved, which must still be in an allowed root (403 otherwise)."""
        real = os.path.realpath(full)
        if not (self.inside(full) and self.inside(real)):
            raise _bad(403, f"{shown}: outside the allowed roots ({', '.join(self.roots)})")
        return real

    # commands
    def _as_user(self) -> dict[str, Any]:
        """Popen's arguments that start a process as ``config.run_as``: no supplementary groups, the process
        limit, and the OOM killer's first choice (raising one's own score needs no privilege), so that a task
        that eats the container's memory loses its own processes, not the desktop's."""
        if self.config.run_as is None:
            return {}
        uid, gid = self.config.run_as
        nproc, fsize = self.config.nproc_limit, self.config.fsize_limit

        def drop() -> None:  # in the child, in this order: the score and limit need root, then become the user
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")
            import resource

            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        return {"preexec_fn": drop}

    def run(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        """OSWorld's /execute result; output goes to files, not pipes, so a command that leaves a process
        behind (``app &``) does not hold the request open until the timeout."""
        cap = self.config.max_output
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        cwd=self.home, env=self.env, start_new_session=True, **self._as_user())
            except OSError as exc:
                raise _bad(400, f"cannot run {_show(command)}: {exc.strerror or exc}") from None
            try:
                code, note = proc.wait(timeout=timeout), ""
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                code, note = 124, f"\nretrace guest: timed out after {timeout:g} s"
            out.seek(0)
            err.seek(0)
            return {"status": "success", "output": out.read(cap).decode(errors="replace"),
                    "error": err.read(cap).decode(errors="replace") + note, "returncode": code}

    def launch(self, command: list[str] | str, shell: bool) -> str:
        try:
            proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, cwd=self.home, env=self.env, start_new_session=True,
                                    **self._as_user())
        except OSError as exc:
            raise _bad(400, f"cannot launch {_show(command)}: {exc.strerror or exc}") from None
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()  # no zombies
        return f"{command if shell else ' '.join(command)} launched successfully"

    def open_file(self, path: str, window: str | None, timeout: float) -> tuple[int, str]:
        """OSWorld's /setup/open_file: open a file with xdg-open, or start an application by name, then
        wait until a window whose title holds the name (or `window`) shows."""
        full = self.absolute(_expand(path, self.home))
        if os.path.lexists(full):
            real = self._confine(path, full)
            opener = shutil.which("xdg-open", path=self.env.get("PATH"))
            if opener is None:
                return 501, "xdg-open is not installed on this guest: cannot open files"
            self.launch([opener, real], False)
            name = Path(real).name
            candidates = [window] if window else [name, Path(name).stem]
        elif "/" not in path and shutil.which(path, path=self.env.get("PATH")):
            self.launch([path], False)
            candidates = [window or path]
        else:
            raise _bad(404, f"Application/file not found: {path}")
        found = self.desktop.wait_window([c for c in candidates if c], timeout, self.env)
        if found is None:
            return 200, "File opened (no xdotool or wmctrl on this guest to wait for its window)"
        if found:
            return 200, "File opened and window activated successfully"
        return 500, f"Failed to find window for {candidates} within {timeout:g} seconds."

    # files
    def read(self, path: str) -> bytes | None:
        full = self.absolute(path)
        if not self.inside(full):
            raise _bad(403, f"{path}: outside the allowed roots ({', '.join(self.roots)})")
        try:
            return self.fs.read(full, cap=MAX_READ)
        except FileRefused as exc:
            real = os.path.realpath(full)
            raise _bad(403 if not self.inside(real) else 422, str(exc).replace("the sandbox's", "the guest's")) from None
        except OSError as exc:
            raise _bad(422, f"{path}: cannot be read ({exc.strerror or exc})") from None

    def write(self, path: str, source: Any) -> int:
        """Copy the file object `source` to `path` (created with its directories); the bytes written."""
        full = self.absolute(path)
        real = self._confine(path, full)
        if real in self.roots:
            raise _bad(422, f"{path} is a directory, not a file")
        try:
            self._makedirs(os.path.dirname(real))
            # O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of hanging the request
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _bad(422, f"cannot write {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _bad(422, f"cannot write {path}: not a regular file")
            os.set_blocking(fd, True)
            if self.config.run_as is not None:
                os.fchown(fd, *self.config.run_as)
            fh.truncate(0)
            written = 0
            while chunk := source.read(1024 * 1024):
                fh.write(chunk)
                written += len(chunk)
        return written

    def _makedirs(self, path: str) -> None:
        """os.makedirs, each new directory given to ``config.run_as`` (the task must be able to use them)."""
        if os.path.isdir(path):
            return
        self._makedirs(os.path.dirname(path))
        try:
            os.mkdir(path)
        except FileExistsError:
            return  # made by a concurrent request
        if self.config.run_as is not None:
            os.chown(path, *self.config.run_as, follow_symlinks=False)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# -- middleware (plain ASGI: it answers before anything reads the body) ----------------------------------


class _Auth:
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
            response = _error(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                              {"WWW-Authenticate": "Bearer"})
        elif not hmac.compare_digest(value.strip().encode(), self.token):
            response = _error(401, "wrong bearer token", {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        else:
            return await self.app(scope, receive, send)
        await response(scope, receive, send)


_DRAIN = 16 * 1024 * 1024  # bytes of an over-limit body read and dropped so that the client sees the 413


class _BodyLimit:
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
                return await _error(400, f"bad Content-Length {declared[:40]!r}")(scope, receive, send)
            if int(declared) > limit:
                if int(declared) <= limit + _DRAIN:
                    await _drain(receive, _DRAIN)
                message = f"the request body is {int(declared)} bytes, over this endpoint's limit of {limit}"
                return await _error(413, message)(scope, receive, send)
        received = 0

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if message.get("more_body", False):
                        await _drain(receive, _DRAIN)
                    raise _bad(413, f"the request body is over this endpoint's limit of {limit} bytes")
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


# -- the app ---------------------------------------------------------------------------------------------


def create_app(config: GuestConfig) -> Any:
    """The starlette application of a guest with this configuration."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    guest = Guest(config)

    async def health(request: Any) -> Any:
        return JSONResponse({"status": "ok"})

    async def screenshot(request: Any) -> Any:
        return Response(await run_in_threadpool(guest.desktop.screenshot_png), media_type="image/png")

    async def execute(request: Any) -> Any:
        data = await _json_object(request)
        command, shell = _command(data, guest.home)
        timeout = _timeout(data, "timeout", config.command_timeout, MAX_COMMAND_TIMEOUT)
        return JSONResponse(await run_in_threadpool(guest.run, command, shell, timeout))

    async def get_file(request: Any) -> Any:
        async with request.form(max_files=0, max_fields=16, max_part_size=64 * 1024) as form:
            if "file_path" not in form:
                raise _bad(400, "file_path is required (a form field)")
            path = _path_field(form["file_path"], "file_path")
        data = await run_in_threadpool(guest.read, path)
        if data is None:
            return _error(404, f"File not found: {path}")
        name = quote(posixpath.basename(path) or "file")
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{name}"})

    async def upload(request: Any) -> Any:
        async with request.form(max_files=2, max_fields=16, max_part_size=64 * 1024) as form:
            if "file_path" not in form or "file_data" not in form:
                raise _bad(400, "file_path and file_data are required (multipart form fields)")
            path = form["file_path"]
            if isinstance(path, UploadFile):
                raise _bad(400, "file_path must be a plain form field, not a file")
            path = _path_field(path, "file_path")
            data = form["file_data"]
            if not isinstance(data, UploadFile):
                raise _bad(400, "file_data must be a file part (with a filename)")
            written = await run_in_threadpool(guest.write, path, data.file)
        return PlainTextResponse(f"File Uploaded: {written} bytes")

    async def launch(request: Any) -> Any:
        data = await _json_object(request)
        command, shell = _command(data, guest.home)
        return PlainTextResponse(await run_in_threadpool(guest.launch, command, shell))

    async def open_file(request: Any) -> Any:
        data = await _json_object(request)
        if "path" not in data:
            raise _bad(400, "path is required")
        path = _path_field(data["path"], "path")
        window = data.get("window_name")
        if window is not None:
            window = _path_field(window, "window_name")
        timeout = _timeout(data, "timeout_seconds", OPEN_FILE_TIMEOUT, MAX_OPEN_FILE_TIMEOUT)
        status, message = await run_in_threadpool(guest.open_file, path, window, timeout)
        return PlainTextResponse(message) if status == 200 else _error(status, message)

    async def get_platform(request: Any) -> Any:
        return PlainTextResponse(platform.system())

    async def screen_size(request: Any) -> Any:
        width, height = await run_in_threadpool(guest.desktop.screen_size)
        return JSONResponse({"width": width, "height": height})

    async def cursor_position(request: Any) -> Any:
        x, y = await run_in_threadpool(guest.desktop.cursor_position)
        return JSONResponse([x, y])

    async def task_cpu(request: Any) -> Any:
        seconds = await run_in_threadpool(lambda: cpu_seconds(guest.task_pids()))
        return JSONResponse({"seconds": seconds})

    async def http_error(request: Any, exc: HTTPException) -> Any:
        return _error(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    async def desktop_error(request: Any, exc: DesktopError) -> Any:
        # 409: the display is there but held by a client's grab, which waiting or retrying does not end
        return _error(409 if isinstance(exc, DisplayBlocked) else 503, str(exc))

    async def internal_error(request: Any, exc: Exception) -> Any:
        return _error(500, f"internal error: {type(exc).__name__}: {str(exc)[:500]}")

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
    ]
    middleware = [
        Middleware(_Auth, token=config.token),
        Middleware(_BodyLimit, default=config.max_json, limits={_UPLOAD_PATH: config.max_upload + _MULTIPART_SLACK}),
    ]
    handlers = {HTTPException: http_error, DesktopError: desktop_error, Exception: internal_error}
    return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)


# -- serving ---------------------------------------------------------------------------------------------


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise GuestError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    sock.listen(2048)  # before "listening on" is printed: a client may connect at once (uvicorn queues it)
    return sock


_TOKEN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def read_token(token_env: str | None) -> str | None:
    """The token from the environment variable named `token_env`, removed from this process's environment
    so that no command or app the guest starts inherits it."""
    if token_env is None:
        return None
    if not _TOKEN_NAME.fullmatch(token_env):
        raise GuestError(f"--token-env: {token_env!r} is not an environment variable name")
    token = os.environ.pop(token_env, "").strip()
    if not token:
        raise GuestError(f"--token-env: the environment variable {token_env} is not set or empty")
    return token


def serve(config: GuestConfig, host: str = "127.0.0.1", port: int = 5000, log_level: str = "warning") -> int:
    """Serve until SIGINT / SIGTERM. Prints ``retrace guest: listening on http://HOST:PORT`` first (with the
    real port when `port` is 0), flushed, so that a parent process can read where to connect."""
    if not is_loopback(host) and not config.token:
        raise GuestError(f"refusing to listen on {host} (not a loopback address) without a token: anyone who "
                         "reaches it could run commands; give --token-env VAR")
    if not config.home.is_dir():
        raise GuestError(f"the home {config.home} is not a directory")
    try:
        import uvicorn
    except ImportError as exc:
        raise GuestError(f"{exc.name} is not installed: pip install 'pytest-retrace[guest]'") from None
    try:
        app = create_app(config)
    except ImportError as exc:
        raise GuestError(f"{exc.name} is not installed: pip install 'pytest-retrace[guest]'") from None
    try:
        import multipart  # noqa: F401 - starlette's form parser
    except ImportError:
        try:
            import python_multipart  # noqa: F401
        except ImportError:
            raise GuestError("python-multipart is not installed: pip install 'pytest-retrace[guest]'") from None
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"retrace guest: listening on http://{shown}:{bound} (home {config.home}, display "
          f"{config.display or os.environ.get('DISPLAY') or 'none'}, token {'required' if config.token else 'off'})",
          flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, server_header=False, timeout_keep_alive=30))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
