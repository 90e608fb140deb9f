"""Error-state probes: a check of a case's state beyond its pixels (a file's hash, a command's output).

An error screen equal to its target screen proves nothing about the perturbation: the harness could not tell
whether it took effect. A probe is a getter whose value the case recorded at s_target; replay requires the
value to differ after the perturbation (part of verifying s_error: otherwise the perturbation did not happen,
an infrastructure problem) and records whether it equals the target value again after the recovery (the
oracle's restore must bring it back, the noop baseline must not).

The metric is equality of digests: a value is ``sha256:<hex>`` of the file's bytes (or of ``missing``), or
of a command's exit status and output, so a case file stays small whatever the getter returns.

Some hidden state lives only in a process's memory (a shell alias, an undo history, an unsaved setting) and no
getter can read it without changing it. A case whose error state nothing tells apart may declare
``verified_by: determinism`` instead (cases.py): it is then vouched for by its recording only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from pytest_retrace.envs.steps import Line, Text, Timeout

if TYPE_CHECKING:
    from pytest_retrace.envs import Environment

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


# What `process` can read of a process, each line of its value prefixed with the field's name. Only what a
# replay reproduces: no pids; pipes and sockets by kind (their inode numbers change with every run); a
# terminal as /dev/pts (the host's ptys are numbered in one sequence, so its number depends on every other
# desktop's terminals); an open file outside the home and /dev as `outside` (the harness's per-desktop log
# files). Not the environment:
# it holds the desktop's display and directories, which differ between workers.
PROCESS_FIELDS = ("cwd", "fds", "children", "cmdline")
ProcessField = Literal["cwd", "fds", "children", "cmdline"]
_PROCESS_READS = {
    "cwd": 'echo "cwd $(readlink "$p/cwd")"',
    "fds": ('for f in "$p"/fd/*; do t=$(readlink "$f"); '
            'case "$t" in /dev/pts/[0-9]*) t=/dev/pts ;; /home/user|/home/user/*|/dev/*) ;; /*) t=outside ;; '
            '*) t=${t%%:*} ;; esac; '
            'echo "fd ${f##*/} $t"; done'),
    "children": 'for c in $(cat "$p"/task/*/children); do echo "child $(tr \'\\0\' \' \' < /proc/$c/cmdline)"; done',
    "cmdline": 'echo "cmdline $(tr \'\\0\' \' \' < "$p/cmdline")"',
}
# comm is at most 15 bytes; a plain name keeps the generated script free of quoting problems
ProcessName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._+-]{1,15}$")]


def _unique(fields: list[str]) -> list[str]:
    if len(set(fields)) != len(fields):
        raise ValueError(f"each field at most once, got {fields}")
    return fields


class ProcessGetter(_Model):
    """What the task's processes named `name` (their ``comm``, as ``ps -o comm`` shows it) expose in /proc:
    working directory, open files, child processes (a background job), command line. Read by a command in
    the task's sandbox as the task's user, so it sees exactly the task's processes and changes nothing. A process's memory (a shell's aliases or variables) is not among
    them: nothing outside the process can read it without ptrace, which would stop it."""

    type: Literal["process"]
    name: ProcessName
    read: Annotated[list[ProcessField], Field(min_length=1), AfterValidator(_unique)] = ["cwd", "fds", "children"]
    timeout: Timeout = 10.0

    def describe(self) -> str:
        return f"process {self.name} ({', '.join(self.read)})"

    @property
    def command(self) -> str:
        """The shell command that reads it: one line per matching process (its fields' lines joined by tabs,
        sorted), the lines sorted, so the value does not depend on pids or the order /proc lists them in.
        The probe's own shell and its subshells are left out: the processes descending from the shell's pid. Not
        by session or process group: inside the task's pid namespace both read 0 wherever their leader is
        outside it, and a launched app's (xterm, soffice) matched the probe's own, so the probe read nothing."""
        reads = "; ".join(_PROCESS_READS[f] for f in self.read)
        return ("me=$$; "
                "for p in /proc/[0-9]*; do "
                f'[ "$(cat "$p/comm" 2>/dev/null)" = {self.name} ] || continue; '
                'q=${p#/proc/}; while [ "$q" -gt 1 ] && [ "$q" != "$me" ]; do '
                "q=$(sed 's/.*) //' /proc/$q/stat 2>/dev/null | cut -d' ' -f2); q=${q:-0}; done; "
                '[ "$q" = "$me" ] && continue; '
                f"{{ {reads}; }} 2>/dev/null | LC_ALL=C sort | tr '\\n' '\\t'; echo; "
                "done | LC_ALL=C sort")


Getter = Annotated[FileGetter | CommandGetter | ProcessGetter, Field(discriminator="type")]
AnyGetter = FileGetter | CommandGetter | ProcessGetter


class Probe(_Model):
    get: Getter
    target: Digest  # the getter's value at s_target

    def describe(self) -> str:
        return self.get.describe()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def settled_values(env: Environment, getters: list[AnyGetter], gap: float = 0.5,
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


def poll(env: Environment, getters: Sequence[AnyGetter], done: Callable[[list[str]], bool],
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


def probe_value(env: Environment, getter: AnyGetter) -> str:
    """The getter's current value in `env`. EnvError propagates (the environment failed, not the case)."""
    from pytest_retrace.envs import FileRefused

    if isinstance(getter, FileGetter):
        try:
            data = env.read_file(getter.path)
        except FileRefused as exc:
            return digest(f"refused: {exc}".encode())
        return digest(b"missing" if data is None else b"file:" + data)
    got = env.run(getter.command, timeout=getter.timeout)  # a ProcessGetter's command is generated
    return digest(f"{got.returncode}\n".encode() + got.stdout.encode())


# Probes every candidate is tried with (the build, `retrace record`), besides the ones a mistake or rollout
# names and the files the task's evaluator reads. What changed in the task's files, wherever (caches left
# out: an app writes them at will) ...
HOME_FILES = CommandGetter(type="command", command="find . -path ./.cache -prune -o -type f -print0 | LC_ALL=C sort -z "
                                                   "| xargs -0 -r sha256sum")
# ... and where the task's processes are: a shell's working directory (`cd`) shows nowhere else
PROCESS_DIRS = CommandGetter(type="command", command="for p in /proc/[0-9]*; do readlink $p/cwd; done | sort -u")


def standard_getters(evaluator_files: list[str]) -> list[AnyGetter]:
    return [*(FileGetter(type="file", path=path) for path in evaluator_files), PROCESS_DIRS, HOME_FILES]


def narrowest(found: list[Probe], keep: int = 2) -> list[Probe]:
    """What a case carries: the most specific probes that told its states apart; the whole home's digest only
    when nothing narrower did (it changes with anything, so it says least about what the mistake did)."""
    narrow = [q for q in found if q.get != HOME_FILES]
    return narrow[:keep] or found[:1]
