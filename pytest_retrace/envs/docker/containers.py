"""The docker provider's desktop containers: what it keeps of one, waiting for its guest, its state, leftovers."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.docker.logs import LogTail, container_logs

LABEL = "pytest-retrace"


@dataclass
class Container:
    id: str
    stdin: Any  # the attached stdin whose closing ends the container
    url: str  # of its guest
    token: str
    network: str  # the docker network it is on
    accessibility: bool = False  # started with --accessibility: the task's AT-SPI buses (guest/container.py)
    logs: LogTail | None = None  # its output, followed: auto-remove deletes the logs of a container that exits


def state(api: Any, container: str) -> str:
    try:
        return api.inspect_container(container)["State"]["Status"]
    except Exception:  # noqa: BLE001 - gone (auto-removed) or the engine failed
        return "removed"


def wait_ready(api: Any, box: Container, timeout: float) -> None:
    """Until the container's guest answers /health; EnvError (with the container's output) if it exits first or
    does not answer within `timeout` seconds."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(box.url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        now = state(api, box.id)
        if now not in ("running", "created"):
            raise EnvError(f"docker: the desktop container exited ({now}) before serving: "
                           f"{container_logs(api, box.id, box.logs)}")
        if time.monotonic() > deadline:
            raise EnvError(f"docker: the desktop container did not serve within {timeout:g} s: "
                           f"{container_logs(api, box.id, box.logs)}")
        time.sleep(0.05)


def remove_leftovers(client: Any) -> None:
    """Containers of owners that died on this machine without closing (stdin-once normally ends them)."""
    me = socket.gethostname()
    # ignore_removed: another worker's container can auto-remove between the listing and its inspection
    mine = client.containers.list(all=True, filters={"label": f"{LABEL}=desktop"}, ignore_removed=True)
    for container in mine:
        owner_host, _, pid = container.labels.get(f"{LABEL}.owner", "").rpartition(":")
        if owner_host == me and pid.isdigit() and not _pid_alive(int(pid)):
            with contextlib.suppress(Exception):  # already going (auto-remove)
                container.remove(force=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
