"""Built-in getters: turn a ``{type: ..., ...}`` block into the value a metric compares.

Getters read the environment only through :class:`EvalEnv`; exceptions the environment raises are
infrastructure failures and are left to propagate (the engine recognises them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pytest_retrace.envs import EnvError
from pytest_retrace.evaluators.base import CommandResult, EvaluatorError, GetterContext, register_getter

_TIMEOUT = {"timeout": (int, float)}  # its range (0 < timeout <= MAX_TIMEOUT) is checked by the plan
MAX_TIMEOUT = 600.0  # seconds a command getter may run
MAX_LOCAL_FILE_BYTES = 64 << 20  # a file shipped with a case, read into memory whole


# OSWorld's vm_file getter names a local copy in `dest`; we read the bytes directly, so it is accepted
# (imported OSWorld evaluators stay valid) and has no effect.
@register_getter("vm_file", required={"path": str}, optional={"dest": str})
def vm_file(config: Mapping[str, Any], ctx: GetterContext) -> bytes | None:
    """The file's bytes inside the environment, None when it does not exist."""
    return ctx.env.read_file(config["path"])


@register_getter("vm_file_exists", required={"path": str}, optional={})
def vm_file_exists(config: Mapping[str, Any], ctx: GetterContext) -> bool:
    # EvalEnv has no stat(); reading is the one portable probe and the files checked are small.
    return ctx.env.read_file(config["path"]) is not None


@register_getter("vm_command_line", required={"command": str}, optional=_TIMEOUT)
def vm_command_line(config: Mapping[str, Any], ctx: GetterContext) -> str:
    """The command's stdout only; a non-zero exit still yields its stdout (use
    ``vm_command_result`` + ``command_succeeds`` to check the exit status)."""
    return _run(config, ctx).stdout


@register_getter("vm_command_result", required={"command": str}, optional=_TIMEOUT)
def vm_command_result(config: Mapping[str, Any], ctx: GetterContext) -> CommandResult:
    return _run(config, ctx)


COMMAND_NOT_FOUND = 127  # the shell's status for a program that is not installed


def _run(config: Mapping[str, Any], ctx: GetterContext) -> CommandResult:
    res = ctx.env.run(config["command"], timeout=float(config.get("timeout", 30.0)))
    if res.returncode == COMMAND_NOT_FOUND:
        # the environment lacks a program the evaluator needs (an image without `unzip`): the harness's fault,
        # never the agent's, and no verdict can be read from it
        raise EnvError(f"evaluator command `{config['command']}` exited 127 (not found): {res.stderr.strip()[-300:]}")
    return res


@register_getter("rule", required={"rules": object}, optional={})
def rule(config: Mapping[str, Any], ctx: GetterContext) -> Any:
    """The literal ``rules`` value, whatever its shape."""
    return config["rules"]


@register_getter("none", optional={})
def none(config: Mapping[str, Any], ctx: GetterContext) -> None:
    return None


@register_getter("local_file", required={"path": str}, optional={})
def local_file(config: Mapping[str, Any], ctx: GetterContext) -> bytes:
    """Bytes of a file shipped with the case, relative to the case YAML's directory.

    A missing file here is the case author's bug, not the agent's, hence EvaluatorError.
    """
    if ctx.case_dir is None:
        raise EvaluatorError("local_file needs the case directory (evaluate(..., case_dir=...))")
    # Load time rejects '..' and absolute paths; a symlink can still point elsewhere, so resolve it here,
    # where the file is read.
    root = Path(ctx.case_dir).resolve()
    target = (root / config["path"]).resolve()
    if root not in target.parents:
        raise EvaluatorError(f"local_file: {config['path']!r} resolves to {str(target)!r}, outside the case "
                             f"directory {str(root)!r}")
    if not target.is_file():
        raise EvaluatorError(f"local_file: {str(target)!r} does not exist or is not a regular file")
    with target.open("rb") as fh:
        data = fh.read(MAX_LOCAL_FILE_BYTES + 1)
    if len(data) > MAX_LOCAL_FILE_BYTES:
        raise EvaluatorError(f"local_file: {str(target)!r} is larger than {MAX_LOCAL_FILE_BYTES} bytes")
    return data


def check_local_path(path: str) -> str | None:
    """Why ``path`` is unacceptable for ``local_file`` (None when fine): it must stay inside the case dir."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("~"):
        return "must be relative to the case directory"
    if ".." in pure.parts:
        return "must not leave the case directory ('..')"
    return None
