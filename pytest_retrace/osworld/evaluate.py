"""An OSWorld evaluator block judged by OSWorld's own code (desktop-env's metrics, getters and controllers)
against a VM server, giving the score ``DesktopEnv.evaluate()`` gives on the same state.

As OSWorld: ``postconfig`` runs first (SetupController); ``func: infeasible`` scores 1 iff the last action was
FAIL, and any other task whose last action was FAIL scores 0; per func the result getter, the expected getter
when the block has ``expected``, then the metric with its options; ``conj: and`` is 0 at the first func scoring
0, else the mean; ``or`` is 1 at the first scoring 1, else the max; a result getter raising FileNotFoundError
scores its func 0 (``and``: the whole block).

Where OSWorld would raise out of its evaluation, this tells whose failure it is. The VM server unreachable or
answering 5xx (asked after a getter, metric or postconfig raised or gave None) is an EnvError, the harness's.
A package the harness lacks is an EvaluatorError, never a score. Anything else a getter or metric raises on
is what the agent left (a missing or corrupt file, a closed window): that func scores 0, with the reason and
desktop-env's ERROR log lines in ``details``. A ``cloud_file`` not in the cache is an EvaluatorError naming it
before any request: nothing is downloaded here. A getter that reads the accessibility tree and scored less than
1 is asked about: a desktop serving no tree (a 501: the task runs without AT-SPI) is an EvaluatorError, a tree
that could not be read (5xx, no answer) an EnvError; only with the tree served is the score the agent's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_retrace.envs import EnvError
from pytest_retrace.evaluators import Evaluation, EvaluatorError
from pytest_retrace.osworld import package
from pytest_retrace.osworld.server import VMServer
from pytest_retrace.osworld.setup import Problem, alive, controllers, problems_of, quiet, run_steps
from pytest_retrace.text import clip, show

GOOGLE_GETTERS = frozenset({"googledrive_file"})
CONJ = ("and", "or")
TREE_TIMEOUT = 120  # seconds for GET /accessibility when a getter that reads it scored less than 1


# --- checking -------------------------------------------------------------------------------------------


def evaluator_problems(evaluator: Any, cache_dir: Path | None = None,
                       accessibility: bool = False) -> list[tuple[str, str]]:
    """Every problem of an OSWorld evaluator block as (reason, detail): its shape, each metric and getter
    (unknown, or a package it needs missing), its postconfig steps; with ``cache_dir`` (the task's cache
    directory) also each cloud_file and download not in it; without ``accessibility`` (the task runs with AT-SPI
    on: ``Task.accessibility``), each getter that reads the accessibility tree."""
    return [p.pair for p in _problems(evaluator, "evaluator", cache_dir, accessibility)]


def validate(evaluator: Any, where: str = "evaluator", cache_dir: Path | None = None,
             accessibility: bool = False) -> None:
    """Raise the first of :func:`evaluator_problems` as an EvaluatorError whose message starts with its field."""
    for problem in _problems(evaluator, where, cache_dir, accessibility):
        raise problem.error()


def getter_blocks(evaluator: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every result and expected getter mapping of an evaluator block, with its field (``result``,
    ``expected[1]``); entries that are not mappings are left out."""
    if not isinstance(evaluator, dict):
        return
    for side in ("result", "expected"):
        value = evaluator.get(side)
        listed = isinstance(value, list)
        for k, getter in enumerate(value if listed else [value]):
            if isinstance(getter, dict):
                yield (f"{side}[{k}]" if listed else side), getter


def reads_tree(getter: Any) -> bool:
    """Whether a getter mapping's desktop-env function reads the accessibility tree (found in its code)."""
    entry = package.entry("getter", getter["type"]) if isinstance(getter, dict) and "type" in getter else None
    return entry is not None and package.refers_to(entry, "get_accessibility_tree")


def needs_accessibility(evaluator: Any) -> bool:
    """Whether some result or expected getter of an evaluator block reads the accessibility tree."""
    return any(reads_tree(getter) for _, getter in getter_blocks(evaluator))


