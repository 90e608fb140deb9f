"""Serving the guest: binding its socket, reading its token, and running the app under uvicorn: `serve` for
``retrace guest`` (this machine's desktop, until a signal), `serve_environment` for an Environment's desktop
from beside it (a thread of the harness's process)."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from pytest_retrace.envs import Environment
from pytest_retrace.guest.app import create_app
from pytest_retrace.guest.config import GuestConfig, GuestError, is_loopback


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


_START_DEADLINE = 30.0  # seconds uvicorn may take to accept connections in its thread


@dataclass
class ServedEnvironment:
    """A guest server serving one Environment; `close` stops it (the environment stays as it is)."""

    host: str
    port: int
    server: Any
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> ServedEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_environment(env: Environment, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                      config: GuestConfig | None = None) -> ServedEnvironment:
    """OSWorld's VM-server API for `env`'s desktop (guest/envbackend.py), served by uvicorn on an event loop
    of its own in a daemon thread, so that desktop-env's controllers and getters can act on a desktop this
    process runs. Returns once it accepts connections; `port` 0 picks a free one."""
    from pytest_retrace.guest.envbackend import EnvironmentBackend

    if not is_loopback(host) and not token:
        raise GuestError(f"refusing to serve {host} (not a loopback address) without a token")
    try:
        import uvicorn
    except ImportError as exc:
        raise GuestError(f"{exc.name} is not installed: pip install 'pytest-retrace[guest]'") from None
    cfg = dataclasses.replace(config or GuestConfig(), **({"token": token} if token is not None else {}))
    app = create_app(cfg, EnvironmentBackend(env, max_upload=cfg.max_upload))
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", server_header=False, timeout_keep_alive=30))

    def run() -> None:
        try:
            server.run(sockets=[sock])  # off the main thread, uvicorn installs no signal handlers
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"retrace-guest-{env.name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_DEADLINE
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise GuestError(f"the guest server for {env.name} did not start within {_START_DEADLINE:g} s")
        time.sleep(0.01)
    return ServedEnvironment(host.strip("[]"), bound, server, thread)
