"""An OSWorld task definition as a :class:`Task` whose Φ is OSWorld's own: finding its JSON, and
``build_task``, which keeps its config and evaluator verbatim in ``Task.osworld`` (replay/osworld_task.py) with the
files its cache holds for it, for desktop-env's SetupController and metrics to run (replay/judge.py). A task the
harness cannot run that way is refused with its first problem (``retrace osworld check`` lists them all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_retrace.dataset.osworld_cache import cache_files
from pytest_retrace.dataset.osworld_check import task_problems
from pytest_retrace.osworld.evaluate import needs_accessibility
from pytest_retrace.replay.cases import Task

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
            data = json.loads(path.read_bytes().decode("utf-8-sig"))  # a BOM, as `osworld check` allows
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


def build_task(data: dict[str, Any], domain: str, task_id: str, cache_dir: Path | None,
               settle_quiet: float | None = None) -> Task | str:
    """The task with OSWorld's config and evaluator as they are, and ``osworld.cache``: each file its downloads
    and cloud_file getters take from ``cache_dir/<id>/``, by its name there -> its absolute path (the case
    writer copies it into the case). ``settle_quiet``: the task's quiet window after each action (an OSWorld
    task file has none; LibreOffice redraws on idle timers). Or why not: the first problem ``retrace osworld
    check`` would name."""
    instruction = data.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        return "task definition has no instruction"
    task_id = str(data.get("id") or task_id)
    config = data.get("config", [])
    problems = task_problems(data, task_id, cache_dir)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s): retrace osworld check names them)" if len(problems) > 1 else ""
        return f"not supported here: {first.reason}: {first.detail}{more}"
    # OSWorld's upload_file reads a file of the machine running it; the config is kept verbatim, so the case
    # would depend on that path and not on its own files
    local = next((f["local_path"] for s in config if s.get("type") == "upload_file"
                  for f in s["parameters"]["files"]), None)
    if local is not None:
        return f"not supported here: upload_file reads {local} from this machine, and a built case carries its own files"
    assert cache_dir is not None or not cache_files(data)  # task_problems named every cache file otherwise
    cache = {f.name: str((cache_dir / task_id / f.name).absolute()) for f in cache_files(data)} if cache_dir else {}
    try:
        return Task.model_validate({
            "id": task_id, "instruction": instruction, "domain": domain,
            "osworld": {"id": task_id, "config": config, "evaluator": data["evaluator"], "cache": cache},
            # a judge that reads the AT-SPI tree: the task's apps run with it on (envs/accessibility.py)
            "accessibility": needs_accessibility(data["evaluator"]),
            **({"settle_quiet": settle_quiet} if settle_quiet is not None else {}),
        })
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"invalid task definition: {where}: {str(err['msg']).removeprefix('Value error, ')}"


__all__ = ["TASK_SIBLINGS", "build_task", "task_definition"]
