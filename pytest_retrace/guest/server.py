"""Serving the guest: binding its socket, reading its token, and running the app under uvicorn."""

from __future__ import annotations

import os
import re
import socket

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
