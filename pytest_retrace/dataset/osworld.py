"""Import an OSWorld results directory as trajectories (paper A.1, "On-Policy Rollout").

OSWorld's ``run.py`` / ``lib_run_single.py`` writes one directory per task::

    <result_dir>/<action_space>/<observation_type>/<model>/<domain>/<task_id>/
        traj.jsonl     one JSON object per *executed action*: step_num, action_timestamp, action (pyautogui
                       code, or "WAIT" / "DONE" / "FAIL"), response, reward, done, info, screenshot_file
        step_<n>_<timestamp>.png   the observation AFTER that action
        result.txt     the evaluator's score ("1.0" on success)
        recording.mp4  sometimes

One model prediction may hold several actions; OSWorld then writes one line per action, all with the same
``step_num``.  Such a step — like a line whose code holds several calls — is a multi-action step, and the
trajectory is dropped, as are trajectories with a missing action, unsuccessful runs, runs where the agent
declared FAIL and actions outside the whitelist (the paper's filters; every drop carries its reason).
Trailing ``DONE`` lines are the agent finishing and are stripped; ``WAIT`` is kept as a wait action.

A forward run's episode (``--retrace-experiment=forward``, experiments/trajectory.py) carries the harness's task
as it ran (``retrace-task.yaml``), which is taken as it is. Otherwise the task (instruction, setup, evaluator) comes from OSWorld's ``evaluation_examples/examples/<domain>/
<task_id>.json`` or from a ``task.json`` / ``example.json`` next to ``traj.jsonl`` (some forks write one).
The original task JSON is kept in ``metadata["osworld_task"]``.  The task's Φ is OSWorld's own: its config and
evaluator go verbatim into ``task.osworld`` (dataset/osworld_task.py), run by desktop-env's SetupController and
metrics (replay/judge.py), with the files its downloads and cloud_file getters take from OSWorld's cache
directory (``cache_dir/<task_id>/``; there is no network here), which the case writer copies into the case.  A
task OSWorld's code cannot run here (``retrace osworld check`` says why) drops the trajectory, with the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_retrace.dataset.osworld_task import build_task, task_definition
from pytest_retrace.dataset.trajectory import Dropped, Step, Trajectory, normalise_steps
from pytest_retrace.experiments.trajectory import TASK_FILE, read_task


def import_osworld(
    results_dir: Path, examples_dir: Path | None = None, *, cache_dir: Path | None = None,
    settle_quiet: float | None = None,
) -> tuple[list[Trajectory], list[Dropped]]:
    """Every ``traj.jsonl`` below ``results_dir`` (any depth) as a trajectory, or a drop with its reason.

    ``examples_dir`` is OSWorld's ``evaluation_examples/examples`` (``<domain>/<task_id>.json``);
    ``cache_dir`` an OSWorld cache directory (``<task_id>/<file>``) where files its tasks download are found;
    ``settle_quiet`` every task's quiet window after an action (Task.settle_quiet).
    Returns trajectories sorted by id and drops sorted by source.  A trajectory id is
    ``osworld-<domain>-<task_id>``; when several runs of one task are imported (several models or
    settings), each of them gets ``-<model>`` appended (and a short path hash if that still collides).
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"OSWorld results directory not found: {results_dir}")
    if examples_dir is not None:
        examples_dir = Path(examples_dir)
        if not examples_dir.is_dir():
            raise FileNotFoundError(f"OSWorld examples directory not found: {examples_dir}")
    kept: list[Trajectory] = []
    dropped: list[Dropped] = []
    for traj_file in sorted(results_dir.rglob("traj.jsonl")):
        if not traj_file.is_file():
            continue
        out = _import_task_dir(traj_file.parent, results_dir, examples_dir, cache_dir, settle_quiet)
        (dropped if isinstance(out, Dropped) else kept).append(out)
    _disambiguate(kept, results_dir)
    return sorted(kept, key=lambda t: t.id), sorted(dropped, key=lambda d: (d.source, d.reason))


# --- one task directory --------------------------------------------------------------------------


