"""Runs the scripted rollout of OSWorld-format tasks on fresh XvfbEnvironments and writes OSWorld's results layout:

    <out>/pyautogui/screenshot/scripted/<domain>/<task id>/{traj.jsonl, step_0_<ts>.png, step_<n>_<ts>.png,
                                                            result.txt}

Each task: the desktop reset with the task's config run by desktop-env's SetupController (replay/judge.py reset),
the rollout's actions one per step with a screenshot after each, then OSWorld's evaluator run by desktop-env
(replay/judge.py judge). ``traj.jsonl`` has the keys OSWorld's lib_run_single writes.

    .venv/bin/python rollouts/osworld/record.py CACHE OUT [--runs 2] [--only SLUG,...]

Run make_files.py CACHE first. With ``--runs 2`` each task is recorded twice (the second into OUT/.run2) and the
report says whether both gave the same result and the same final screenshot.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ACTIONS, TASKS

from pytest_retrace.actions import parse_action
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import Task
from pytest_retrace.replay.judge import judge, reset
from pytest_retrace.replay.osworld_task import OSWorldTask

READY_TIMEOUT = 120.0  # seconds for the config's app to show its window (LibreOffice's first start is slow)


@dataclass
class Rollout:
    task_id: str
    slug: str
    domain: str
    ready: str
    settle_quiet: float
    actions: list[str]


@dataclass
class Recorded:
    slug: str
    task_id: str
    result: float
    seconds: float
    final_png: str  # sha256 of the final screenshot's pixels
    details: list[str]
    directory: Path


def task_file(task_id: str) -> Path:
    found = sorted(TASKS.glob(f"*/{task_id}.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"task {task_id}: expected one file tasks/<domain>/{task_id}.json, found {found}")
    return found[0]


def rollouts() -> list[Rollout]:
    return sorted((load_rollout(p) for p in ACTIONS.glob("*.yaml")), key=lambda r: (r.domain, r.slug))


def load_rollout(path: Path) -> Rollout:
    data = yaml.safe_load(path.read_text())
    return Rollout(data["task"], data["slug"], data["domain"], data["ready"], float(data["settle_quiet"]),
                   list(data["actions"]))


def harness_task(osworld: dict[str, Any], cache: Path, settle_quiet: float) -> Task:
    """The harness's Task for an OSWorld task: no setup of its own, Φ and config OSWorld's, its cache files named
    relative to ``cache`` (the case directory judge.py copies them from)."""
    tid = osworld["id"]
    own = cache / tid  # a task that downloads nothing has no directory there
    files = {p.name: f"{tid}/{p.name}" for p in sorted(own.iterdir())} if own.is_dir() else {}
    part = OSWorldTask(id=tid, config=osworld.get("config", []), evaluator=osworld["evaluator"], cache=files)
    return Task(id=f"osworld-{tid}", instruction=osworld["instruction"], domain=osworld["snapshot"],
                osworld=part, settle_quiet=settle_quiet)


def wait_for_window(env: XvfbEnvironment, title: str, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    probe = f"xdotool search --onlyvisible --name {shlex.quote(title)}"
    while not env.run(probe, timeout=15).stdout.split():
        if time.monotonic() > deadline:
            raise EnvError(f"no window titled {title!r} within {timeout:g} s after the task's config")
        time.sleep(0.5)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d@%H%M%S%f")


def _save(frame: np.ndarray, path: Path) -> str:
    Image.fromarray(frame).save(path)
    return hashlib.sha256(np.ascontiguousarray(frame).tobytes()).hexdigest()


def record(env: XvfbEnvironment, rollout: Rollout, cache: Path, out: Path,
           actions: list[str] | None = None) -> Recorded:
    """One scripted run of ``rollout`` (or ``actions`` instead of its own) on ``env``, written as OSWorld writes
    a run: ``out/pyautogui/screenshot/scripted/<domain>/<task id>/``."""
    osworld = json.loads(task_file(rollout.task_id).read_text())
    task = harness_task(osworld, cache, rollout.settle_quiet)
    steps = rollout.actions if actions is None else actions
    for i, code in enumerate(steps):
        if len(parse_action(code)) != 1:
            raise ValueError(f"{rollout.slug}: actions[{i}] must be one action, got {code!r}")
    where = out / "pyautogui" / "screenshot" / "scripted" / rollout.domain / rollout.task_id
    where.mkdir(parents=True, exist_ok=True)
    for old in [*where.glob("step_*.png"), where / "traj.jsonl", where / "result.txt"]:
        old.unlink(missing_ok=True)
    started = time.monotonic()
    reset(env, task, cache)
    wait_for_window(env, rollout.ready)
    env.settle()
    digest = _save(env.screenshot(), where / f"step_0_{_stamp()}.png")
    with (where / "traj.jsonl").open("w") as traj:
        for n, code in enumerate(steps, start=1):
            (action,) = parse_action(code)
            stamp = _stamp()
            env.execute(action)
            shot = f"step_{n}_{stamp}.png"
            digest = _save(env.screenshot(), where / shot)
            traj.write(json.dumps({"step_num": n, "action_timestamp": stamp, "action": code, "response": "",
                                   "reward": 0, "done": False, "info": {}, "screenshot_file": shot}) + "\n")
    evaluation = judge(task, env, cache)
    (where / "result.txt").write_text(f"{evaluation.score}\n")
    return Recorded(rollout.slug, rollout.task_id, evaluation.score, round(time.monotonic() - started, 1), digest,
                    list(evaluation.details), where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=1, choices=(1, 2))
    parser.add_argument("--only", default="", help="comma-separated slugs")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    env = XvfbEnvironment()
    env.start()
    try:
        for rollout in rollouts():
            if only and rollout.slug not in only:
                continue
            runs = []
            for run in range(args.runs):
                try:
                    runs.append(record(env, rollout, args.cache.resolve(), args.out if run == 0 else
                                       args.out / ".run2"))
                except Exception as exc:  # noqa: BLE001 - one task's failure is reported, the others still run
                    print(f"{rollout.domain:20} {rollout.slug:24} ERROR {type(exc).__name__}: {exc}", flush=True)
                    break
            for r in runs[:1]:
                same = "" if len(runs) < 2 else (f"  same result {runs[0].result == runs[1].result}, same final "
                                                 f"screen {runs[0].final_png == runs[1].final_png}")
                print(f"{rollout.domain:20} {rollout.slug:24} {r.result:g}  {r.seconds:6.1f}s "
                      f"{'/'.join(str(x.seconds) for x in runs[1:])}{same}  {' | '.join(r.details)[:300]}",
                      flush=True)
    finally:
        env.close()


if __name__ == "__main__":
    main()
