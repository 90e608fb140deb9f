"""The guest server's configuration and its limits: `GuestConfig`, `GuestError`, and which hosts are loopback."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_JSON = 1024 * 1024  # the body of any request but an upload
MAX_UPLOAD = 64 * 1024 * 1024  # one uploaded file (as envs/guestfs.py's MAX_READ for reads)
_MULTIPART_SLACK = 64 * 1024  # an upload's body is the file plus its multipart framing and fields
MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr (as the xvfb environment's run())
COMMAND_TIMEOUT = 120.0  # seconds a command may run unless the request asks for less (OSWorld's limit)
MAX_COMMAND_TIMEOUT = 3600.0  # what a request's own "timeout" field may ask for at most
OPEN_FILE_TIMEOUT = 30.0  # seconds /setup/open_file waits for the window unless asked (OSWorld: 1800)
MAX_OPEN_FILE_TIMEOUT = 300.0



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
