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

The task (instruction, setup, evaluator) comes from OSWorld's ``evaluation_examples/examples/<domain>/
<task_id>.json`` or from a ``task.json`` / ``example.json`` next to ``traj.jsonl`` (some forks write one).
The original task JSON is kept in ``metadata["osworld_task"]``.  Only what this package can reproduce is
imported as is: setup ``launch`` / ``command`` / ``execute`` / ``open`` / ``activate_window``, ``upload_file``
and ``download`` when the file is here (a local path, a ``file://`` URL, or a URL found in an OSWorld cache
directory: there is no network), ``sleep`` skipped (the environment settles by itself) — docs/osworld.md
has the mapping —, and evaluators accepted by :func:`validate_evaluator` without ``postconfig`` steps (the
environment does not run them).  Anything else drops the trajectory, unless
``keep_unsupported=True``: then it is kept with ``metadata["evaluator_supported"] = False`` and a
placeholder evaluator that never passes, and/or without the unsupported setup steps (listed in
``metadata["unsupported_config"]``).  Such trajectories can only be replayed faithfully by an
OSWorld-compatible remote environment (future work); a local replay would fail its evaluator.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import shlex
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import TypeAdapter, ValidationError

from pytest_retrace.dataset.trajectory import Dropped, Step, Trajectory, normalise_steps
from pytest_retrace.envs.steps import SetupStep, show
from pytest_retrace.evaluators import EvaluatorError, validate_evaluator
from pytest_retrace.replay.cases import Task

#: What a kept-but-unsupported evaluator is replaced by: a check that is well-formed and never passes.
PLACEHOLDER_EVALUATOR: dict[str, Any] = {
    "func": "exact_match",
    "result": {"type": "rule", "rules": "unsupported"},
    "expected": {"type": "rule", "rules": "osworld"},
}
TASK_SIBLINGS = ("task.json", "example.json")  # forks that store the task next to traj.jsonl
COMMAND_TIMEOUT = 120.0  # OSWorld's server allows setup commands this long
_LAUNCH_TYPES = frozenset({"launch"})
_COMMAND_TYPES = frozenset({"command", "execute"})
_SKIPPED_TYPES = frozenset({"sleep"})
_FILE_TYPES = frozenset({"upload_file", "download"})  # OSWorld: a local file / a URL, uploaded to the VM
_STEP: TypeAdapter[Any] = TypeAdapter(SetupStep)


def import_osworld(
    results_dir: Path, examples_dir: Path | None = None, *, keep_unsupported: bool = False,
    cache_dir: Path | None = None,
) -> tuple[list[Trajectory], list[Dropped]]:
    """Every ``traj.jsonl`` below ``results_dir`` (any depth) as a trajectory, or a drop with its reason.

    ``examples_dir`` is OSWorld's ``evaluation_examples/examples`` (``<domain>/<task_id>.json``);
    ``cache_dir`` an OSWorld cache directory (``<task_id>/<file>``) where files its tasks download are found.
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
        out = _import_task_dir(traj_file.parent, results_dir, examples_dir, keep_unsupported, cache_dir)
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
    task_dir: Path, results_dir: Path, examples_dir: Path | None, keep_unsupported: bool, cache_dir: Path | None
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

    raw_task = _task_definition(task_dir, domain, task_id, examples_dir)
    if isinstance(raw_task, str):
        return Dropped(source, raw_task)
    task_json, task_path = raw_task
    built = _build_task(task_json, domain, task_id, keep_unsupported, cache_dir)
    if isinstance(built, str):
        return Dropped(source, built)
    task, task_meta = built

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
        **task_meta,
    }
    if (task_dir / "recording.mp4").is_file():
        metadata["recording"] = str(task_dir / "recording.mp4")
    return Trajectory(
        id=f"osworld-{domain}-{task_id}", task=task, steps=step_list, source=source, success=True,
        metadata=metadata, base_dir=task_dir,
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


# --- the task ------------------------------------------------------------------------------------


def _task_definition(
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


def _build_task(
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


def check_task(path: Path, cache_dir: Path | None = None) -> tuple[str, list[str]]:
    """``retrace osworld check``: a task JSON's id and every reason it cannot be reproduced here (none: it can
    — its setup converts to our steps, the files it uploads are here, and its evaluator maps onto ours).
    ``cache_dir`` is as :func:`import_osworld`'s."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return path.stem, [f"not a readable task JSON: {exc}"]
    if not isinstance(data, dict):
        return path.stem, ["not a task: the top level must be an object"]
    task_id = str(data.get("id") or path.stem)
    problems = []
    if not isinstance(data.get("instruction"), str) or not data["instruction"].strip():
        problems.append("instruction: missing or empty")
    config = data.get("config", [])
    if not isinstance(config, list):
        problems.append("config: must be a list of steps")
    else:
        problems += [reason for _kind, reason in convert_config(config, task_id=task_id, cache_dir=cache_dir)[1]]
    if (problem := evaluator_problem(data.get("evaluator"))) is not None:
        problems.append(f"evaluator: {problem}")
    return task_id, problems


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