@dataclass
class _Line:
    number: int  # 1-based line number in traj.jsonl
    data: dict[str, Any]

    @property
    def step_num(self) -> Any:
        return self.data.get("step_num")

    def where(self) -> str:
        step = f" (step_num {self.step_num})" if self.step_num is not None else ""
        return f"traj.jsonl line {self.number}{step}"


def _import_task_dir(
    task_dir: Path, results_dir: Path, examples_dir: Path | None, cache_dir: Path | None,
    settle_quiet: float | None,
) -> Trajectory | Dropped:
    task_dir = task_dir.absolute()
    source = f"osworld:{task_dir}"
    domain, task_id = task_dir.parent.name, task_dir.name

    score = _score(task_dir)
    if isinstance(score, str):
        return Dropped(source, score)
    lines = _read_traj(task_dir / "traj.jsonl")
    if isinstance(lines, str):
        return Dropped(source, lines)
    steps = _steps(lines, task_dir)
    if isinstance(steps, str):
        return Dropped(source, steps)
    step_list, final_screenshot = steps

    own = read_task(task_dir)  # a forward run's episode (experiments.trajectory): the very task it ran
    if isinstance(own, str):
        return Dropped(source, own)
    base_dir = task_dir
    if own is not None:
        (task, base_dir), task_json, task_path = own, None, task_dir / TASK_FILE
    else:
        raw_task = task_definition(task_dir, domain, task_id, examples_dir)
        if isinstance(raw_task, str):
            return Dropped(source, raw_task)
        task_json, task_path = raw_task
        built = build_task(task_json, domain, task_id, cache_dir, settle_quiet)
        if isinstance(built, str):
            return Dropped(source, built)
        task = built

    rel = task_dir.relative_to(results_dir.absolute()).parts
    above = rel[:-2]  # <action_space>/<observation_type>/<model> when laid out as run.py does
    metadata: dict[str, Any] = {
        "model": above[-1] if len(above) >= 1 else None,
        "observation_type": above[-2] if len(above) >= 2 else None,
        "action_space": above[-3] if len(above) >= 3 else None,
        "domain": domain,
        "task_id": task_id,
        "score": score,
        "n_steps": len(step_list),
        "task_file": str(task_path),
        "final_screenshot": final_screenshot,
        "osworld_task": task_json,
    }
    if (task_dir / "recording.mp4").is_file():
        metadata["recording"] = str(task_dir / "recording.mp4")
    return Trajectory(
        id=f"osworld-{domain}-{task_id}", task=task, steps=step_list, source=source, success=True,
        metadata=metadata, base_dir=base_dir,
    )


def _score(task_dir: Path) -> float | str:
    """The run's score, or why the run does not count as successful."""
    path = task_dir / "result.txt"
    if not path.is_file():
        return "no result.txt (the run did not finish)"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read result.txt: {exc}"
    try:
        score = float(text)
    except ValueError:
        return f"unparsable score in result.txt: {text[:80]!r}"
    if math.isnan(score) or score < 1.0:
        return f"unsuccessful (score {score})"
    return score


def _read_traj(path: Path) -> list[_Line] | str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read traj.jsonl: {exc}"
    lines: list[_Line] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"traj.jsonl line {number}: corrupt JSON ({exc.msg} at column {exc.colno})"
        if not isinstance(data, dict):
            return f"traj.jsonl line {number}: expected a JSON object, got {type(data).__name__}"
        lines.append(_Line(number, data))
    if not lines:
        return "empty traj.jsonl"
    return lines


def _is_done(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip() == "DONE"
    return isinstance(value, dict) and value.get("action") == "done" and len(value) == 1


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | dict) and not (
        value.strip() if isinstance(value, str) else value))


