"""A task's setup steps, interpreted once for every provider over the Environment protocol, so that a docker
container or a remote guest makes exactly the initial state the local desktop does."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.envs.steps import ActivateStep, AnyStep, CommandStep, FileStep, SettleStep, TaskSetup
from pytest_retrace.envs.xdotool import activate_command
from pytest_retrace.screen.frames import Rect, apply_masks, changed_pixels
from pytest_retrace.screen.settle import SettleConfig, wait_stable

_NOT_FOUND = 3
_GRACE = 15.0  # seconds on top of an activate step's timeout before the shell is killed (a hung WM)


def apply_setup(env: Environment, task: TaskSetup, files: Path, masks: Sequence[Rect] = ()) -> None:
    """Run ``task.setup`` in order; the first step that fails raises EnvError naming the task and the step.
    ``masks``: the regions a settle step ignores (the case's, as for every settle)."""
    for i, step in enumerate(task.setup):
        try:
            _apply(env, step, files, masks)
        except EnvError as exc:
            raise EnvError(f"task {task.id}: setup[{i}] ({step.type}): {exc}") from None


def _apply(env: Environment, step: AnyStep, files: Path, masks: Sequence[Rect]) -> None:
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
    elif isinstance(step, ActivateStep):
        _activate(env, step)
    elif isinstance(step, SettleStep):
        settle(env, step, masks)
    else:
        env.launch(step.command, window=step.window, timeout=step.timeout)


def settle(env: Environment, step: SettleStep, masks: Sequence[Rect] = ()) -> None:
    """One settle step on its own, for a setup that is not the task's steps (an OSWorld task's config)."""
    _settle(env, step, masks)


def _activate(env: Environment, step: ActivateStep) -> None:
    res = env.run(activate_command(step), timeout=step.timeout + _GRACE)
    if res.returncode == 0:
        return
    what = "WM_CLASS (instance.Class)" if step.by_class else "title"
    if res.returncode == _NOT_FOUND:
        how = f"is {step.window!r}" if step.exact else f"contains {step.window!r} (ignoring case)"
        raise EnvError(f"no visible window whose {what} {how} within {step.timeout:g} s")
    raise EnvError(f"activating the window whose {what} matches {step.window!r} failed (exit {res.returncode}): "
                   f"{res.stderr.strip()[-300:]}")


def _settle(env: Environment, step: SettleStep, masks: Sequence[Rect]) -> None:
    """The screen unchanged for ``step.quiet`` seconds, and then the task's processes idle for as long, on that
    same screen. Quiet is not ready: measured under load (docker, -n 8), LibreOffice Calc went on working for
    seconds on a screen that had not changed for 1.5 s (0.13-0.22 s of CPU in that window, against 0.00-0.03
    when it was done), and dropped a click sent then: the first ground-truth click of 3 in 8 replays."""
    deadline = time.monotonic() + step.timeout
    while True:
        remaining = deadline - time.monotonic()
        settled = wait_stable(env.screenshot, SettleConfig(timeout=remaining, quiet=step.quiet), masks) \
            if remaining > step.quiet else None
        if settled is None or not settled.stable:
            raise EnvError(f"the screen still changed after {step.timeout:g} s (waited for {step.quiet:g} s "
                           "without a change)")
        quiet = apply_masks(settled.frame, masks)  # the quiet screen itself: no second grab
        share = _wait_idle(env, step.quiet, deadline)
        if share is not None:
            raise EnvError(f"the task's processes still used {share:.0%} of a CPU after {step.timeout:g} s (waited "
                           f"for {step.quiet:g} s below {IDLE_SHARE:.0%} on a quiet screen)")
        if changed_pixels(apply_masks(env.screenshot(), masks), quiet) == 0:
            return


IDLE_SHARE = 0.04  # of one CPU: more, over a settle step's quiet window, is an app still working (see _settle)
IDLE_POLL = 0.1


def _wait_idle(env: Environment, window: float, deadline: float) -> float | None:
    """Wait until the task's processes have used at most IDLE_SHARE of a CPU over the last `window` seconds;
    None then (or at once where the environment cannot tell), else the share of the last window at `deadline`."""
    start = time.monotonic()
    first = env.task_cpu_seconds()
    if first is None:
        return None
    samples = [(start, first)]
    while True:
        time.sleep(IDLE_POLL)
        now, used = time.monotonic(), env.task_cpu_seconds() or 0.0
        samples.append((now, used))
        while len(samples) > 2 and samples[1][0] <= now - window:
            samples.pop(0)  # samples[0] stays the newest at least `window` old
        since, before = samples[0]
        if now - since >= window and used - before <= IDLE_SHARE * (now - since):
            return None
        if now >= deadline:
            return (used - before) / max(now - since, IDLE_POLL)
