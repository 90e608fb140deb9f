"""HTTP to one guest (OSWorld's VM server or ``retrace guest``): requests with retries, the replies, the
calls the remote environment makes on every guest (/execute, /screen_size, /platform), multipart bodies, and
a task's paths as the guest expands them."""

from __future__ import annotations

import io
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.guestfs import MAX_READ
from pytest_retrace.envs.remote.errors import (
    DisplayExhausted,
    exhausted_message,
    is_exhausted,
    server_text,
    tail,
)
from pytest_retrace.envs.steps import GUEST_HOME

MAX_OUTPUT = 1024 * 1024  # of one command's stdout or stderr, as the xvfb environment's run()
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)  # between attempts after a connection error


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased (header())

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def message(self) -> str:
        """The error a guest sent, in its own words (errors.server_text: JSON, an HTML page, a traceback)."""
        return server_text(self.body, self.content_type) or f"HTTP {self.status}"


class Unreachable(EnvError):
    """No answer from the guest (connection refused, reset, timed out) after the retries."""


class Refused(EnvError):
    """The guest answered /execute with an error (not a command's non-zero exit: the request itself)."""


class Client:
    """HTTP to one guest, with urllib (no proxy: guests are on the harness's own network)."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        # set once the guest's X server refused a client (DisplayExhausted): every later request fails at once
        # with it until the environment's reset clears it, so a guest in that state runs nothing more
        self.exhausted: str | None = None

    def error(self, where: str, reply: Reply, what: str = "") -> EnvError:
        """The EnvError for a failed request: the endpoint, the HTTP status and the guest's own error text;
        DisplayExhausted when the guest says its X server has no client slots left."""
        said = reply.message()
        if is_exhausted(reply.body.decode(errors="replace")):
            return self.exhaust(where, said)
        return EnvError(f"{what + ': ' if what else ''}{self.url}{where}: HTTP {reply.status}: {said}")

    def exhaust(self, where: str, said: str) -> DisplayExhausted:
        self.exhausted = exhausted_message(self.url, where, said)
        return DisplayExhausted(self.exhausted)

    def request(self, method: str, path: str, *, data: bytes | None = None, content_type: str | None = None,
                timeout: float | None = None, idempotent: bool = True, limit: int = MAX_READ + 1) -> Reply:
        """One request; any HTTP status is returned. Connection errors are retried (RETRY_DELAYS) when the
        request cannot have reached the guest (connection refused) or repeating it does no harm
        (`idempotent`, which also retries a 502, 503 or 504); a request that may have been performed (a click)
        is never sent twice."""
        if self.exhausted is not None:
            raise DisplayExhausted(self.exhausted)
        headers = {"Accept": "*/*"}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        delays = list(RETRY_DELAYS)
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                    return Reply(resp.status, resp.read(limit), resp.headers.get("Content-Type", ""),
                                 {name.lower(): value for name, value in resp.headers.items()})
            except urllib.error.HTTPError as exc:
                with exc:
                    reply = Reply(exc.code, exc.read(limit), exc.headers.get("Content-Type", "") if exc.headers else "")
                if exc.code in (502, 503, 504) and idempotent and delays:  # a proxy or display between restarts
                    time.sleep(delays.pop(0))
                    continue
                return reply
            except (urllib.error.URLError, OSError, HTTPException) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                refused = isinstance(reason, ConnectionRefusedError)
                if isinstance(reason, (TimeoutError, socket.timeout)) and not idempotent:
                    raise Unreachable(f"{self.url}{path}: no answer within {timeout or self.timeout:g} s") from None
                if not delays or not (refused or idempotent):
                    raise Unreachable(f"{self.url}{path}: {reason or type(exc).__name__}") from None
                time.sleep(delays.pop(0))

    def post_json(self, path: str, payload: dict[str, Any], **kw: Any) -> Reply:
        return self.request("POST", path, data=json.dumps(payload).encode(), content_type="application/json", **kw)


    def execute(self, command: list[str] | str, *, shell: bool, timeout: float) -> dict[str, Any]:
        """POST /execute; the guest's JSON result (status "success"). Anything else is an EnvError here:
        callers that run an agent's action turn a refusal into ActionFailed themselves."""
        reply = self.post_json("/execute", {"command": command, "shell": shell, "timeout": timeout},
                               timeout=timeout + self.timeout, idempotent=False, limit=4 * MAX_OUTPUT)
        data = reply.json()
        if reply.status != 200 or not isinstance(data, dict) or data.get("status") != "success":
            error = self.error("/execute", reply)
            raise error if isinstance(error, DisplayExhausted) else Refused(str(error))
        said = f"{data.get('error') or ''}\n{data.get('output') or ''}"
        if data.get("returncode") != 0 and is_exhausted(said):
            raise self.exhaust("/execute", tail(said))
        return data

    def screen_size(self) -> tuple[int, int]:
        reply = self.request("POST", "/screen_size", data=b"")
        data = reply.json()
        if reply.status != 200 or not isinstance(data, dict):
            raise self.error("/screen_size", reply)
        try:
            return int(data["width"]), int(data["height"])
        except (KeyError, TypeError, ValueError):
            raise EnvError(f"{self.url}/screen_size: unexpected answer {reply.body[:200]!r}") from None

    def alive(self) -> bool:
        try:
            self.request("GET", "/platform", timeout=min(self.timeout, 10.0))
        except EnvError:
            return False
        return True


def multipart_body(fields: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, str]:
    """A multipart/form-data body (urllib has no encoder for it) and its Content-Type."""
    boundary = f"retrace-{uuid.uuid4().hex}"
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        out.write(value.encode() + b"\r\n")
    for name, data in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n'
                  "Content-Type: application/octet-stream\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"



def home_relative(path: str) -> str:
    """GUEST_HOME/... as ~/...: the guest's own home may be elsewhere (OSWorld's is /home/user too)."""
    if path == GUEST_HOME or path.startswith(GUEST_HOME + "/"):
        return "~" + path[len(GUEST_HOME):]
    return path


def guest_path(path: str) -> str:
    """A task's file path as the guest expands it: the task's home (GUEST_HOME, "~", relative paths) is "~"."""
    if path == "~" or path.startswith(("~/", "/")):
        return home_relative(path)
    return "~/" + path
