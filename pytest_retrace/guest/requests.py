"""What the guest's handlers share: the error shape, and checking a request's fields before anything runs.

A bad request is answered ``{"status": "error", "error": MESSAGE, "message": MESSAGE}`` (``message`` too
because OSWorld's own errors use that key) with a 4xx: `bad_request` raises it, `error_response` builds it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pytest_retrace.text import show


def _error_body(message: str) -> dict[str, str]:
    return {"status": "error", "error": message, "message": message}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(_error_body(message), status_code=status, headers=headers)


def bad_request(status: int, message: str) -> Exception:
    from starlette.exceptions import HTTPException

    return HTTPException(status_code=status, detail=message)


async def json_object(request: Any) -> dict[str, Any]:
    body = await request.body()
    if not body.strip():
        raise bad_request(400, "the request needs a JSON object body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad_request(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise bad_request(400, f"the JSON body must be an object, got {type(data).__name__}")
    return data


def expand_home(arg: str, home: Path | str) -> str:
    """``~`` and ``~/...`` are the home (OSWorld expands ``~/`` in command arguments and every path)."""
    return str(home) + arg[1:] if arg == "~" or arg.startswith("~/") else arg


def command_field(data: dict[str, Any], home: Path | str) -> tuple[list[str] | str, bool]:
    """The ``command`` and ``shell`` fields, checked; a string without shell is split like OSWorld does."""
    shell = data.get("shell", False)
    if not isinstance(shell, bool):
        raise bad_request(400, f"shell must be true or false, got {show(shell)}")
    if "command" not in data:
        raise bad_request(400, "command is required: a list of arguments, or a string")
    command = data["command"]
    if isinstance(command, str):
        if not command.strip():
            raise bad_request(400, "command is empty")
        if "\0" in command:
            raise bad_request(400, "command must not contain a NUL character")
        if shell:
            return command, True
        try:
            command = shlex.split(command)
        except ValueError as exc:
            raise bad_request(400, f"command cannot be split into arguments ({exc})") from None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise bad_request(400, f"command must be a list of strings or a string, got {show(command)}")
    if not command:
        raise bad_request(400, "command is empty")
    if any("\0" in a for a in command):
        raise bad_request(400, "command must not contain a NUL character")
    return [expand_home(a, home) for a in command], shell


def timeout_field(data: dict[str, Any], name: str, default: float, limit: float) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise bad_request(400, f"{name} must be a positive number of seconds, got {show(value)}")
    return min(float(value), limit)


def path_field(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(400, f"{name} must be a non-empty string, got {show(value)}")
    if "\0" in value:
        raise bad_request(400, f"{name} must not contain a NUL character")
    return value
