"""Setup steps: how a task's initial state is made (launch an app, write a file, run a command, bring a
window to the front, wait for the screen to settle).

The bottom layer, with actions: the case schema (cases.py) embeds these models, and every environment
provider is reset with a list of them, interpreted once over the Environment protocol (envs/setup.py), so a
docker container or a remote guest gets exactly the xvfb desktop's semantics. Paths are the guest's: ``~`` is
:data:`GUEST_HOME` in every provider.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from pytest_retrace.text import show

GUEST_HOME = "/home/user"  # the task's home in every environment; "~" in a step means it
MAX_TIMEOUT = 600.0  # seconds a setup step may wait


def text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    if "\0" in value:
        raise ValueError(f"must not contain a NUL character, got {show(value)}")
    return value


def one_line(value: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"must be one line without control characters, got {show(value)}")
    return value


Text = Annotated[str, AfterValidator(text)]
Line = Annotated[str, AfterValidator(text), AfterValidator(one_line)]
Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)]


class _Model(BaseModel):
    # strict: YAML `true` is not 1, "0" is not 0, 1 is not "1"
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class LaunchStep(_Model):
    """Start an application; wait until a window matching `window` (WM_CLASS or title regex) is visible."""

    type: Literal["launch"]
    command: list[str] | str
    window: Text | None = None
    timeout: Timeout = 30.0

    @field_validator("command", mode="before")  # before: one clear message instead of one per union member
    @classmethod
    def _argv(cls, command: Any) -> list[str] | str:
        if isinstance(command, str):
            try:
                argv = shlex.split(command)  # what the environment will do with it
            except ValueError as exc:
                raise ValueError(f"cannot be split into arguments ({exc}): {show(command)}") from None
        elif isinstance(command, list):
            argv = command
        else:
            raise ValueError(f"must be a list of arguments or a string, got {show(command)}")
        if not argv:
            raise ValueError(f"names no program: {show(command)}")
        for i, arg in enumerate(argv):
            if not isinstance(arg, str) or not arg or "\0" in arg:
                raise ValueError(f"argument {i} must be a non-empty string without NUL, got {show(arg)}")
        return command


class FileStep(_Model):
    """Write a file into the environment's home, from inline `content` or a `src` file next to the YAML."""

    type: Literal["file"]
    path: Text
    content: str | None = None
    src: Text | None = None

    @field_validator("path")
    @classmethod
    def _in_home(cls, path: str) -> str:
        if path.startswith("~/"):
            full = GUEST_HOME + path[1:]
        elif path.startswith("~"):  # ~other-user, or the home itself
            full = path
        else:
            full = posixpath.join(GUEST_HOME, path)  # an absolute path replaces the home
        # `..` is resolved lexically, the way the environment joins the path to its home
        if not posixpath.normpath(full).startswith(GUEST_HOME + "/"):
            raise ValueError(f"{show(path)} is outside the home: use ~/..., {GUEST_HOME}/... or a path "
                             "relative to the home")
        return path

    @model_validator(mode="after")
    def _one_source(self) -> FileStep:
        if (self.content is None) == (self.src is None):
            raise ValueError("give exactly one of 'content' or 'src'")
        return self


class CommandStep(_Model):
    """Run a shell command inside the environment (must exit 0)."""

    type: Literal["command"]
    command: Text
    timeout: Timeout = 30.0


class ActivateStep(_Model):
    """Bring a window to the front (OSWorld's ``activate_window``): the first visible window whose title — or,
    with `by_class`, WM_CLASS as ``instance.Class`` — contains `window` (ignoring case), or equals it with
    `exact`. Waits up to `timeout` seconds for such a window to show; none is an error."""

    type: Literal["activate"]
    window: Line  # titles and classes are one line
    exact: bool = False
    by_class: bool = False
    timeout: Timeout = 30.0


class SettleStep(_Model):
    """Wait until the screen has stayed unchanged for `quiet` seconds (the environment's masks applied), and
    then the task's processes have been idle for as long on that screen (where the environment can tell:
    envs/setup.py), at most `timeout` seconds in all; a screen still changing, or a task still working, then
    is an error. For apps that keep drawing after their window shows (LibreOffice fills in toolbars and the
    sidebar for seconds, with pauses longer than an action's settle window), and keep working after that: a
    condition, where a fixed ``sleep`` is too short on a loaded machine and wasted on an idle one."""

    type: Literal["settle"]
    quiet: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] = 1.5
    timeout: Timeout = 60.0

    @model_validator(mode="after")
    def _quiet_within_timeout(self) -> SettleStep:
        if self.quiet >= self.timeout:
            raise ValueError(f"quiet ({self.quiet:g} s) must be shorter than timeout ({self.timeout:g} s)")
        return self


AnyStep = LaunchStep | FileStep | CommandStep | ActivateStep | SettleStep
SetupStep = Annotated[AnyStep, Field(discriminator="type")]


class TaskSetup(Protocol):
    """What an environment needs of a task to make its initial state (cases.Task is one)."""

    @property
    def id(self) -> str: ...

    @property
    def setup(self) -> Sequence[AnyStep]: ...

    @property
    def network(self) -> bool: ...

    @property
    def accessibility(self) -> bool:
        """The task's judge reads the desktop's accessibility tree: its apps run with AT-SPI on."""
        ...

    @property
    def settle_quiet(self) -> float | None: ...
