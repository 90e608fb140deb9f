"""Environments: one protocol, providers registered by name (inspect_ai style).

Lifecycle: ``start()`` once per worker, ``reset(task, files, masks=...)`` before each case, ``close()`` always.
Everything above this layer — replay, evaluators, the dataset pipeline, agents — talks to the protocol only,
so a docker container or an OSWorld VM can stand in for the local desktop without touching them. Setup steps
(envs/steps.py) are interpreted once, over protocol methods, by :func:`envs.setup.apply_setup`
for every provider.

Providers are registered by name with a lazy import (``pytest --help`` never pays for the docker SDK) and can
come from other packages through the ``pytest_retrace.environments`` entry point group. A provider's factory
takes the harness's keywords (``size``, ``settle``, ``network``, ``hide``) and its own options, which come
from ``--retrace-env-option KEY=VALUE`` or an ``envs/NAME.yaml`` config (envs/config.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pytest_retrace.registry import Registry

if TYPE_CHECKING:
    import numpy as np

    from pytest_retrace.actions import Action
    from pytest_retrace.envs.steps import TaskSetup
    from pytest_retrace.screen.frames import Rect
    from pytest_retrace.screen.settle import Settled

ENTRY_POINT_GROUP = "pytest_retrace.environments"


class EnvError(RuntimeError):
    """The environment itself failed (crashed display, app that never showed up): an infra error."""


class ActionFailed(EnvError):
    """One action could not be completed while the environment itself stayed healthy (it asked for
    something the desktop cannot do in time). From an agent under test this is the agent's failure; from
    a ground-truth replay it is a desync, an infrastructure error."""


class DisplayBlocked(EnvError):
    """The X server is alive but answered no request within its deadline: an X client holds a server grab
    (``XGrabServer``), which only the task's processes can have taken. Every later call into that display fails
    at once with this error until ``reset`` gives the task a new server: a worker never waits on a grab."""


class FileRefused(Exception):
    """A file of the task an evaluator may not read: not a regular file (FIFO, device, socket, directory),
    over the size cap, or reached through a link out of the task's home and /tmp. It exists and the agent
    made it so: the check scores 0 with this message as its reason (never an infrastructure error)."""


def check_on_screen(action: Action, size: tuple[int, int]) -> None:
    """Every provider's first check of an action: its points lie on the screen (ActionFailed otherwise)."""
    w, h = size
    for x, y in ((action.x, action.y), (action.x2, action.y2)):
        if x is not None and (x >= w or y >= h):
            raise ActionFailed(f"{action.describe()}: ({x}, {y}) is outside the {w}x{h} screen")


@dataclass(frozen=True)
class CommandResult:
    """Outcome of a shell command run inside an environment."""

    returncode: int
    stdout: str
    stderr: str


@runtime_checkable
class Environment(Protocol):
    """Everything replay, the evaluators and the dataset pipeline use of an environment."""

    name: str
    size: tuple[int, int]

    def start(self) -> None: ...

    def reset(self, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
        """A fresh task: the desktop as new (nothing of the previous task survives), the network as the task
        asks, then the task's setup steps (``apply_setup``; a file step's ``src`` is read below ``files``).
        ``masks`` are the regions settling ignores until the next reset (a clock, a blinking cursor)."""
        ...

    def execute(self, action: Action) -> Settled:
        """Perform one action and wait until the screen settles (settle.py: for the action's effect to start,
        then for quiet); return how long that took and whether the screen really settled before the cap.
        Raises ActionFailed when the action cannot complete but the environment is fine, EnvError otherwise."""
        ...

    def settle(self, before: np.ndarray | None = None) -> Settled:
        """Wait until the screen is stable (masked regions ignored); ``before``: the screen before an action
        whose effect to wait for."""
        ...

    def screenshot(self) -> np.ndarray: ...

    def cursor_position(self) -> tuple[int, int]: ...

    def task_cpu_seconds(self) -> float | None:
        """CPU time the task's processes have used so far (user and system); None where the environment cannot
        tell (an OSWorld VM's server has no such request). A setup's settle step waits on it for the task's
        apps to go idle, not only quiet: a busy app can drop the first input (setup.py)."""
        ...

    def launch(self, command: list[str] | str, window: str | None = None, timeout: float = 30.0) -> None:
        """Start an app of the task; with ``window``, wait until a window matching that regex shows."""
        ...

    def read_file(self, path: str) -> bytes | None:
        """A regular file of the task; None if it does not exist; raises FileRefused for anything else."""
        ...

    def write_file(self, path: str, data: bytes) -> None: ...

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        """A shell command inside the task (as the task's user); a timeout is returncode 124."""
        ...

    def harness_fault(self) -> str | None:
        """What failed of the harness's own machinery (its X server dead, the container gone, the guest not
        answering), or None when all of it is alive: then whatever goes wrong after the agent acted comes from
        the state the agent left, and is the agent's failure (replay/result.py, blame)."""
        ...

    def close(self) -> None: ...


def harness_fault(env: Environment) -> str | None:
    """``env.harness_fault()``; a provider without the check cannot tell its own faults from the task's, and so
    every failure is called the harness's (an error, as before the check existed)."""
    check = getattr(env, "harness_fault", None)
    if check is None:
        return f"the {env.name} environment cannot tell its own faults from the task's"
    return check()


def check_port(port: object) -> int:
    """A TCP port number (1-65535), or ValueError naming the value."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port: a TCP port number 1-65535, got {port!r}")
    return port


def forward(env: Environment, port: int) -> int:
    """The port of the harness's 127.0.0.1 relayed to TCP `port` of the desktop: ``env.forward(port)``, an
    optional capability, used by OSWorld's chrome setup steps and getters (Chrome's DevTools, behind the tasks'
    own ``socat`` on 9222). xvfb relays the task's own loopback (each task has a network namespace of its own);
    docker and remote relay the guest's address, where a port the task listens on all addresses (socat's) is
    reached, as OSWorld's harness reaches its VM's (envs/ports.py). Until the next reset or close. A provider
    without it is an EnvError naming the provider."""
    method = getattr(env, "forward", None)
    if method is None:
        raise EnvError(f"the {env.name} environment cannot reach a port of its desktop (no forward())")
    return method(port)


def _installed(group: str) -> Iterable[EntryPoint]:
    # Looked up through this module's own name at each call, so a test can stand in for the installed
    # distributions by patching ``envs.entry_points``.
    return entry_points(group=group)


# name -> a factory or the "module:attribute" of one, imported lazily (pytest_retrace.registry).
ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment provider", ENTRY_POINT_GROUP, {
    "xvfb": "pytest_retrace.envs.xvfb.environment:XvfbEnvironment",
    "remote": "pytest_retrace.envs.remote.environment:RemoteEnvironment",
    "docker": "pytest_retrace.envs.docker.environment:DockerEnvironment",
}, entry_points=_installed)
PROVIDERS = ENVIRONMENTS.targets  # the same dict: code that registers or pops through it keeps working


def register_environment(name: str, target: str | Callable[..., Environment]) -> None:
    ENVIRONMENTS.register(name, target)


def provider_names() -> list[str]:
    return ENVIRONMENTS.names()


def environment_factory(name: str) -> Callable[..., Environment]:
    """The provider's factory; an unknown name or a broken entry point is a ValueError (RegistryError) that
    names the provider and the known ones."""
    return ENVIRONMENTS.get(name)


def create_environment(name: str, **options: Any) -> Environment:
    return environment_factory(name)(**options)
