"""Environments: one protocol, several small providers (xvfb today; docker and remote next).

Lifecycle (inspect_ai style): ``start()`` once per worker, ``reset(task, case_dir)`` before each case,
``close()`` always.  Everything above this layer (replay, evaluators, agents) talks to the protocol only,
so a docker container or an OSWorld VM can be swapped in without touching them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from ..actions import Action
    from ..cases import Task
    from ..evaluators import CommandResult


class EnvError(RuntimeError):
    """The environment itself failed (crashed display, app that never showed up): an infra error."""


class ActionFailed(EnvError):
    """One action could not be completed while the environment itself stayed healthy (it asked for
    something the desktop cannot do in time). From an agent under test this is the agent's failure; from
    a ground-truth replay it is a desync, an infrastructure error."""


class FileRefused(Exception):
    """A file of the task an evaluator may not read: not a regular file (FIFO, device, socket, directory),
    over the size cap, or reached through a link out of the task's home and /tmp. It exists and the agent
    made it so: the check scores 0 with this message as its reason (never an infrastructure error)."""


@runtime_checkable
class Environment(Protocol):
    name: str
    size: tuple[int, int]

    def start(self) -> None: ...
    def reset(self, task: Task, case_dir: Path) -> None: ...
    def execute(self, action: Action) -> float:
        """Perform one action and wait until the screen settles; return the settle time in seconds.
        Raises ActionFailed when the action cannot complete but the environment is fine, EnvError otherwise."""
        ...

    def screenshot(self) -> np.ndarray: ...
    def cursor_position(self) -> tuple[int, int]: ...
    def read_file(self, path: str) -> bytes | None:
        """A regular file of the task; None if it does not exist; raises FileRefused for anything else."""
        ...

    def write_file(self, path: str, data: bytes) -> None: ...
    def run(self, command: str, timeout: float = 30.0) -> CommandResult: ...
    def close(self) -> None: ...


# name -> "module:attribute"; imported lazily so `pytest --help` never pays for a provider's deps.
PROVIDERS: dict[str, str] = {
    "xvfb": "pytest_retrace.envs.xvfb:XvfbEnvironment",
}


def register_environment(name: str, target: str | Callable[..., Environment]) -> None:
    PROVIDERS[name] = target  # type: ignore[assignment]


def create_environment(name: str, **options: Any) -> Environment:
    try:
        target: Any = PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(PROVIDERS))}") from None
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target(**options)
