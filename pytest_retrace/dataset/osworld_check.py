"""``retrace osworld check``: which OSWorld tasks can be reproduced here, every reason why not as a (reason,
detail) pair, and the report (one line per task, a summary by reason, or one JSON object per task).

A task is supported when OSWorld's own code (desktop-env, pytest_retrace/osworld/) can set it up and judge it
here: its config steps and its evaluator pass desktop-env's checks, with the files it downloads in the cache.
A supported task is runnable on a provider when that provider has the apps it needs (dataset/osworld_apps.py).

Input is a directory of task definitions, a task file, or a task list (OSWorld's ``test_all.json`` shape:
``{"domain": ["id", ...]}``) whose task files lie in an examples directory."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from pytest_retrace.dataset.osworld_apps import Provider, lacking, needs
from pytest_retrace.osworld import package
from pytest_retrace.osworld.evaluate import evaluator_problems
from pytest_retrace.osworld.setup import config_problems

TOP_VALUES = 5  # values named per reason in the summary
LINE_VALUES = 4  # values named per reason in a task's line (a task downloading 16 files: 4 and "12 more")
# A drive letter: OSWorld's Windows tasks name C:\... paths, which no path on this (Linux) guest resembles.
_WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]")


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
    needs: list[str] = field(default_factory=list)  # apps and programs, read when it is supported
    lacking: list[str] = field(default_factory=list)  # those the provider does not have
    provider: str = "xvfb"

    @property
    def supported(self) -> bool:
        return not self.problems

    @property
    def runnable(self) -> bool:
        return self.supported and not self.lacking

    def line(self, every: bool = False) -> str:
        """``ok``, or ``NO`` and one part per reason (first-seen order) with its values, each in full, a value
        repeated shown once with its count; past LINE_VALUES values per reason the rest are counted (all of them
        are in --json, and in the line with ``every``)."""
        if self.supported:
            lacks = f": not runnable on {self.provider} here, it lacks {', '.join(self.lacking)}" if self.lacking else ""
            return f"ok  {self.domain}/{self.id}{lacks}"
        by_reason: dict[str, Counter[str]] = {}
        for p in self.problems:
            by_reason.setdefault(p.reason, Counter())[p.shown] += 1
        parts = []
        for reason, values in by_reason.items():
            named = [v + (f" ({n}x)" if n > 1 else "") for v, n in values.items() if v]
            more = len(named) - LINE_VALUES if not every and len(named) > LINE_VALUES + 1 else 0
            parts.append(reason + (" " if named else "") + ", ".join(named[:len(named) - more])
                         + (f" and {more} more" if more else ""))
        return f"NO  {self.domain}/{self.id}: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "domain": self.domain, "file": str(self.file), "supported": self.supported,
                "reasons": [{"reason": p.reason, "detail": p.detail} for p in self.problems],
                "provider": self.provider, "runnable": self.runnable, "needs": self.needs, "lacking": self.lacking}


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


def read_task(path: Path) -> Any:
    """A task file's JSON (UTF-8, a BOM allowed), or None when it cannot be read as such."""
    data = _read_json(path) if path.is_file() else None
    return None if isinstance(data, Problem) else data


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

# No cache given: looked up as in an empty one (nothing below /dev/null is a file), so every cloud file and
# download a task needs is named, as desktop-env's checks name them for a cache that lacks them.
NO_CACHE = Path(os.devnull)


def check_task(path: Path, domain: str | None = None, task_id: str | None = None,
               cache_dir: Path | None = None, provider: Provider = "xvfb") -> TaskCheck:
    """Every reason the task in ``path`` cannot be reproduced here, as OSWorld's own code finds them
    (osworld/setup.py ``config_problems``, osworld/evaluate.py ``evaluator_problems``, with the task's cache
    ``cache_dir/<id>/``), and the file's own problems (not UTF-8 or JSON, Windows paths). None: the harness
    supports it; then the apps it needs that ``provider`` lacks."""
    check = TaskCheck(task_id or path.stem, domain if domain is not None else path.parent.name, path,
                      provider=provider)
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
    check.problems += task_problems(data, check.id, cache_dir)
    if check.supported:
        check.needs = needs(data)
        check.lacking = lacking(provider, check.needs)
    return check


