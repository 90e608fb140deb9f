"""``retrace guest``: the HTTP server that runs inside an environment (a container or VM desktop).

It speaks the subset of OSWorld's VM-server API (``desktop_env/server/main.py``, a Flask app on port 5000)
that the ``remote`` provider (envs/remote/) needs, with OSWorld's request and response shapes, so a real
OSWorld VM and a guest running this server are interchangeable for that provider:

    GET  /screenshot        PNG bytes of $DISPLAY
    POST /execute           {"command": [...] | "...", "shell": false} -> {"status", "output", "error", "returncode"}
    POST /file              form field file_path -> the file's bytes (404 when missing)
    POST /setup/upload      multipart: file_path + file_data
    POST /setup/launch      {"command": ..., "shell": ...}
    POST /setup/open_file   {"path": ...}
    GET  /platform          "Linux"
    POST /screen_size       {"width", "height"}
    GET  /cursor_position   [x, y]
    GET  /health            {"status": "ok"} (ours: OSWorld has no health check)
    GET  /task_cpu          {"seconds": CPU time of the task's processes so far} (ours: settling on idle)

Unlike OSWorld's server it binds 127.0.0.1 by default, takes a bearer token (and refuses a non-loopback
address without one), limits request bodies, command time and output, confines file reads and writes to the
home and /tmp, and answers every bad request with a JSON ``{"status": "error", "error": ...}`` and a 4xx.
See docs/environments.md.
"""

from __future__ import annotations

from pytest_retrace.guest.app import create_app
from pytest_retrace.guest.config import GuestConfig, GuestError, is_loopback
from pytest_retrace.guest.server import serve

__all__ = ["GuestConfig", "GuestError", "create_app", "is_loopback", "serve"]