def _problems(evaluator: Any, where: str, cache_dir: Path | None, accessibility: bool = False) -> list[Problem]:
    if not isinstance(evaluator, dict):
        return [Problem(where, "invalid evaluator", f"{where}: must be a mapping, got {show(evaluator)}")]
    if (whole := package.package_problem()) is not None:
        return [Problem(where, "desktop-env unavailable", whole)]
    found = list(_shape_problems(evaluator, where))
    if not found:
        for i in range(len(_funcs(evaluator))):
            found += _func_problems(evaluator, i, where, cache_dir, accessibility)
    post = evaluator.get("postconfig", [])
    found += problems_of(post, f"{where}.postconfig", cache_dir, check_files=cache_dir is not None)
    return found


def _funcs(evaluator: dict[str, Any]) -> list[str]:
    func = evaluator["func"]
    return func if isinstance(func, list) else [func]


def _shape_problems(evaluator: dict[str, Any], where: str) -> Iterator[Problem]:
    """OSWorld's block shape: func a name or a list of names; with a list, result/expected/options lists of
    its length (DesktopEnv asserts it); conj and/or."""
    def bad(field: str, why: str) -> Problem:
        return Problem(f"{where}.{field}", "invalid evaluator", f"{where}.{field}: {why}")

    func = evaluator.get("func")
    if isinstance(func, list):
        if not func or not all(isinstance(f, str) and f for f in func):
            yield bad("func", f"must be a metric name or a non-empty list of names, got {show(func)}")
            return
        for field in ("result", "expected", "options"):
            value = evaluator.get(field)
            if field in evaluator and not (isinstance(value, list) and len(value) == len(func)):
                yield bad(field, f"must be a list of {len(func)} (one per func), got {show(value)}")
    elif not isinstance(func, str) or not func:
        yield bad("func", f"must be a metric name or a non-empty list of names, got {show(func)}")
        return
    if "conj" in evaluator and evaluator["conj"] not in CONJ:
        yield bad("conj", f"must be 'and' or 'or', got {show(evaluator['conj'])}")
    if func != "infeasible" and not evaluator.get("result"):
        yield bad("result", "missing: every metric but infeasible judges a result getter's value")


def _func_problems(evaluator: dict[str, Any], i: int, where: str, cache_dir: Path | None,
                   accessibility: bool) -> list[Problem]:
    many = isinstance(evaluator["func"], list)
    at = (lambda field: f"{where}.{field}[{i}]") if many else (lambda field: f"{where}.{field}")
    name = _funcs(evaluator)[i]
    found = _known("metric", name, at("func"))
    options = _part(evaluator, "options", i)
    if options is not None and not isinstance(options, dict):
        found.append(Problem(at("options"), "invalid evaluator", f"{at('options')}: must be a mapping, got "
                                                                  f"{show(options)}"))
    if name == "infeasible":
        return found
    for side in ("result", "expected"):
        config = _part(evaluator, side, i)
        if config is None and side == "expected":
            continue
        if not isinstance(config, dict) or not isinstance(config.get("type"), str):
            found.append(Problem(at(side), "invalid evaluator", f"{at(side)}: must be a getter mapping with a "
                                                               f"type, got {show(config)}"))
            continue
        kind = config["type"]
        if kind in GOOGLE_GETTERS:
            found.append(Problem(at(side), "needs a Google account", kind, "not supported"))
            continue
        found += _known("getter", kind, f"{at(side)}.type")
        if not accessibility and reads_tree(config):
            # without AT-SPI in the task the guest answers /accessibility with a 501: the getter would get None
            # and the func score 0 whatever the agent did
            found.append(Problem(at(side), "needs the accessibility tree", kind,
                                 "reads the desktop's AT-SPI tree: the task must set accessibility: true"))
        if kind == "cloud_file" and cache_dir is not None:
            found += [Problem(at(side), "cloud file not in cache", name, f"not in {cache_dir}")
                      for name in _cloud_missing(config, cache_dir)]
    return found


def _known(kind: package.Kind, name: str, where: str) -> list[Problem]:
    if (why := package.problem(kind, name)) is None:
        return []
    if package.entry(kind, name) is None:
        return [Problem(where, f"unknown {kind}", name, why)]
    found = package.entry(kind, name)
    assert found is not None
    return [Problem(where, "missing package", ", ".join(package.missing(found.needs)), why)]


