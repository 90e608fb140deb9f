"""A task's setup steps, interpreted once for every provider over the Environment protocol, so that a docker
container or a remote guest makes exactly the initial state the local desktop does."""

from __future__ import annotations

from pathlib import Path

from ..setup_steps import CommandStep, FileStep, LaunchStep, TaskSetup
from . import EnvError, Environment


def apply_setup(env: Environment, task: TaskSetup, files: Path) -> None:
    """Run ``task.setup`` in order; the first step that fails raises EnvError naming the task and the step."""
    for i, step in enumerate(task.setup):
        try:
            _apply(env, step, files)
        except EnvError as exc:
            raise EnvError(f"task {task.id}: setup[{i}] ({step.type}): {exc}") from None


def _apply(env: Environment, step: LaunchStep | FileStep | CommandStep, files: Path) -> None:
    if isinstance(step, FileStep):
        if step.content is not None:
            data = step.content.encode()
        else:
            try:
                data = (files / str(step.src)).read_bytes()  # confined to the case's directory by its schema
            except OSError as exc:
                raise EnvError(f"cannot read {step.src}: {exc}") from None
        env.write_file(step.path, data)
    elif isinstance(step, CommandStep):
        res = env.run(step.command, timeout=step.timeout)
        if res.returncode != 0:
            raise EnvError(f"`{step.command}` exited {res.returncode}: {res.stderr.strip()[-300:]}")
    else:
        env.launch(step.command, window=step.window, timeout=step.timeout)