def convert_config(
    config: list[Any], *, task_id: str | None = None, cache_dir: Path | None = None
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """OSWorld setup config -> our setup steps, and the (type, reason) of every step we cannot do.

    ``task_id`` and ``cache_dir`` locate the files ``download`` / ``upload_file`` steps fetch from a URL
    (OSWorld's cache: ``<cache_dir>/<task_id>/<file>``)."""
    steps: list[dict[str, Any]] = []
    unsupported: list[tuple[str, str]] = []
    for i, item in enumerate(config):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            unsupported.append(("?", f"config step {i}: not a {{type, parameters}} mapping"))
            continue
        kind = item["type"]
        params = item.get("parameters")
        if params is None:  # some forks put the parameters inline
            params = {k: v for k, v in item.items() if k != "type"}
        if not isinstance(params, dict):
            unsupported.append((kind, f"config step {i} ({kind}): parameters must be a mapping"))
            continue
        try:
            converted = _convert_step(kind, params, _Files(task_id, cache_dir))
            if converted is not None:
                converted = [_checked(step, {}) for step in converted]
        except ValueError as exc:
            unsupported.append((kind, f"config step {i} ({kind}): {exc}"))
            continue
        if converted is None:
            unsupported.append((kind, f"config step type {kind} not supported"))
        else:
            steps += converted
    return steps, unsupported


@dataclass(frozen=True)
class _Files:
    """Where the files of a task's download / upload_file steps are looked up."""

    task_id: str | None
    cache_dir: Path | None


def _checked(step: dict[str, Any], names: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """`step` once our schema accepts it, else a ValueError naming the field as OSWorld calls it (`names`:
    ours -> theirs), so `retrace osworld check` and the import agree on what converts."""
    try:
        _STEP.validate_python(step)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"][1:])  # loc[0] is the step's type tag
        where = prefix + names.get(field, field)
        raise ValueError(f"{where + ': ' if where else ''}{str(err['msg']).removeprefix('Value error, ')}") from None
    return step


def _command(params: dict[str, Any]) -> list[str] | str:
    command = params.get("command")
    if isinstance(command, str) and command.strip():
        return command
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        return command
    raise ValueError(f"command must be a non-empty string or list of strings, got {command!r}")


def _shell_word(arg: str) -> str:
    """Quote one argument for sh, leaving a leading ~/ unquoted (OSWorld's server expands it)."""
    if arg == "~":
        return arg
    if arg.startswith("~/"):
        return "~/" + shlex.quote(arg[2:]) if arg[2:] else "~/"
    return shlex.quote(arg)


def _convert_step(kind: str, params: dict[str, Any], files: _Files) -> list[dict[str, Any]] | None:
    """Our steps for one OSWorld step ([] when it needs none), None for a type we do not support; a ValueError
    says what is wrong with a step of a supported type."""
    if kind in _SKIPPED_TYPES:
        return []  # our environment waits for a stable screen after setup
    if kind in _LAUNCH_TYPES:
        command = _command(params)
        if params.get("shell"):  # Popen(command, shell=True)
            command = ["sh", "-c", *([command] if isinstance(command, str) else command)]
        return [{"type": "launch", "command": command}]
    if kind in _COMMAND_TYPES:
        if params.get("until"):
            raise ValueError("'until' (retry until the output matches) is not supported")
        command = _command(params)
        if params.get("shell"):
            text = command if isinstance(command, str) else shlex.join(["sh", "-c", *command])
        else:  # OSWorld splits a string like the shell would and runs the argv
            argv = shlex.split(command) if isinstance(command, str) else command
            text = " ".join(_shell_word(a) for a in argv)
        # OSWorld ignores a setup command's exit status; ours must exit 0, so make it so.
        return [{"type": "command", "command": f"{{ {text}\n}} || true", "timeout": COMMAND_TIMEOUT}]
    if kind == "open":
        path = params.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        return [{"type": "launch", "command": ["xdg-open", path]}]
    if kind == "activate_window":
        return [_activate_window(params)]
    if kind in _FILE_TYPES:
        return _file_steps(kind, params, files)
    return None


def _only(params: dict[str, Any], kind: str, known: tuple[str, ...]) -> None:
    """OSWorld calls the step's method with the parameters as keywords: an unknown one fails there too."""
    extra = sorted(set(params) - set(known))
    if extra:
        raise ValueError(f"unknown parameter(s) {', '.join(map(repr, extra))} (OSWorld's {kind} takes "
                         f"{', '.join(known)})")


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {show(value)}")  # noqa: TRY004 - a reason to report
    return value


# --- activate_window --------------------------------------------------------------------------------


def _activate_window(params: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's server runs ``wmctrl -a NAME`` (``-F``: strict, the exact title; ``-x``: by_class, WM_CLASS):
    our ``activate`` step has the same matching rules (envs/setup.py)."""
    _only(params, "activate_window", ("window_name", "strict", "by_class"))
    name = params.get("window_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"window_name must be a non-empty string, got {show(name)}")
    step = {"type": "activate", "window": name, "exact": _flag(params, "strict"),
            "by_class": _flag(params, "by_class")}
    return _checked(step, {"window": "window_name", "exact": "strict"})


# --- upload_file / download -------------------------------------------------------------------------


def _file_steps(kind: str, params: dict[str, Any], files: _Files) -> list[dict[str, Any]]:
    """One ``file`` step per entry of ``files``, its ``src`` the absolute path of the file found here (the
    build copies it into each case's directory)."""
    _only(params, kind, ("files",))
    entries = params.get("files")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"files must be a non-empty list of {{url or local_path, path}} mappings, got "
                         f"{show(entries)}")
    steps = []
    for j, entry in enumerate(entries):
        where = f"files[{j}]"
        if not isinstance(entry, dict):
            raise ValueError(  # noqa: TRY004 - a reason to report, as every problem of a step
                f"{where} must be a {{url or local_path, path}} mapping, got {show(entry)}")
        dest = entry.get("path")
        if not isinstance(dest, str) or not dest.strip():
            raise ValueError(f"{where}.path must be a non-empty string (where the file goes), got {show(dest)}")
        source = _source(where, entry, dest, files)
        steps.append(_checked({"type": "file", "path": dest, "src": str(source)}, {}, prefix=f"{where}."))
    return steps


def _source(where: str, entry: dict[str, Any], dest: str, files: _Files) -> Path:
    """The file an entry uploads: OSWorld's upload_file names a ``local_path``; download (and some forks'
    upload_file) a ``url``."""
    extra = sorted(set(entry) - {"url", "local_path", "path"})
    if extra:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, extra))} (expected url or local_path, "
                         "and path)")
    if ("url" in entry) == ("local_path" in entry):
        raise ValueError(f"{where}: give exactly one of 'url' or 'local_path', got keys {sorted(entry)}")
    field = "url" if "url" in entry else "local_path"
    value = entry[field]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.{field} must be a non-empty string, got {show(value)}")
    if field == "local_path":
        return _local_file(f"{where}.local_path", value)
    parts = urlsplit(value)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{where}.url: {value} is a file on another host ({parts.netloc})")
        return _local_file(f"{where}.url", unquote(parts.path))
    if not parts.scheme or len(parts.scheme) == 1:  # a path (a one-letter "scheme" is a Windows drive)
        return _local_file(f"{where}.url", value)
    return _cached_file(where, value, dest, files)


