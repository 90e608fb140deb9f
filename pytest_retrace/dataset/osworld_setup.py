"""OSWorld's setup config as our setup steps (docs/osworld.md has the mapping): launch, command / execute,
open, activate_window, upload_file / download (from a local file or an OSWorld cache directory: there is no
network here), sleep skipped; any other type, or a bad step of these, is reported with its reason."""

from __future__ import annotations

import posixpath
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import TypeAdapter, ValidationError

from pytest_retrace.envs.steps import SetupStep
from pytest_retrace.text import show

COMMAND_TIMEOUT = 120.0  # OSWorld's server allows setup commands this long
_LAUNCH_TYPES = frozenset({"launch"})
_COMMAND_TYPES = frozenset({"command", "execute"})
_SKIPPED_TYPES = frozenset({"sleep"})
_FILE_TYPES = frozenset({"upload_file", "download"})  # OSWorld: a local file / a URL, uploaded to the VM
_STEP: TypeAdapter[Any] = TypeAdapter(SetupStep)


def convert_config(
    config: list[Any], *, task_id: str | None = None, cache_dir: Path | None = None
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """OSWorld setup config -> our setup steps, and the (type, reason) of every step we cannot do.

    ``task_id`` and ``cache_dir`` locate the files ``download`` / ``upload_file`` steps fetch from a URL
    (OSWorld's cache: ``<cache_dir>/<task_id>/<file>``)."""
    steps: list[dict[str, Any]] = []
    unsupported: list[tuple[str, str]] = []
    for i, item in enumerate(config):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            unsupported.append(("?", f"config step {i}: not a {{type, parameters}} mapping"))
            continue
        kind = item["type"]
        params = item.get("parameters")
        if params is None:  # some forks put the parameters inline
            params = {k: v for k, v in item.items() if k != "type"}
        if not isinstance(params, dict):
            unsupported.append((kind, f"config step {i} ({kind}): parameters must be a mapping"))
            continue
        try:
            converted = _convert_step(kind, params, _Files(task_id, cache_dir))
            if converted is not None:
                converted = [_checked(step, {}) for step in converted]
        except ValueError as exc:
            unsupported.append((kind, f"config step {i} ({kind}): {exc}"))
            continue
        if converted is None:
            unsupported.append((kind, f"config step type {kind} not supported"))
        else:
            steps += converted
    return steps, unsupported


@dataclass(frozen=True)
class _Files:
    """Where the files of a task's download / upload_file steps are looked up."""

    task_id: str | None
    cache_dir: Path | None


def _checked(step: dict[str, Any], names: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """`step` once our schema accepts it, else a ValueError naming the field as OSWorld calls it (`names`:
    ours -> theirs), so `retrace osworld check` and the import agree on what converts."""
    try:
        _STEP.validate_python(step)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"][1:])  # loc[0] is the step's type tag
        where = prefix + names.get(field, field)
        raise ValueError(f"{where + ': ' if where else ''}{str(err['msg']).removeprefix('Value error, ')}") from None
    return step


def _command(params: dict[str, Any]) -> list[str] | str:
    command = params.get("command")
    if isinstance(command, str) and command.strip():
        return command
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        return command
    raise ValueError(f"command must be a non-empty string or list of strings, got {command!r}")


def _shell_word(arg: str) -> str:
    """Quote one argument for sh, leaving a leading ~/ unquoted (OSWorld's server expands it)."""
    if arg == "~":
        return arg
    if arg.startswith("~/"):
        return "~/" + shlex.quote(arg[2:]) if arg[2:] else "~/"
    return shlex.quote(arg)


def _convert_step(kind: str, params: dict[str, Any], files: _Files) -> list[dict[str, Any]] | None:
    """Our steps for one OSWorld step ([] when it needs none), None for a type we do not support; a ValueError
    says what is wrong with a step of a supported type."""
    if kind in _SKIPPED_TYPES:
        return []  # our environment waits for a stable screen after setup
    if kind in _LAUNCH_TYPES:
        command = _command(params)
        if params.get("shell"):  # Popen(command, shell=True)
            command = ["sh", "-c", *([command] if isinstance(command, str) else command)]
        return [{"type": "launch", "command": command}]
    if kind in _COMMAND_TYPES:
        if params.get("until"):
            raise ValueError("'until' (retry until the output matches) is not supported")
        command = _command(params)
        if params.get("shell"):
            text = command if isinstance(command, str) else shlex.join(["sh", "-c", *command])
        else:  # OSWorld splits a string like the shell would and runs the argv
            argv = shlex.split(command) if isinstance(command, str) else command
            text = " ".join(_shell_word(a) for a in argv)
        # OSWorld ignores a setup command's exit status; ours must exit 0, so make it so.
        return [{"type": "command", "command": f"{{ {text}\n}} || true", "timeout": COMMAND_TIMEOUT}]
    if kind == "open":
        path = params.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        return [{"type": "launch", "command": ["xdg-open", path]}]
    if kind == "activate_window":
        return [_activate_window(params)]
    if kind in _FILE_TYPES:
        return _file_steps(kind, params, files)
    return None


def _only(params: dict[str, Any], kind: str, known: tuple[str, ...]) -> None:
    """OSWorld calls the step's method with the parameters as keywords: an unknown one fails there too."""
    extra = sorted(set(params) - set(known))
    if extra:
        raise ValueError(f"unknown parameter(s) {', '.join(map(repr, extra))} (OSWorld's {kind} takes "
                         f"{', '.join(known)})")


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {show(value)}")  # noqa: TRY004 - a reason to report
    return value


# --- activate_window --------------------------------------------------------------------------------


def _activate_window(params: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's server runs ``wmctrl -a NAME`` (``-F``: strict, the exact title; ``-x``: by_class, WM_CLASS):
    our ``activate`` step has the same matching rules (envs/setup.py)."""
    _only(params, "activate_window", ("window_name", "strict", "by_class"))
    name = params.get("window_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"window_name must be a non-empty string, got {show(name)}")
    step = {"type": "activate", "window": name, "exact": _flag(params, "strict"),
            "by_class": _flag(params, "by_class")}
    return _checked(step, {"window": "window_name", "exact": "strict"})


# --- upload_file / download -------------------------------------------------------------------------


def _file_steps(kind: str, params: dict[str, Any], files: _Files) -> list[dict[str, Any]]:
    """One ``file`` step per entry of ``files``, its ``src`` the absolute path of the file found here (the
    build copies it into each case's directory)."""
    _only(params, kind, ("files",))
    entries = params.get("files")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"files must be a non-empty list of {{url or local_path, path}} mappings, got "
                         f"{show(entries)}")
    steps = []
    for j, entry in enumerate(entries):
        where = f"files[{j}]"
        if not isinstance(entry, dict):
            raise ValueError(  # noqa: TRY004 - a reason to report, as every problem of a step
                f"{where} must be a {{url or local_path, path}} mapping, got {show(entry)}")
        dest = entry.get("path")
        if not isinstance(dest, str) or not dest.strip():
            raise ValueError(f"{where}.path must be a non-empty string (where the file goes), got {show(dest)}")
        source = _source(where, entry, dest, files)
        steps.append(_checked({"type": "file", "path": dest, "src": str(source)}, {}, prefix=f"{where}."))
    return steps


def _source(where: str, entry: dict[str, Any], dest: str, files: _Files) -> Path:
    """The file an entry uploads: OSWorld's upload_file names a ``local_path``; download (and some forks'
    upload_file) a ``url``."""
    extra = sorted(set(entry) - {"url", "local_path", "path"})
    if extra:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, extra))} (expected url or local_path, "
                         "and path)")
    if ("url" in entry) == ("local_path" in entry):
        raise ValueError(f"{where}: give exactly one of 'url' or 'local_path', got keys {sorted(entry)}")
    field = "url" if "url" in entry else "local_path"
    value = entry[field]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.{field} must be a non-empty string, got {show(value)}")
    if field == "local_path":
        return _local_file(f"{where}.local_path", value)
    parts = urlsplit(value)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{where}.url: {value} is a file on another host ({parts.netloc})")
        return _local_file(f"{where}.url", unquote(parts.path))
    if not parts.scheme or len(parts.scheme) == 1:  # a path (a one-letter "scheme" is a Windows drive)
        return _local_file(f"{where}.url", value)
    return _cached_file(where, value, dest, files)


