"""``retrace osworld check``: which OSWorld tasks can be reproduced here, every reason why not as a (reason,
detail) pair, and the report (one line per task, a summary by reason, or one JSON object per task).

Input is a directory of task definitions, a task file, or a task list (OSWorld's ``test_all.json`` shape:
``{"domain": ["id", ...]}``) whose task files lie in an examples directory."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from pytest_retrace.dataset.osworld_setup import convert_config
from pytest_retrace.evaluators import GETTERS, METRICS, EvaluatorError, validate_evaluator

TOP_VALUES = 5  # values named per reason in the summary
# A drive letter: OSWorld's Windows tasks name C:\... paths, which no path on this (Linux) guest resembles.
_WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]")
# convert_config says so for a URL it did not find in the cache (osworld_setup._cached_file).
_NOT_CACHED = re.compile(r"\.url: (\S+) (?:would be downloaded|is not in the OSWorld cache)")
_NOT_HERE = re.compile(r"\.(?:local_path|url): (.+?) (?:does not exist|is not a regular file) here")  # _local_file


class Problem(NamedTuple):
    """One reason a task cannot be reproduced: a short stable ``reason``, and the exact value it is about."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason} {self.detail}" if self.detail else self.reason

    @property
    def shown(self) -> str:
        """The detail as a task line shows it: a cloud file by its name (the name it must have in the cache;
        its URL, 100 characters of which are the same for every task, is in --json)."""
        if self.reason == "cloud file not in cache":
            return self.detail.rstrip("/").rpartition("/")[2] or self.detail
        return self.detail


@dataclass
class TaskCheck:
    """One task's verdict."""

    id: str
    domain: str
    file: Path
    problems: list[Problem] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.supported:
            return f"ok  {self.domain}/{self.id}"
        # one part per reason, in first-seen order, its values after it; a value repeated shows once, counted
        by_reason: dict[str, Counter[str]] = {}
        for p in self.problems:
            by_reason.setdefault(p.reason, Counter())[p.shown] += 1
        return f"NO  {self.domain}/{self.id}: " + "; ".join(
            reason + (" " if any(values) else "")
            + ", ".join(v + (f" ({n}x)" if n > 1 else "") for v, n in values.items() if v)
            for reason, values in by_reason.items())

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "domain": self.domain, "file": str(self.file), "supported": self.supported,
                "reasons": [{"reason": p.reason, "detail": p.detail} for p in self.problems]}


# --- reading ----------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any | Problem:
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a BOM, as some editors on Windows write, is fine
    except OSError as exc:
        return Problem("unreadable", f"{path}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        return Problem("not UTF-8", f"byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return Problem("not JSON", f"line {exc.lineno} column {exc.colno}: {exc.msg}")


def is_task(data: Any) -> bool:
    """A task definition: a JSON object with an id and an instruction."""
    return isinstance(data, dict) and "id" in data and "instruction" in data


def is_task_list(data: Any) -> bool:
    """OSWorld's test_all.json shape: domain -> list of task ids."""
    return (isinstance(data, dict) and bool(data) and not is_task(data)
            and all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in data.values()))


@dataclass
class Inputs:
    """The task files to check, as (file, domain, id given by a task list or None), and the files skipped."""

    tasks: list[tuple[Path, str, str | None]] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)


def collect(paths: list[Path], examples: Path | None = None) -> Inputs:
    """Directories: their task definitions (other JSON files skipped); files: a task list's tasks (in
    ``examples``, by default ``<list's dir>/examples``), or the file itself as a task."""
    found = Inputs()
    for path in paths:
        if path.is_dir():
            for file in sorted(path.rglob("*.json")):
                data = _read_json(file)
                if is_task(data):
                    found.tasks.append((file, file.parent.name, None))
                else:
                    found.skipped.append(file)
            continue
        data = _read_json(path) if path.is_file() else None
        if is_task_list(data):
            where = examples if examples is not None else path.parent / "examples"
            found.tasks += [(where / domain / f"{task_id}.json", domain, task_id)
                            for domain, ids in data.items() for task_id in ids]
        elif path.exists():
            found.tasks.append((path, path.parent.name, None))
    return found


# --- checking ---------------------------------------------------------------------------------------


def check_task(path: Path, domain: str | None = None, task_id: str | None = None,
               cache_dir: Path | None = None) -> TaskCheck:
    """Every reason the task in ``path`` cannot be reproduced here (none: it can — its setup converts to our
    steps, the files it uploads are here, its evaluator maps onto ours). ``cache_dir``: OSWorld's file cache."""
    check = TaskCheck(task_id or path.stem, domain if domain is not None else path.parent.name, path)
    if not path.is_file():
        check.problems.append(Problem("task file not found", str(path)))
        return check
    data = _read_json(path)
    if isinstance(data, Problem):
        check.problems.append(data)
        return check
    if not isinstance(data, dict):
        check.problems.append(Problem("not a task definition", f"a JSON {type(data).__name__}"))
        return check
    check.id = str(data.get("id") or check.id)
    if not isinstance(data.get("instruction"), str) or not data["instruction"].strip():
        check.problems.append(Problem("no instruction"))
    check.problems += config_problems(data.get("config", []), check.id, cache_dir)
    check.problems += evaluator_problems(data.get("evaluator"))
    return check


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _windows_paths(value: Any) -> list[Problem]:
    return [Problem("windows path", s) for s in _strings(value) if _WINDOWS_PATH.match(s)]


