"""What a desktop container said (its entry point's stdout and stderr), for the docker provider's errors.

The containers are created with auto-remove: one that exits is deleted by the engine at once, and its logs with
it, so asking the engine after its exit found nothing (measured: "the desktop container exited (removing)
before serving: (no logs: the container is gone)", with the reason the entry point wrote to stderr lost). Each
container's logs are therefore followed from its start, in a thread of its own, and the last of them kept.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

KEEP = 1500  # characters of a container's output an error shows


class LogTail:
    """The last KEEP characters a container wrote, read as it writes them (``docker logs --follow``), until it is
    removed (the engine then ends the stream)."""

    def __init__(self, api: Any, container: str) -> None:
        self._api, self._container = api, container
        self._text = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, name=f"docker-logs-{container[:12]}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # removed, the client closed, or no line within its read timeout
            for chunk in self._api.logs(self._container, stream=True, follow=True):
                with self._lock:
                    self._text = (self._text + chunk)[-4 * KEEP:]

    def text(self, wait: float = 0.0) -> str:
        """What was kept; `wait`: seconds to let the stream end first (a removed container's last lines)."""
        self._thread.join(wait)
        with self._lock:
            return self._text.decode(errors="replace").strip()[-KEEP:]


def container_logs(api: Any, container: str, tail: LogTail | None) -> str:
    """The container's last lines: the engine's while it has the container, else what `tail` followed."""
    try:
        text = api.logs(container, tail=30).decode(errors="replace").strip()[-KEEP:]
    except Exception:  # noqa: BLE001 - removed already (auto-remove): what was followed is all there is
        text = ""
    return text or (tail.text(wait=2.0) if tail is not None else "") or "(no logs: the container is gone)"