def _local_file(field: str, path: str) -> Path:
    # relative: to the current directory, as OSWorld (which runs from its checkout) reads it
    full = Path(path).absolute()
    if not full.is_file():
        what = "is not a regular file" if full.exists() else "does not exist"
        raise ValueError(f"{field}: {path} {what} here ({full})")
    return full


def cache_names(url: str, dest: str) -> list[str]:
    """The names a downloaded file may have in an OSWorld cache directory ``<cache>/<task_id>/``: OSWorld's own
    (``<uuid5(URL namespace, url)>_<basename of the VM path>``), then the URL's own basename."""
    names = [f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{posixpath.basename(dest)}"]
    base = posixpath.basename(unquote(urlsplit(url).path))
    if base and base not in (".", ".."):
        names.append(base)
    return names


def _cached_file(where: str, url: str, dest: str, files: _Files) -> Path:
    if files.cache_dir is None:
        raise ValueError(f"{where}.url: {url} would be downloaded, and nothing is downloaded here; give the "
                         "OSWorld cache directory holding it (--osworld-cache DIR, laid out as <task id>/<file>)")
    if not files.task_id:
        raise ValueError(f"{where}.url: {url}: the task has no id to find its OSWorld cache directory by")
    tried = [files.cache_dir / files.task_id / name for name in cache_names(url, dest)]
    for path in tried:
        if path.is_file():
            return path.absolute()
    raise ValueError(f"{where}.url: {url} is not in the OSWorld cache (looked for {' and '.join(map(str, tried))})")


__all__ = ["COMMAND_TIMEOUT", "cache_names", "convert_config"]