def _part(evaluator: dict[str, Any], field: str, i: int) -> Any:
    """The func's ``field`` (None when the block has none, or its list entry is null/empty, as OSWorld reads)."""
    value = evaluator.get(field)
    if isinstance(evaluator["func"], list):
        value = value[i] if isinstance(value, list) and i < len(value) else None
    return value or None


def _cloud_missing(config: dict[str, Any], cache_dir: Path) -> list[str]:
    """The files a cloud_file getter would download: its ``dest`` names not in ``cache_dir``."""
    dests = config.get("dest")
    names = dests if isinstance(dests, list) else [dests]
    return [str(d) for d in names if not (isinstance(d, str) and (cache_dir / d).is_file())]


# --- running --------------------------------------------------------------------------------------------


@dataclass
class _Env:
    """The part of OSWorld's DesktopEnv its getters read (``env.<name>`` in desktop_env/evaluators/getters/)."""

    controller: Any
    setup_controller: Any
    vm_ip: str
    server_port: int
    chromium_port: int
    vlc_port: int
    cache_dir: str
    vm_platform: str
    current_use_proxy: bool = False  # no proxy here: DesktopEnv sets it only with OSWorld's proxy pool


@dataclass
class _Func:
    """One func of the block: its score, or why it scored 0."""

    line: str
    score: float | None  # None: the result getter raised FileNotFoundError


def evaluate(evaluator: Any, server: VMServer, cache_dir: Path, *, last_action: str | None = None,
             after_postconfig: Callable[[], str | None] | None = None) -> Evaluation:
    """The score OSWorld's ``DesktopEnv.evaluate()`` gives the desktop behind ``server`` (module docstring).
    ``cache_dir`` is the task's cache directory: its cloud files, and where getters put what they fetch;
    ``after_postconfig`` runs between the postconfig steps and the getters (a wait for what they started), and
    may return a line for the details."""
    validate(evaluator, cache_dir=cache_dir, accessibility=True)  # whether the tree is served: _tree_served
    cache_dir.mkdir(parents=True, exist_ok=True)
    post = evaluator.get("postconfig", [])
    errors: list[str] = []
    if (failure := run_steps(post, server, cache_dir, errors)) is not None:
        alive(server)  # the step failed on what the agent left (a file it did not save), not on the server
        return Evaluation(0.0, False, [f"postconfig: {clip(failure, 300)}" + _logged(errors)])
    done = [f"postconfig: {len(post)} step(s) run"] if post else []
    if post and after_postconfig is not None and (note := after_postconfig()):
        done.append(note)
    if evaluator["func"] == "infeasible":
        score = 1.0 if last_action == "FAIL" else 0.0
        return Evaluation(score, score >= 1.0, [*done, f"infeasible: last action {last_action or 'none'}: {score:g}"])
    if last_action == "FAIL":
        return Evaluation(0.0, False, [*done, "the last action was FAIL on a feasible task: 0"])
    python, setup = controllers(server, cache_dir)
    env = _Env(python, setup, server.host, server.server_port, server.chromium_port, server.vlc_port,
               str(cache_dir), server.platform)
    return _combine(evaluator, env, server, done)


def _combine(evaluator: dict[str, Any], env: _Env, server: VMServer, lines: list[str]) -> Evaluation:
    conj = evaluator.get("conj", "and")
    funcs = _funcs(evaluator)
    scores: list[float] = []
    for i, name in enumerate(funcs):
        func = _run_func(evaluator, i, name, env, server)
        if (func.score or 0.0) < 1.0 and any(reads_tree(_part(evaluator, f, i)) for f in ("result", "expected")):
            _tree_served(server)
        lines.append(func.line)
        score = 0.0 if func.score is None else func.score  # a result file not found: OSWorld's `and` stops at 0
        if conj == "and" and score == 0.0:
            return _verdict(0.0, lines, funcs[i + 1:])
        if conj == "or" and score == 1.0:
            return _verdict(1.0, lines, funcs[i + 1:])
        scores.append(score)
    return _verdict(sum(scores) / len(scores) if conj == "and" else max(scores), lines, [])


def _verdict(score: float, lines: list[str], skipped: list[str]) -> Evaluation:
    lines += [f"{name}: not run (the score was decided)" for name in skipped]
    return Evaluation(score, score >= 1.0, lines)


