"""An OSWorld task definition as a :class:`Task`: finding its JSON, converting it (setup through
dataset/osworld_setup.py, the evaluator checked against ours), the evaluator problem ``build_task`` reports
(``retrace osworld check``, dataset/osworld_check.py, lists every problem)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_retrace.dataset.osworld_setup import convert_config
from pytest_retrace.evaluators import EvaluatorError, validate_evaluator
from pytest_retrace.replay.cases import Task

#: What a kept-but-unsupported evaluator is replaced by: a check that is well-formed and never passes.
PLACEHOLDER_EVALUATOR: dict[str, Any] = {
    "func": "exact_match",
    "result": {"type": "rule", "rules": "unsupported"},
    "expected": {"type": "rule", "rules": "osworld"},
}
TASK_SIBLINGS = ("task.json", "example.json")  # forks that store the task next to traj.jsonl


def task_definition(
    task_dir: Path, domain: str, task_id: str, examples_dir: Path | None
) -> tuple[dict[str, Any], Path] | str:
    candidates: list[Path] = []
    if examples_dir is not None:
        candidates.append(examples_dir / domain / f"{task_id}.json")
    candidates += [task_dir / name for name in TASK_SIBLINGS]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"invalid task definition {path}: {exc}"
        if not isinstance(data, dict):
            return f"invalid task definition {path}: expected a JSON object, got {type(data).__name__}"
        if path.parent == task_dir and "instruction" not in data:
            continue  # a sibling file of some other kind
        return data, path.absolute()
    if examples_dir is None:
        return "task definition not found (pass the examples dir)"
    return f"task definition not found: {examples_dir / domain / f'{task_id}.json'}"


def build_task(
    data: dict[str, Any], domain: str, task_id: str, keep_unsupported: bool, cache_dir: Path | None
) -> tuple[Task, dict[str, Any]] | str:
    instruction = data.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        return "task definition has no instruction"
    config = data.get("config") or []
    if not isinstance(config, list):
        return f"task definition: config must be a list, got {type(config).__name__}"
    task_id = str(data.get("id") or task_id)
    setup, unsupported = convert_config(config, task_id=task_id, cache_dir=cache_dir)
    if unsupported and not keep_unsupported:
        return unsupported[0][1]
    evaluator = data.get("evaluator")
    problem = evaluator_problem(evaluator)
    if problem is not None and not keep_unsupported:
        return f"evaluator not supported here: {problem}"
    meta: dict[str, Any] = {
        "evaluator_supported": problem is None,
        "unsupported_config": [kind for kind, _ in unsupported],
    }
    if problem is not None:
        meta["unsupported_evaluator"] = problem
    try:
        task = Task.model_validate({
            "id": task_id, "instruction": instruction, "domain": domain,
            "setup": setup, "evaluator": evaluator if problem is None else PLACEHOLDER_EVALUATOR,
        })
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"invalid task definition: {where}: {str(err['msg']).removeprefix('Value error, ')}"
    return task, meta


def evaluator_problem(evaluator: Any) -> str | None:
    """Why an OSWorld evaluator cannot be checked here, or None if it can."""
    if evaluator is None:
        return "the task definition has no evaluator"
    try:
        validate_evaluator(evaluator, where="evaluator")
    except EvaluatorError as exc:
        return str(exc)
    post = evaluator.get("postconfig") if isinstance(evaluator, dict) else None
    if post:
        kinds = ", ".join(sorted({str(p.get("type")) if isinstance(p, dict) else "?" for p in post}))
        return (f"evaluator.postconfig: {len(post)} post-configuration step(s) ({kinds}) would not be run "
                "before the evaluator")
    return None


__all__ = ["PLACEHOLDER_EVALUATOR", "TASK_SIBLINGS", "build_task", "evaluator_problem", "task_definition"]
