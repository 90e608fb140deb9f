"""A forward episode on disk, in OSWorld's results layout, so ``retrace build --osworld RUN/trajectories`` reads a
forward run's successful episodes as on-policy rollouts (paper §5.2, stage A) and the experiments read any of
them as inputs::

    <run>/trajectories/pyautogui/screenshot/<model>[-run<k>]/<domain>/<task_id>/
        traj.jsonl        one line per executed action, as OSWorld's lib_run_single writes it: step_num,
                          action_timestamp, action (pyautogui code), response (the rationale), reward, done,
                          info, screenshot_file (the screen after the action); then DONE / FAIL if the agent
                          said so
        step_0.png        the screen before the first action
        step_<n>_<ts>.png the screen after action n
        result.txt        the evaluator's score
        retrace-task.yaml the harness's task exactly as the episode ran it (OSWorld's config and evaluator
                          included) and the directory its files lie in: what `retrace build` replays it with;
                          and the ground truth a scripted agent was given, if one was (its continuations in
                          the ideal-recovery experiment are given it again)
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pytest_retrace.actions import Action, ActionError, parse_action
from pytest_retrace.actions.pyautogui_render import to_pyautogui
from pytest_retrace.agents import HistoryStep
from pytest_retrace.experiments.forward import ForwardResult
from pytest_retrace.replay.cases import Task

ACTION_SPACE, OBSERVATION = "pyautogui", "screenshot"
TASK_FILE = "retrace-task.yaml"


def episode_dir(root: Path, model: str, domain: str, task_id: str, run_index: int = 0, runs: int = 1) -> Path:
    who = f"{model}-run{run_index + 1}" if runs > 1 else model
    return root / ACTION_SPACE / OBSERVATION / who / domain / task_id


def write_episode(out: Path, task: Task, task_dir: Path, result: ForwardResult,
                  ground_truth: list[Action] | None = None) -> Path:
    """Write one finished episode (not an infrastructure error: it measured nothing) to ``out``."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d@%H%M%S")
    if result.initial is not None:
        Image.fromarray(result.initial).save(out / "step_0.png")
    lines: list[dict[str, Any]] = []
    frames = iter(result.frames)
    executed = 0
    for step in result.drive.steps:
        action = step.action
        if action.get("action") in ("done", "fail"):
            lines.append(_line(len(lines) + 1, stamp, action["action"].upper(), step.rationale, None, done=True))
            continue
        if step.error is not None or action.get("action") in ("invalid", "observe"):
            continue  # not executed: nothing to replay (the record keeps it, with its reason)
        executed += 1
        shot = f"step_{executed}_{stamp}.png"
        frame = next(frames, None)
        if frame is not None:
            Image.fromarray(frame).save(out / shot)
        lines.append(_line(executed, stamp, _written(Action.from_dict(action)), step.rationale,
                           shot if frame is not None else None, done=False))
    (out / "traj.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    score = result.evaluation.score if result.evaluation is not None else 0.0
    (out / "result.txt").write_text(f"{score}\n", encoding="utf-8")
    own: dict[str, Any] = {"task": task.model_dump(mode="json", exclude_none=True), "base_dir": str(task_dir.absolute())}
    if ground_truth is not None:
        own["ground_truth"] = [a.to_dict() for a in ground_truth]
    (out / TASK_FILE).write_text(yaml.safe_dump(own, sort_keys=False), encoding="utf-8")
    return out


def _written(action: Action) -> str | dict[str, Any]:
    """pyautogui code, as OSWorld writes actions, where it parses back to this one action; else the action's
    mapping (a drag from a given point is two pyautogui calls), which `retrace build` reads as well."""
    code = to_pyautogui(action)
    try:
        if parse_action(code) == [action]:
            return code
    except ActionError:
        pass
    return action.to_dict()


def _line(step_num: int, stamp: str, action: str | dict[str, Any], response: str, shot: str | None, *, done: bool) -> dict[str, Any]:
    line: dict[str, Any] = {"step_num": step_num, "action_timestamp": stamp, "action": action,
                            "response": response, "reward": 0, "done": done, "info": {}}
    if shot is not None:
        line["screenshot_file"] = shot
    return line


def read_task(task_dir: Path) -> tuple[Task, Path] | str | None:
    """An episode's ``retrace-task.yaml``: its task and base directory; None where there is none (an OSWorld
    run's own directory), or why it cannot be used."""
    path = task_dir / TASK_FILE
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Task.model_validate(data["task"]), Path(data["base_dir"])
    except Exception as exc:  # noqa: BLE001 - any malformed file is one dropped rollout, with its reason
        return f"invalid {path}: {exc}"


def read_ground_truth(task_dir: Path) -> tuple[Action, ...] | None:
    """The ground truth a scripted agent was given in this episode (``retrace-task.yaml``), or None."""
    try:
        data = yaml.safe_load((task_dir / TASK_FILE).read_text(encoding="utf-8"))
        actions = data.get("ground_truth")
        return None if actions is None else tuple(Action.from_dict(a) for a in actions)
    except Exception:  # noqa: BLE001 - read_task has said what is wrong with the file; no ground truth then
        return None


@dataclass(frozen=True)
class Episode:
    """A finished episode read back: its directory, task, score, and history (the screen before each executed
    action, the action, the rationale) with the screen after the last action."""

    path: Path
    task: Task
    task_dir: Path
    score: float
    history: list[HistoryStep]
    final: np.ndarray | None

    @property
    def solved(self) -> bool:
        return self.score >= 1.0


def episodes_in(root: Path) -> list[Path]:
    """The episode directories below ``root`` (any depth: a run's trajectories/, or one model's), sorted."""
    return sorted(p.parent for p in root.rglob("traj.jsonl") if p.is_file())


def read_episode(path: Path) -> Episode | str:
    """An episode this project wrote (``retrace-task.yaml`` beside it), or why it cannot be read."""
    from PIL import Image

    own = read_task(path)
    if own is None:
        return f"{path}: no {TASK_FILE} (not an episode of a forward run)"
    if isinstance(own, str):
        return own
    task, task_dir = own
    try:
        score = float((path / "result.txt").read_text(encoding="utf-8").strip())
        lines = [json.loads(line) for line in (path / "traj.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        return f"{path}: {exc}"

    def screen(name: str | None) -> np.ndarray | None:
        file = path / name if name else None
        return np.asarray(Image.open(file).convert("RGB")) if file is not None and file.is_file() else None

    history: list[HistoryStep] = []
    before = screen("step_0.png")
    for number, line in enumerate(lines, 1):
        if line.get("action") in ("DONE", "FAIL"):
            continue
        try:
            (action,) = parse_action(line["action"])
        except (ActionError, KeyError, ValueError) as exc:
            return f"{path}/traj.jsonl line {number}: {exc}"
        history.append(HistoryStep(before, action, str(line.get("response") or "")))
        before = screen(line.get("screenshot_file"))
    return Episode(path, task, task_dir, score, history, before)
