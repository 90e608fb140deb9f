"""Φ for a task: the harness's own evaluator, or OSWorld's run by OSWorld's code (``task.osworld``), and the
setup both need. The one place the replay, ``retrace build`` and ``retrace record`` reset a desktop for a task
and judge it, so an OSWorld case is set up and judged the same way by all three."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.envs.setup import settle
from pytest_retrace.envs.steps import SettleStep
from pytest_retrace.evaluators import LATE_WRITES, Evaluation, evaluate
from pytest_retrace.replay.casefiles import vm_files
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.osworld_task import OSWorldTask
from pytest_retrace.screen.frames import Rect

# After an OSWorld task's config, the first action waits for its apps: a quiet screen and idle processes (as a
# `settle` setup step). OSWorld's own runner sleeps 60 s instead (lib_run_single); its `launch` steps return before
# the app has a window, and GIMP, VLC or LibreOffice take seconds more to draw and load.
CONFIG_SETTLE = SettleStep(type="settle", quiet=1.5, timeout=180.0)


def reset(env: Environment, task: Task, case_dir: Path, masks: Sequence[Rect] = ()) -> None:
    """A fresh desktop with the task's setup: the harness's steps, then an OSWorld task's own config steps
    through desktop-env's SetupController and a settle (a failure there is the harness's: nothing has acted yet)."""
    env.reset(task, case_dir, masks=masks)
    if task.osworld is not None and task.osworld.config:
        from pytest_retrace.osworld.connect import vm_server
        from pytest_retrace.osworld.setup import run_config

        with _cache(task.osworld, case_dir) as cache:
            run_config(task.osworld.config, vm_server(env), cache)
        quiet = max(CONFIG_SETTLE.quiet, task.settle_quiet or 0.0)
        try:
            settle(env, CONFIG_SETTLE.model_copy(update={"quiet": quiet}), masks)
        except EnvError as exc:
            raise EnvError(f"task {task.id}: after its OSWorld config: {exc}") from None


def judge(task: Task, env: Environment, case_dir: Path, *, wait: float = LATE_WRITES,
          last_action: str | None = None) -> Evaluation:
    """The task's evaluation on the desktop as it is now. ``last_action`` ("FAIL" when the agent gave up) is
    what OSWorld's `infeasible` reads. OSWorld's evaluation runs once, as OSWorld runs it: its ``postconfig``
    acts on the desktop (saving a file, closing a window), so it cannot be repeated like the harness's; what
    its steps started is waited for before the getters read the desktop (POSTCONFIG_SETTLE)."""
    if task.osworld is None:
        assert task.evaluator is not None  # Task._one_judge
        return evaluate(task.evaluator, env, case_dir, wait=wait)
    from pytest_retrace.osworld.connect import vm_server
    from pytest_retrace.osworld.evaluate import evaluate as osworld_evaluate

    with _cache(task.osworld, case_dir) as cache:
        return osworld_evaluate(task.osworld.evaluator, vm_server(env), cache, last_action=last_action,
                                after_postconfig=lambda: _after_postconfig(env))


# OSWorld's save postconfig presses ctrl+s and sleeps 0.5 s; LibreOffice, loaded (16 desktops on 2 cores, or
# containers), took longer to write the file, and the getter read the old one: the oracle's R_TC failed on 5 of
# 12 calc cases in a docker run. So the getters wait for a quiet screen and idle processes first, as a reset
# waits after the config. A desktop that stays busy is what the agent left: judged as it is, with a note.
POSTCONFIG_SETTLE = SettleStep(type="settle", quiet=1.0, timeout=30.0)


def _after_postconfig(env: Environment) -> str | None:
    try:
        settle(env, POSTCONFIG_SETTLE)
    except EnvError as exc:
        return f"judged while still busy after the postconfig: {exc}"
    return None


def evaluated_files(task: Task) -> list[str]:
    """The desktop's files the task's evaluator reads (its ``vm_file`` getters): what the task's outcome depends
    on, and so what a probe of a hidden error state looks at first."""
    if task.osworld is None:
        assert task.evaluator is not None
        return vm_files(task.evaluator)
    from pytest_retrace.osworld.evaluate import getter_blocks

    paths = [g["path"] for field, g in getter_blocks(task.osworld.evaluator)
             if field.startswith("result") and g.get("type") == "vm_file" and isinstance(g.get("path"), str)]
    return list(dict.fromkeys(paths))


@contextmanager
def _cache(task: OSWorldTask, case_dir: Path) -> Iterator[Path]:
    """OSWorld's cache directory for one task, made afresh: its getters write what they read from the VM into it
    (under the evaluator's `dest` names), and a case's files must not be overwritten by them."""
    root = Path(tempfile.mkdtemp(prefix="retrace-osworld-"))
    try:
        cache = root / task.id
        cache.mkdir()
        for name, rel in task.cache.items():
            shutil.copyfile(case_dir / rel, cache / name)
        yield cache
    finally:
        shutil.rmtree(root, ignore_errors=True)