def _run_func(evaluator: dict[str, Any], i: int, name: str, env: _Env, server: VMServer) -> _Func:
    result, expected, options = (_part(evaluator, f, i) for f in ("result", "expected", "options"))
    label = f"{name}({_describe(result)})"
    errors: list[str] = []
    try:
        value = _call(lambda: package.load("getter", result["type"])(env, result), server, errors, result=True)
        if expected is not None:  # OSWorld: metric(result, expected, **options) when the block has expected
            gold = _call(lambda: package.load("getter", expected["type"])(env, expected), server, errors)
            score = _call(lambda: package.load("metric", name)(value, gold, **(options or {})), server, errors)
        else:
            score = _call(lambda: package.load("metric", name)(value, **(options or {})), server, errors)
    except FileNotFoundError as exc:
        return _Func(f"{label}: 0 (file not found: {exc})" + _logged(errors), None)
    except _Failed as exc:
        return _Func(f"{label}: 0 ({exc})" + _logged(errors), 0.0)
    number = _number(score)
    if value is None:
        label += " [the result getter gave None]"
    if number is None:
        return _Func(f"{label}: 0 (the metric returned {show(score)}, not a score)" + _logged(errors), 0.0)
    return _Func(f"{label}: {number:g}" + (_logged(errors) if number < 1.0 else ""), number)


def _number(score: Any) -> float | None:
    try:
        return float(score)
    except (TypeError, ValueError):
        return None


class _Failed(Exception):
    """A getter or metric failed on the desktop's state while the VM server is fine: the func scores 0."""


def _call(run: Callable[[], Any], server: VMServer, errors: list[str], result: bool = False) -> Any:
    """Run a desktop-env getter or metric quietly. Unavailable -> EvaluatorError; raising or giving None with
    the server gone -> EnvError (alive raises it); raising otherwise -> _Failed, but FileNotFoundError from
    the result getter stays one (OSWorld scores it 0 on its own terms)."""
    try:
        with quiet(errors):
            value = run()
    except package.Unavailable as exc:
        raise EvaluatorError(f"the harness cannot run this evaluator: {exc}") from exc
    except Exception as exc:  # desktop-env's code raises anything on a bad file: the agent's artefact
        alive(server)
        if result and isinstance(exc, FileNotFoundError):
            raise
        raise _Failed(f"{type(exc).__name__}: {clip(str(exc), 200)}") from exc
    if value is None:
        alive(server)  # a getter gives None when its request failed: was that the server?
    return value


def _tree_served(server: VMServer) -> None:
    """After a getter that reads the accessibility tree scored less than 1: was the tree there to read? A 501
    (the task runs without AT-SPI) is an EvaluatorError; any other failure the desktop's, an EnvError."""
    import requests

    url = f"http://{server.host}:{server.server_port}/accessibility"
    try:
        reply = requests.get(url, timeout=TREE_TIMEOUT, proxies={"http": "", "https": ""})
    except requests.RequestException as exc:
        raise EnvError(f"the accessibility tree at {url}: {type(exc).__name__}: {exc}") from exc
    if reply.status_code == 200:
        return
    why = clip(reply.text, 300)
    if reply.status_code == 501:
        raise EvaluatorError(f"the harness cannot run this evaluator: the desktop serves no accessibility tree: {why}")
    raise EnvError(f"the accessibility tree at {url} answers {reply.status_code}: {why}")


def _describe(getter: Any) -> str:
    """A getter as the details name it: its type and the path, command or URL it reads."""
    if not isinstance(getter, dict):
        return ""
    what = next((getter[k] for k in ("path", "command", "dest", "rules") if k in getter), None)
    return f"{getter.get('type')} {clip(show(what) if not isinstance(what, str) else what, 80)}" if what else \
        str(getter.get("type"))


def _logged(errors: list[str]) -> str:
    """desktop-env's ERROR lines, each once (its controller logs every retry) with how often."""
    counted = Counter(errors)
    lines = [f"{line} (x{n})" if n > 1 else line for line, n in counted.items()]
    return f"; desktop-env logged: {clip(' | '.join(lines), 400)}" if lines else ""
