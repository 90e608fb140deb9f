"""The ``docker`` environment: each case on a fresh container of the desktop image, through the docker SDK.

- **The image** is built on the engine from the recipe in the repository (envs/docker/image.py: an mmdebstrap root
  filesystem, ``docker import``, then this package and the home template), once, and reused while the recipe
  and the source are unchanged. Inside, ``guest/container.py`` builds the same desktop as the xvfb provider
  (envs/desktop.py) and serves it with ``retrace guest``; this provider talks to it exactly as the remote
  provider talks to an OSWorld VM (it *is* a RemoteEnvironment per container: screenshots, files, commands,
  setup), so both paths are the same code; actions are the xvfb provider's own xdotool commands
  (envs/xdotool.py) sent through /execute, so the X server sees the same events as on the local desktop.
- **Reset recreates the container** from the image: nothing of the previous case can survive (files, processes,
  X server state, anything the agent changed anywhere in the container's file system). With ``spare`` (the
  default) the next case's container is created and booted *inside* each reset, while the reset prepares the
  current one (its files, its app, the settle), and the reset waits for both: the next reset takes it as is.
  Untouched but by its own boot, it is what a container created at that reset would be; its boot is over
  before the case's prefix replays (booted while the case ran instead, a timing-sensitive built-in case
  desynced in 4 of 12 replays at -n 8). Measured cost in benchmarks/bench_docker.py.
- **Accessibility**: a task with ``accessibility`` (its judge reads the AT-SPI tree) gets a container started with
  ``--accessibility`` (guest/container.py: its own session and AT-SPI buses, bridges on), never the spare (made
  without); the tree is read with pyatspi, which the ``osworld`` variant has. Measured cost in docs/osworld.md.
- **One container per worker** at a time, on the worker's engine: ``hosts`` is a list of engines
  (``unix:///var/run/docker.sock``, ``tcp://10.0.0.5:2376``, ``ssh://user@host``), worker ``gwN`` uses
  ``hosts[N % len(hosts)]``; without it, ``DOCKER_HOST`` (and ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``) or
  the local socket, as the docker CLI.
- **Limits**: memory, CPUs and process count per container; every capability dropped but the five the guest
  needs to run the task as its unprivileged user; ``no-new-privileges``.
- **Network**: a task without network is on an ``internal`` docker network (no route out; measured: a connect
  to an outside address times out) and reached at its container address, which only the engine's own machine
  can reach. On a remote engine the guest's port is published instead, which needs a non-internal network: a
  remote engine's containers have the network of its default bridge (docs/environments.md).
- **Cleanup**: every container is labelled ``pytest-retrace=desktop`` with its owner (host and pid) and run
  id, created with auto-remove, and removed at every reset and close. If the worker dies without closing
  (SIGKILL, a crash), the container still goes: it is created with stdin open and attached once, so when the
  worker's connection drops the engine closes the container's stdin and its entry point exits. Leftovers of
  dead owners on this machine are removed at the next start.

Options (``--retrace-env-option KEY=VALUE`` or ``envs/NAME.yaml``): ``image`` (a prebuilt desktop image, not
built here), ``hosts``, ``memory`` (``"4g"`` or bytes), ``cpus``, ``pids_limit``, ``timeout`` (seconds one
request to the guest may take), ``ready_timeout`` (seconds a new container may take to serve), ``spare``
(boot the next case's container during this one's reset; default true), ``variant`` (``osworld``: the image with
OSWorld's apps, envs/docker/desktop-image/packages-osworld.txt; default ``default``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_retrace.actions import Action
from pytest_retrace.envs import CommandResult, EnvError, check_on_screen
from pytest_retrace.envs.docker.containers import LABEL, Container, remove_leftovers, state, wait_ready
from pytest_retrace.envs.docker.image import check_variant
from pytest_retrace.envs.docker.logs import LogTail, container_logs
from pytest_retrace.envs.docker.options import parse_hosts, parse_memory
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.remote.pool import worker_index
from pytest_retrace.envs.steps import TaskSetup
from pytest_retrace.envs.xdotool import commands, typable
from pytest_retrace.screen.frames import DEFAULT_SCREEN, Rect
from pytest_retrace.screen.settle import SettleConfig, Settled

GUEST_PORT = 5000
GUEST_PYTHON = "/opt/retrace/bin/python"
TOKEN_VARIABLE = "RETRACE_GUEST_TOKEN"  # guest/container.py
UID_VARIABLE = "RETRACE_TASK_UID"  # guest/container.py: the task's uid, one per container (process limits are per uid)
TASK_UID_BASE, TASK_UIDS = 2_000_000_000, 100_000_000  # above envs/xvfb/sandbox.py's per-display uids
NETWORKS = {"none": "pytest-retrace-isolated", "host": "pytest-retrace-open"}
# What the guest (root in the container) needs to run the task as `user` and serve its files; nothing else.
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]
_log = logging.getLogger(__name__)
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


class DockerEnvironment:
    name = "docker"

    def __init__(self, size: tuple[int, int] = DEFAULT_SCREEN, settle: SettleConfig | None = None,
                 network: str = "none", hide: Sequence[Path | str] = (), image: str | None = None,
                 hosts: str | Sequence[str] | None = None, memory: int | str = "4g", cpus: float = 2.0,
                 pids_limit: int = 4096, timeout: float = 30.0, ready_timeout: float = 60.0, spare: bool = True,
                 variant: str = "default") -> None:
        if network not in NETWORKS:
            raise ValueError(f"network: {network!r} is not one of {', '.join(NETWORKS)}")
        self.size = (int(size[0]), int(size[1]))
        self.settle_cfg = settle or SettleConfig()
        self.network = network
        self.hide = tuple(hide)  # nothing of this machine is in the container to hide
        self.image = image
        self.variant = check_variant(variant)
        if image is not None and variant != "default":
            raise ValueError(f"variant: {variant!r} builds its own image; image={image!r} names a prebuilt one: "
                             "give one of the two")
        self.hosts = parse_hosts(hosts)
        self.memory = parse_memory(memory)
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0:
            raise ValueError(f"cpus: a positive number, got {cpus!r}")
        self.cpus = float(cpus)
        if isinstance(pids_limit, bool) or not isinstance(pids_limit, int) or pids_limit < 64:
            raise ValueError(f"pids_limit: an integer of at least 64, got {pids_limit!r}")
        self.pids_limit = pids_limit
        for key, value in (("timeout", timeout), ("ready_timeout", ready_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{key}: a positive number of seconds, got {value!r}")
        self.timeout = float(timeout)
        self.ready_timeout = float(ready_timeout)
        if not isinstance(spare, bool):
            raise ValueError(f"spare: true or false, got {spare!r}")
        self.engine = ""
        self._client: Any = None
        self.spare = spare
        self._current: Container | None = None  # the current case's
        self._spare: Container | None = None  # the next case's, booted
        self._guest: RemoteEnvironment | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            import docker
        except ImportError:
            raise EnvError("the docker provider needs the docker SDK: pip install 'pytest-retrace[docker]'") from None
        host = self.hosts[worker_index() % len(self.hosts)] if self.hosts else os.environ.get("DOCKER_HOST", "")
        self.engine = host or "local"
        try:
            environment = {**os.environ, "DOCKER_HOST": host} if host else None
            self._client = docker.from_env(environment=environment, timeout=120)
            self._client.ping()
        except Exception as exc:  # noqa: BLE001 - the SDK raises DockerException, requests' and socket errors
            raise EnvError(f"docker engine {self.engine}: cannot connect: {exc}") from None
        remove_leftovers(self._client)
        if self.image is None:
            from pytest_retrace.envs.docker.image import ensure_image

            self.image = ensure_image(self._client, self.engine, self.variant)
        else:
            import docker.errors

            try:
                self._client.images.get(self.image)
            except docker.errors.ImageNotFound:
                raise EnvError(f"docker engine {self.engine}: no image {self.image!r}") from None
        for mode, name in NETWORKS.items():
            self._network(name, internal=mode == "none")

    @property
    def _remote_engine(self) -> bool:
        return urllib.parse.urlsplit(self.engine).scheme in ("tcp", "ssh", "http", "https")

    def _network(self, name: str, internal: bool) -> None:
        import docker.errors

        # docker allows several networks of one name, and a container started on a name with two fails
        # ("ambiguous"): 8 workers starting on a fresh engine made 8. A lock on this machine serialises check and
        # create; workers on other machines are caught by keeping the oldest of the name and removing the rest.
        with open(os.path.join(tempfile.gettempdir(), "pytest-retrace-docker-network.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._client.networks.list(names=[name]):
                with contextlib.suppress(docker.errors.APIError):
                    self._client.networks.create(name, driver="bridge", internal=internal, labels={LABEL: "network"})
            same = [n for n in self._client.networks.list(names=[name]) if n.name == name]
            same.sort(key=lambda n: (n.attrs.get("Created", ""), n.id))
            for extra in same[1:]:
                with contextlib.suppress(docker.errors.APIError):  # in use by a container: it stays
                    extra.remove()

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        if self._client is None:
            raise EnvError("the environment is not started")
        previous, self._current = self._current, None
        if self._guest is not None:
            self._guest.close()  # its relays (forward) reach the container about to go
        self._guest = None
        net = self._network_for("host" if task.network or self.network == "host" else "none")
        spare, self._spare = self._spare, None
        if spare is not None and (spare.network, spare.accessibility) != (net, task.accessibility):
            self._remove(spare)  # made for the other network, or without the buses this task's judge reads
            spare = None
        if spare is None:
            self._remove(previous)
            previous, spare = None, self._start(net, task.accessibility)
            self._current = spare  # removed at the next reset or close even if it never serves
            self._wait_ready(spare)
        box = self._current = spare
        # the previous container goes and (with spare) the next case's boots while this one is prepared: only
        # that thread uses the docker client until it is joined, before the reset returns and the case starts
        after = threading.Thread(target=self._next_container, args=(previous,),
                                 name="retrace-docker-spare", daemon=True)
        after.start()
        try:
            guest = RemoteEnvironment(size=self.size, settle=self.settle_cfg, urls=[box.url], timeout=self.timeout,
                                      python=GUEST_PYTHON)
            guest.attach(box.url, box.token, probe=False)
            self._guest = guest
            guest.prepare(task, files, masks)  # a new container: no key held, the pointer parked by its boot
        finally:
            after.join()

    def _next_container(self, previous: Container | None) -> None:
        """Remove `previous`; with spare, start the next case's container and wait until it serves. A spare that
        does not come up is dropped, and the next reset starts its own (where the engine's fault is its error)."""
        self._remove(previous)
        if not self.spare:
            return
        box = None
        try:
            box = self._start(self._network_for("none"))
            self._wait_ready(box)
        except Exception as exc:  # noqa: BLE001 - EnvError, or the engine's own errors
            _log.warning("docker: the spare container was dropped: %s", exc)
            self._remove(box)
            return
        self._spare = box

    def _network_for(self, network: str) -> str:
        return NETWORKS["host" if self._remote_engine else network]

    def _start(self, net: str, accessibility: bool = False) -> Container:
        """Create, attach and start a container on the docker network `net` (not waiting for its guest); with
        `accessibility`, its entry point starts the task's AT-SPI buses before serving."""
        api = self._client.api
        token = secrets.token_hex(24)
        remote = self._remote_engine
        host_config = api.create_host_config(
            auto_remove=True, mem_limit=self.memory, memswap_limit=self.memory, nano_cpus=int(self.cpus * 1e9),
            pids_limit=self.pids_limit, cap_drop=["ALL"], cap_add=CAPABILITIES, security_opt=["no-new-privileges"],
            network_mode=net, shm_size=256 << 20,  # init: the image runs tini itself
            port_bindings={GUEST_PORT: ("0.0.0.0", None)} if remote else None)  # noqa: S104 - remote engines: token-guarded
        w, h = self.size
        created = api.create_container(
            self.image, ["--size", f"{w}x{h}", "--exit-on-stdin-eof", *(["--accessibility"] if accessibility else [])],
            stdin_open=True, detach=False, tty=False,
            environment={TOKEN_VARIABLE: token, UID_VARIABLE: str(TASK_UID_BASE + secrets.randbelow(TASK_UIDS))},
            host_config=host_config, ports=[GUEST_PORT] if remote else None,
            labels={LABEL: "desktop", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}",
                    f"{LABEL}.run": _RUN_ID, f"{LABEL}.worker": os.environ.get("PYTEST_XDIST_WORKER", "")})
        box = Container(created["Id"], None, "", token, net, accessibility)
        try:
            # attached before start: when this socket closes (close(), or this process dying), stdin closes
            # (StdinOnce), the entry point exits and auto-remove deletes the container
            box.stdin = api.attach_socket(box.id, params={"stdin": 1, "stream": 1})
            api.start(box.id)
            box.logs = LogTail(api, box.id)
            info = api.inspect_container(box.id)
            if remote:
                binding = (info["NetworkSettings"]["Ports"].get(f"{GUEST_PORT}/tcp") or [{}])[0]
                address, port = urllib.parse.urlsplit(self.engine).hostname or "localhost", binding.get("HostPort")
            else:
                address, port = info["NetworkSettings"]["Networks"][net]["IPAddress"], GUEST_PORT
        except BaseException:
            self._remove(box)
            raise
        box.url = f"http://{address}:{port}"
        return box

    def _wait_ready(self, box: Container) -> None:
        wait_ready(self._client.api, box, self.ready_timeout)

    def _state(self, container: str) -> str:
        return state(self._client.api, container)

    def _logs(self, box: Container) -> str:
        return container_logs(self._client.api, box.id, box.logs)

    def _remove(self, box: Container | None) -> None:
        if box is None:
            return
        with contextlib.suppress(Exception):  # already gone: auto-remove, or its stdin closed it
            self._client.api.remove_container(box.id, force=True)
        if box.stdin is not None:
            with contextlib.suppress(OSError):
                box.stdin.close()

    def close(self) -> None:
        if self._client is None:
            return
        try:
            for box in (self._current, self._spare):
                self._remove(box)
            if self._guest is not None:
                self._guest.close()
            self._current = self._spare = self._guest = None
        finally:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # -- the protocol, through the container's guest -------------------------------------------------
    @property
    def guest(self) -> RemoteEnvironment:
        if self._guest is None:
            raise EnvError("no container: reset first")
        return self._guest

    @property
    def container_id(self) -> str | None:
        return self._current.id if self._current is not None else None

    def harness_fault(self) -> str | None:
        """The container gone, its guest not answering, or its X server dead: Xvfb runs as the container's root,
        which the task's user cannot signal, so only a root Xvfb process counts (a task can name one of its own
        processes Xvfb, never make it root's)."""
        if self._current is None:
            return "no container"
        if (state := self._state(self._current.id)) != "running":
            return f"the desktop container is {state}: {self._logs(self._current)}"
        if (fault := self.guest.harness_fault()) is not None:
            return fault
        try:
            found = self.guest.run("pgrep -u 0 -x Xvfb >/dev/null", timeout=10)
        except EnvError as exc:
            return f"the guest could not be asked for its X server: {exc}"
        return None if found.returncode == 0 else "the container's X server is not running"

    def execute(self, action: Action) -> Settled:
        """The xvfb provider's xdotool commands (envs/xdotool.py), run in the container through /execute: the
        same events as on the local desktop, without a Python start per action (measured: 0.63 s per action
        with pyautogui's path, benchmarks/bench_docker.py). Text the keymap lacks takes pyautogui's path."""
        guest = self.guest
        check_on_screen(action, self.size)
        if action.kind == "type" and not typable(action.text):
            return guest.execute(action)
        before = guest.screenshot()
        if action.kind == "wait":
            time.sleep(action.seconds)
        for args, timeout in commands(action):
            guest.perform(["xdotool", *args], action.describe(), timeout)
        return guest.settle(before)

    def forward(self, port: int) -> int:
        """A loopback port relayed to `port` at the container's address (``RemoteEnvironment.forward``), where the
        task listens on all addresses (OSWorld's socat on 9222). A remote engine publishes the guest's port alone."""
        if self._remote_engine:
            raise EnvError(f"docker engine {self.engine}: only the guest's port is published, not port {port}")
        return self.guest.forward(port)

    def settle(self, before: np.ndarray | None = None) -> Settled:
        return self.guest.settle(before)

    def screenshot(self) -> np.ndarray:
        return self.guest.screenshot()

    def cursor_position(self) -> tuple[int, int]:
        return self.guest.cursor_position()

    def task_cpu_seconds(self) -> float | None:
        return self.guest.task_cpu_seconds()

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        self.guest.launch(command, window, timeout)

    def read_file(self, path: str) -> bytes | None:
        return self.guest.read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        self.guest.write_file(path, data)

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        return self.guest.run(command, timeout)