def _steps(lines: list[_Line], task_dir: Path) -> tuple[list[Step], str | None] | str:
    """Lines -> one Step per OSWorld step, each exactly one action; or the reason for dropping."""
    while lines and _is_done(lines[-1].data.get("action")):
        lines = lines[:-1]  # the agent finishing: nothing to replay
    if not lines:
        return "no actions to replay (the trajectory is only DONE)"

    groups: list[list[_Line]] = []  # consecutive lines of one OSWorld step (one model prediction)
    last_num: Any = None
    for line in lines:
        num = line.step_num
        if isinstance(num, int) and not isinstance(num, bool):
            if isinstance(last_num, int) and num < last_num:
                return (f"{line.where()}: step_num goes back from {last_num} to {num} "
                        "(traj.jsonl holds more than one run)")
            if num == last_num:
                groups[-1].append(line)
                continue
        groups.append([line])
        last_num = num

    previous: str | None = _initial_screenshot(task_dir)
    steps: list[Step] = []
    for group in groups:
        parsed: list[Step] = []
        for line in group:
            raw = line.data.get("action")
            if _missing(raw):
                return f"{line.where()}: missing action"
            if isinstance(raw, dict) and "action_type" in raw:
                return (f"{line.where()}: computer_13 action {json.dumps(raw)[:120]} is not supported "
                        "(import runs with action_space pyautogui)")
            out = normalise_steps([{"step": raw}], f"osworld:{task_dir}")
            if isinstance(out, Dropped):
                reason = out.reason.removeprefix("step 0: ")
                if reason == "0 actions in one step":
                    reason = "missing action (the code holds no action call)"
                return f"{line.where()}: {reason}"
            parsed += out
        if len(parsed) != 1:
            return (f"traj.jsonl lines {group[0].number}-{group[-1].number} (step_num {group[0].step_num}): "
                    f"{len(parsed)} actions in one step")
        line, action = group[0], parsed[0].action
        if action.kind == "fail":
            return f"{line.where()}: the agent declared FAIL"
        if action.kind == "done":
            return f"{line.where()}: DONE before the end of the trajectory"
        steps.append(Step(action, screenshot=previous, rationale=_rationale(line.data.get("response"))))
        previous = _screenshot(line, task_dir)  # OSWorld's step_N png is the screen after action N
    return steps, previous


def _rationale(response: Any) -> str:
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    return json.dumps(response, ensure_ascii=False, default=str)


def _inside(task_dir: Path, name: str) -> str | None:
    """An existing file ``name`` relative to the task directory (never outside it), as an absolute path."""
    try:
        path = (task_dir / name).resolve()
    except (OSError, ValueError):
        return None
    if path.is_relative_to(task_dir.resolve()) and path.is_file():
        return str(path)
    return None


def _screenshot(line: _Line, task_dir: Path) -> str | None:
    name = line.data.get("screenshot_file")
    if isinstance(name, str) and name:
        return _inside(task_dir, name)
    num = line.step_num
    if "screenshot_file" not in line.data and isinstance(num, int):
        found = sorted(task_dir.glob(f"step_{num}_*.png"))
        if len(found) == 1:
            return str(found[0].resolve())
    return None


def _initial_screenshot(task_dir: Path) -> str | None:
    """The observation before the first action, if the runner kept one (some forks write step_0*.png)."""
    if (path := _inside(task_dir, "step_0.png")) is not None:
        return path
    found = sorted(task_dir.glob("step_0_*.png"))
    return str(found[0].resolve()) if len(found) == 1 else None


# --- ids -----------------------------------------------------------------------------------------


def _disambiguate(kept: list[Trajectory], results_dir: Path) -> None:
    """Several runs of one task (different models or settings) must not share a trajectory id."""
    by_id: defaultdict[str, list[Trajectory]] = defaultdict(list)
    for traj in kept:
        by_id[traj.id].append(traj)
    for trajs in by_id.values():
        if len(trajs) < 2:
            continue
        for traj in trajs:
            traj.id = f"{traj.id}-{traj.metadata.get('model') or 'run'}"
        counts = Counter(t.id for t in trajs)
        for traj in trajs:
            if counts[traj.id] > 1:
                rel = str(traj.base_dir.relative_to(results_dir.absolute()))
                traj.id = f"{traj.id}-{hashlib.sha256(rel.encode()).hexdigest()[:8]}"


__all__ = ["import_osworld"]