def config_problems(config: Any, task_id: str, cache_dir: Path | None) -> list[Problem]:
    """A problem per setup step we cannot do (osworld_setup.convert_config says why), and per Windows path."""
    if not isinstance(config, list):
        return [Problem("config not a list", type(config).__name__)]
    problems = []
    for i, step in enumerate(config):
        problems += _windows_paths(step.get("parameters") if isinstance(step, dict) else None)
        for kind, message in convert_config([step], task_id=task_id, cache_dir=cache_dir)[1]:
            message = message.replace("config step 0", f"config step {i}", 1)
            if message == f"config step type {kind} not supported":
                problems.append(Problem("unsupported config step", kind))
            elif found := _NOT_CACHED.search(message):
                problems.append(Problem("cloud file not in cache", found.group(1)))
            elif found := _NOT_HERE.search(message):
                problems.append(Problem("local file not found", found.group(1)))
            else:
                # "bad config step 3 (execute): 'until' ... is not supported"
                problems.append(Problem("bad config step", message.removeprefix("config step ")))
    return problems


def evaluator_problems(evaluator: Any) -> list[Problem]:
    """Every unknown metric and getter, every postconfig step and Windows path; else what our validation of
    the evaluator says (a problem it would find once the names were known is not guessed at)."""
    if evaluator is None:
        return [Problem("no evaluator")]
    problems = list(_block_problems(evaluator))
    if not any(p.reason in ("unknown metric", "unknown getter") for p in problems):
        try:
            validate_evaluator(evaluator, where="evaluator")
        except EvaluatorError as exc:
            problems.append(Problem("invalid evaluator", str(exc)))
    post = evaluator.get("postconfig") if isinstance(evaluator, dict) else None
    for step in post if isinstance(post, list) else []:
        problems.append(Problem("postconfig", str(step.get("type")) if isinstance(step, dict) else repr(step)))
    return problems


def _block_problems(block: Any) -> Iterator[Problem]:
    if not isinstance(block, dict):
        return
    for nested in block.get("checks") or []:
        yield from _block_problems(nested)
    funcs = block.get("func")
    for func in funcs if isinstance(funcs, list) else [funcs] if funcs is not None else []:
        if isinstance(func, str) and func not in METRICS:
            yield Problem("unknown metric", func)
    for side in ("result", "expected"):
        getters = block.get(side)
        for getter in getters if isinstance(getters, list) else [getters]:
            if not isinstance(getter, dict):
                continue
            kind = getter.get("type")
            if isinstance(kind, str) and kind not in GETTERS:
                yield Problem("unknown getter", kind)
            yield from _windows_paths(getter)


# --- the report -------------------------------------------------------------------------------------


def summary_lines(checks: list[TaskCheck]) -> list[str]:
    """Per reason, most tasks first: how many tasks have it and its most common values (counted per task)."""
    tasks: Counter[str] = Counter()
    values: dict[str, Counter[str]] = {}
    for check in checks:
        seen = dict.fromkeys(check.problems)  # a value counts once per task
        tasks.update({p.reason for p in seen})
        for p in seen:
            values.setdefault(p.reason, Counter())[p.shown] += 1
    lines = []
    for reason, n in sorted(tasks.items(), key=lambda item: (-item[1], item[0])):
        common = sorted(((d, n) for d, n in values[reason].items() if d), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{detail} {n}" for detail, n in common[:TOP_VALUES])
        more = f", ... ({len(common) - TOP_VALUES} more)" if len(common) > TOP_VALUES else ""
        lines.append(f"{reason} ({n} task{'s' if n != 1 else ''})" + (f": {shown}{more}" if shown else ""))
    return lines


def report(paths: list[Path], out: TextIO, *, examples: Path | None = None, cache_dir: Path | None = None,
           as_json: bool = False, verbose: bool = False) -> int:
    """Print the check of every task found; 0 when all are supported, 1 when some are not, 2 when none found."""
    found = collect(paths, examples)
    if not found.tasks:
        return 2
    checks = [check_task(file, domain, task_id, cache_dir) for file, domain, task_id in found.tasks]
    bad = sum(not c.supported for c in checks)
    if as_json:
        for check in checks:
            print(json.dumps(check.to_json(), sort_keys=True), file=out)
        return 1 if bad else 0
    for check in checks:
        print(check.line(), file=out)
    if found.skipped:
        print(f"skipped {len(found.skipped)} JSON file(s) that are not task definitions (no id and instruction)"
              + (": " + ", ".join(map(str, found.skipped)) if verbose else ""), file=out)
    for line in summary_lines(checks):
        print(line, file=out)
    reasons = {p.reason for c in checks for p in c.problems}
    if verbose or "unknown metric" in reasons:
        print(f"known metrics: {', '.join(sorted(METRICS))}", file=out)
    if verbose or "unknown getter" in reasons:
        print(f"known getters: {', '.join(sorted(GETTERS))}", file=out)
    print(f"{len(checks) - bad} supported, {bad} not supported (of {len(checks)})", file=out)
    return 1 if bad else 0


__all__ = ["Inputs", "Problem", "TaskCheck", "check_task", "collect", "config_problems", "evaluator_problems",
           "is_task", "is_task_list", "report", "summary_lines"]
