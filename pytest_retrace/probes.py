"""Error-state probes: a check of a case's state beyond its pixels (a file's hash, a command's output).

An error screen equal to its target screen proves nothing about the perturbation: the harness could not tell
whether it took effect. A probe is a getter whose value the case recorded at s_target; replay requires the
value to differ after the perturbation (part of verifying s_error: otherwise the perturbation did not happen,
an infrastructure problem) and records whether it equals the target value again after the recovery (the
oracle's restore must bring it back, the noop baseline must not).

The metric is equality of digests: a value is ``sha256:<hex>`` of the file's bytes (or of ``missing``), or
of a command's exit status and output, so a case file stays small whatever the getter returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from .setup_steps import Line, Text, Timeout

if TYPE_CHECKING:
    from .envs import Environment

Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FileGetter(_Model):
    """A file of the task (``~/…``): its bytes, or that it is missing."""

    type: Literal["file"]
    path: Line

    def describe(self) -> str:
        return f"file {self.path}"


class CommandGetter(_Model):
    """A shell command run in the task (as the task's user, in its home): its exit status and stdout."""

    type: Literal["command"]
    command: Text
    timeout: Timeout = 10.0

    def describe(self) -> str:
        return f"command {self.command!r}"


Getter = Annotated[FileGetter | CommandGetter, Field(discriminator="type")]


class Probe(_Model):
    get: Getter
    target: Digest  # the getter's value at s_target

    def describe(self) -> str:
        return self.get.describe()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def settled_values(env: Environment, getters: list[FileGetter | CommandGetter], gap: float = 0.5,
                   timeout: float = 4.0) -> list[str]:
    """The getters' values once they hold still: read until two reads `gap` seconds apart agree (at most
    `timeout`). An app may write what an action changed a moment after its screen settled (GSettings' keyfile
    is written on a timer): a value read too early is not the state's value, and the build's target value
    read early while a recovery's is read late would make a restored probe look unrestored."""
    import time

    deadline = time.monotonic() + timeout
    values = [probe_value(env, g) for g in getters]
    while time.monotonic() < deadline:
        time.sleep(gap)
        again = [probe_value(env, g) for g in getters]
        if again == values:
            break
        values = again
    return values


def poll(env: Environment, getters: Sequence[FileGetter | CommandGetter], done: Callable[[list[str]], bool],
         timeout: float, interval: float = 0.2) -> list[str]:
    """The getters' values, read again every `interval` seconds until `done(values)` or `timeout`: an app may
    write what an action changed a moment after its screen settled, so a check of a probe waits for it."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        values = [probe_value(env, g) for g in getters]
        if done(values) or time.monotonic() >= deadline:
            return values
        time.sleep(interval)


def probe_value(env: Environment, getter: FileGetter | CommandGetter) -> str:
    """The getter's current value in `env`. EnvError propagates (the environment failed, not the case)."""
    from .envs import FileRefused

    if isinstance(getter, FileGetter):
        try:
            data = env.read_file(getter.path)
        except FileRefused as exc:
            return digest(f"refused: {exc}".encode())
        return digest(b"missing" if data is None else b"file:" + data)
    got = env.run(getter.command, timeout=getter.timeout)
    return digest(f"{got.returncode}\n".encode() + got.stdout.encode())


# Probes every candidate is tried with (the build, `retrace record`), besides the ones a mistake or rollout
# names and the files the task's evaluator reads. What changed in the task's files, wherever (caches left
# out: an app writes them at will) ...
HOME_FILES = CommandGetter(type="command", command="find . -path ./.cache -prune -o -type f -print0 | LC_ALL=C sort -z "
                                                   "| xargs -0 -r sha256sum")
# ... and where the task's processes are: a shell's working directory (`cd`) shows nowhere else
PROCESS_DIRS = CommandGetter(type="command", command="for p in /proc/[0-9]*; do readlink $p/cwd; done | sort -u")


def standard_getters(evaluator_files: list[str]) -> list[FileGetter | CommandGetter]:
    return [*(FileGetter(type="file", path=path) for path in evaluator_files), PROCESS_DIRS, HOME_FILES]


def narrowest(found: list[Probe], keep: int = 2) -> list[Probe]:
    """What a case carries: the most specific probes that told its states apart; the whole home's digest only
    when nothing narrower did (it changes with anything, so it says least about what the mistake did)."""
    narrow = [q for q in found if q.get != HOME_FILES]
    return narrow[:keep] or found[:1]