def _local_file(field: str, path: str) -> Path:
    # relative: to the current directory, as OSWorld (which runs from its checkout) reads it
    full = Path(path).absolute()
    if not full.is_file():
        what = "is not a regular file" if full.exists() else "does not exist"
        raise ValueError(f"{field}: {path} {what} here ({full})")
    return full


def cache_names(url: str, dest: str) -> list[str]:
    """The names a downloaded file may have in an OSWorld cache directory ``<cache>/<task_id>/``: OSWorld's own
    (``<uuid5(URL namespace, url)>_<basename of the VM path>``), then the URL's own basename."""
    names = [f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{posixpath.basename(dest)}"]
    base = posixpath.basename(unquote(urlsplit(url).path))
    if base and base not in (".", ".."):
        names.append(base)
    return names


def _cached_file(where: str, url: str, dest: str, files: _Files) -> Path:
    if files.cache_dir is None:
        raise ValueError(f"{where}.url: {url} would be downloaded, and nothing is downloaded here; give the "
                         "OSWorld cache directory holding it (--osworld-cache DIR, laid out as <task id>/<file>)")
    if not files.task_id:
        raise ValueError(f"{where}.url: {url}: the task has no id to find its OSWorld cache directory by")
    tried = [files.cache_dir / files.task_id / name for name in cache_names(url, dest)]
    for path in tried:
        if path.is_file():
            return path.absolute()
    raise ValueError(f"{where}.url: {url} is not in the OSWorld cache (looked for {' and '.join(map(str, tried))})")


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


__all__ = ["PLACEHOLDER_EVALUATOR", "cache_names", "check_task", "convert_config", "evaluator_problem",
           "import_osworld"]