def task_problems(data: dict[str, Any], task_id: str, cache_dir: Path | None) -> list[Problem]:
    """A task definition's problems, its config's first."""
    config = data.get("config", [])
    evaluator = data.get("evaluator")
    problems = _windows_paths(config) + [Problem(*pair) for pair in config_problems(config, cache_dir, task_id)]
    if evaluator is None:
        problems.append(Problem("no evaluator"))
    else:
        task_cache = cache_dir / task_id if cache_dir is not None else NO_CACHE
        problems += _windows_paths(_getters(evaluator))
        # a task built from it turns accessibility on when its judge reads the tree (osworld_task.py): whether
        # a provider serves the tree is a need of the task's (osworld_apps.py), not a problem
        problems += [Problem(*pair) for pair in evaluator_problems(evaluator, task_cache, accessibility=True)]
    return problems


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _getters(evaluator: Any) -> list[Any]:
    if not isinstance(evaluator, dict):
        return []
    return [evaluator.get("result"), evaluator.get("expected"), evaluator.get("postconfig")]


def _windows_paths(value: Any) -> list[Problem]:
    """A C:\\... path names a file of a Windows guest; the desktops here are Linux (OSWorld's check would only
    fail later, on a request for a path that cannot exist)."""
    return [Problem("windows path", s) for s in _strings(value) if _WINDOWS_PATH.match(s)]


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


def runnable_line(checks: list[TaskCheck], provider: str) -> str:
    """How many supported tasks the provider can run, and the apps the others need (most tasks first)."""
    supported = [c for c in checks if c.supported]
    blocked = [c for c in supported if c.lacking]
    apps = Counter(app for c in blocked for app in c.lacking)
    common = ", ".join(f"{app} {n}" for app, n in sorted(apps.items(), key=lambda item: (-item[1], item[0])))
    return (f"of the {len(supported)} supported, {len(supported) - len(blocked)} runnable on {provider} here"
            + (f" ({len(blocked)} need an app: {common})" if blocked else ""))


def report(paths: list[Path], out: TextIO, *, examples: Path | None = None, cache_dir: Path | None = None,
           as_json: bool = False, verbose: bool = False, provider: Provider = "xvfb") -> int:
    """Print the check of every task found; 0 when all are supported, 1 when some are not, 2 when none found."""
    found = collect(paths, examples)
    if not found.tasks:
        return 2
    checks = [check_task(file, domain, task_id, cache_dir, provider) for file, domain, task_id in found.tasks]
    bad = sum(not c.supported for c in checks)
    if as_json:
        for check in checks:
            print(json.dumps(check.to_json(), sort_keys=True), file=out)
        return 1 if bad else 0
    for check in checks:
        print(check.line(every=verbose), file=out)
    if found.skipped:
        print(f"skipped {len(found.skipped)} JSON file(s) that are not task definitions (no id and instruction)"
              + (": " + ", ".join(map(str, found.skipped)) if verbose else ""), file=out)
    for line in summary_lines(checks):
        print(line, file=out)
    reasons = {p.reason for c in checks for p in c.problems}
    known = package.index()
    if verbose or "unknown metric" in reasons:
        print(f"desktop-env's metrics: {', '.join(sorted(known['metric']))}", file=out)
    if verbose or "unknown getter" in reasons:
        print(f"desktop-env's getters: {', '.join(sorted(known['getter']))}", file=out)
    print(runnable_line(checks, provider), file=out)
    print(f"{len(checks) - bad} supported, {bad} not supported (of {len(checks)})", file=out)
    return 1 if bad else 0


__all__ = ["NO_CACHE", "Inputs", "Problem", "TaskCheck", "check_task", "collect", "is_task", "is_task_list",
           "read_task", "report", "runnable_line", "summary_lines", "task_problems"]
