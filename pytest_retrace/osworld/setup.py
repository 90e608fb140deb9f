"""OSWorld's setup steps (a task's ``config``, an evaluator's ``postconfig``) checked before anything runs and run
by OSWorld's own ``SetupController`` (desktop-env) against a VM server: ``retrace guest``, or an OSWorld VM.

Checked: each step is ``{type, parameters}``, SetupController has a ``_<type>_setup`` method that does
something here (``act``, ``replay``, ``tidy_desktop`` raise NotImplementedError in desktop-env; ``login`` and
``googledrive`` need a Google account; ``proxy`` needs OSWorld's proxy pool), the parameters bind to that
method's signature, and every file a step uploads is on this machine: a ``download`` is taken from the cache
(``<cache>/<uuid5(url)>_<name>``, where SetupController looks first), since there is no network here.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_retrace.envs import EnvError
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.osworld import package
from pytest_retrace.text import show

if TYPE_CHECKING:
    from pytest_retrace.osworld.server import VMServer

GOOGLE = frozenset({"login", "googledrive"})
# Steps SetupController has but that cannot work here, and why.
UNSUPPORTED = {
    "act": "not implemented in desktop-env", "replay": "not implemented in desktop-env",
    "tidy_desktop": "not implemented in desktop-env", "proxy": "needs OSWorld's proxy pool and the network",
}
# OSWorld's PythonController sleeps 5 s after each of its 3 tries of a request, for a VM whose server is
# (re)starting. A missing file is a 404 at once, so its 3 tries cost 15 s of sleep (a missing vm_file measured
# 15.0 s per evaluation; 0.6 s at this value), on every task whose agent did not save. A dead server is not
# waited for either way: the evaluation asks GET /platform once after a getter gave nothing (an EnvError).
RETRY_INTERVAL = 0.2
# OSWorld sets no limit on a config's run; its server allows each command 120 s, and a task has a few steps.
SETUP_DEADLINE = 600.0
LOG = "desktopenv"  # desktop-env's loggers are desktopenv.<part>


@dataclass(frozen=True)
class Problem:
    """One reason a config or evaluator cannot run here: where (the field path), a short fixed ``reason``,
    the exact value it is about, and why when the reason alone does not say."""

    path: str
    reason: str
    detail: str
    why: str = ""

    @property
    def pair(self) -> tuple[str, str]:
        return self.reason, self.detail

    def error(self) -> EvaluatorError:
        detail = self.detail.removeprefix(f"{self.path}: ")  # a detail that names its own place says it once
        return EvaluatorError(f"{self.path}: {self.reason}: {detail}" + (f" ({self.why})" if self.why else ""))


def setup_class() -> Any:
    """desktop-env's SetupController (its module prints and warns on import: kept out of the terminal)."""
    with quiet():
        return package.load_module("desktop_env.controllers.setup").SetupController


def controllers(server: VMServer, cache_dir: Path) -> tuple[Any, Any]:
    """desktop-env's PythonController and SetupController for ``server``, caching into ``cache_dir``."""
    with quiet():
        python = package.load_module("desktop_env.controllers.python").PythonController(server.host, server.server_port)
    python.retry_interval = RETRY_INTERVAL
    width, height = server.screen
    setup = setup_class()(server.host, server.server_port, server.chromium_port, server.vlc_port, str(cache_dir),
                          screen_width=width, screen_height=height)
    return python, setup


@contextlib.contextmanager
def quiet(errors: list[str] | None = None) -> Iterator[None]:
    """desktop-env's logs, prints and warnings kept out of the user's terminal (it logs errors on ordinary
    outcomes: a file the agent did not save); its ERROR lines go to ``errors`` when given."""
    logger = logging.getLogger(LOG)
    handler = _Collect(errors if errors is not None else [])
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with warnings.catch_warnings(), _silenced("stdout"), _silenced("stderr"):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class _PerThread:
    """A process stream (sys.stdout, sys.stderr) whose writes from a silenced thread go nowhere. Not
    contextlib.redirect_stdout, which swaps the process's stream: under `retrace build`'s desktop threads one
    thread's desktop-env call swallowed every other thread's output, and two calls that overlapped restored each
    other's StringIO, so the build's log stopped for good after its first OSWorld setup."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.silenced = threading.local()

    def write(self, text: str) -> int:
        return len(text) if getattr(self.silenced, "on", False) else self.real.write(text)

    def flush(self) -> None:
        if not getattr(self.silenced, "on", False):
            self.real.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty: the real stream's
        return getattr(self.real, name)


_STREAMS = threading.Lock()


@contextlib.contextmanager
def _silenced(name: str) -> Iterator[None]:
    with _STREAMS:
        stream = getattr(sys, name)
        if not isinstance(stream, _PerThread):  # installed once; pytest's capture may replace it, then again
            stream = _PerThread(stream)
            setattr(sys, name, stream)
    before = getattr(stream.silenced, "on", False)
    stream.silenced.on = True
    try:
        yield
    finally:
        stream.silenced.on = before


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.name}: {record.getMessage().splitlines()[0] if record.getMessage() else ''}")


# --- checking -------------------------------------------------------------------------------------------


def config_problems(config: Any, cache_dir: Path | None, task_id: str | None) -> list[tuple[str, str]]:
    """Every problem of a setup config as (reason, detail). Downloads are looked up in
    ``cache_dir/<task_id>/`` (OSWorld's cache layout), or in ``cache_dir`` itself without a task id."""
    return [p.pair for p in problems_of(config, "config", _task_cache(cache_dir, task_id))]


def validate_config(config: Any, where: str, cache_dir: Path | None = None, task_id: str | None = None) -> None:
    """Raise the first of :func:`config_problems` as an EvaluatorError (a ValueError) naming the step."""
    for problem in problems_of(config, where, _task_cache(cache_dir, task_id)):
        raise problem.error()


def _task_cache(cache_dir: Path | None, task_id: str | None) -> Path | None:
    return cache_dir / task_id if cache_dir is not None and task_id else cache_dir


def problems_of(config: Any, where: str, cache: Path | None, check_files: bool = True) -> list[Problem]:
    """The problems of a config, found in ``cache`` (a task's cache directory) when ``check_files``."""
    if not isinstance(config, list):
        return [Problem(where, "invalid config", f"must be a list of steps, got {show(config)}")]
    if (whole := package.package_problem()) is not None:
        return [Problem(where, "desktop-env unavailable", whole)]
    found: list[Problem] = []
    for i, step in enumerate(config):
        found += _step_problems(step, f"{where}[{i}]", cache, check_files)
    return found


def _step_problems(step: Any, where: str, cache: Path | None, check_files: bool) -> list[Problem]:
    if not isinstance(step, dict) or not isinstance(step.get("type"), str):
        return [Problem(where, "bad config step", f"{where}: not a {{type, parameters}} mapping: {show(step)}")]
    kind, params = step["type"], step.get("parameters")
    where = f"{where} ({kind})"
    if kind in GOOGLE:
        return [Problem(where, "needs a Google account", kind, "not supported")]
    method = getattr(setup_class(), f"_{kind}_setup", None)
    if method is None:
        return [Problem(where, "unsupported config step", kind, "desktop-env's SetupController has no such step")]
    if kind in UNSUPPORTED:
        return [Problem(where, "unsupported config step", kind, UNSUPPORTED[kind])]
    if not isinstance(params, dict):  # SetupController reads cfg["parameters"] and calls with **parameters
        return [Problem(where, "bad config step", f"{where}: parameters must be a mapping, got {show(params)}")]
    try:
        inspect.signature(method).bind(None, **params)
    except TypeError as exc:
        return [Problem(where, "bad config step", f"{where}: {exc}")]
    if kind == "command":  # SetupController passes its keywords on to _execute_setup
        try:
            inspect.signature(setup_class()._execute_setup).bind(None, **params)
        except TypeError as exc:
            return [Problem(where, "bad config step", f"{where}: {exc}")]
    return _file_problems(kind, params, where, cache) if check_files else []


def _file_problems(kind: str, params: dict[str, Any], where: str, cache: Path | None) -> list[Problem]:
    if kind not in ("download", "upload_file"):
        return []
    files = params.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        return [Problem(where, "bad config step", f"{where}: files must be a list of mappings, got {show(files)}")]
    found = []
    for j, entry in enumerate(files):
        need = ("url", "path") if kind == "download" else ("local_path", "path")
        if not all(isinstance(entry.get(k), str) and entry.get(k) for k in need):
            found.append(Problem(f"{where}.files[{j}]", "bad config step",
                                 f"{where}.files[{j}]: needs {' and '.join(need)} (strings), got {show(entry)}"))
        elif kind == "upload_file" and not os.path.isfile(entry["local_path"]):
            found.append(Problem(f"{where}.files[{j}].local_path", "local file not found", entry["local_path"]))
        elif kind == "download" and not (cache is not None and cached(cache, entry["url"], entry["path"]).is_file()):
            found.append(Problem(f"{where}.files[{j}].url", "cloud file not in cache", entry["url"],
                                 f"looked for {cached(cache, entry['url'], entry['path'])}" if cache is not None
                                 else "no cache directory given, and nothing is downloaded here"))
    return found


def cached(cache: Path, url: str, path: str) -> Path:
    """Where SetupController's ``download`` looks for ``url`` before fetching it."""
    return cache / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{os.path.basename(path)}"


# --- running --------------------------------------------------------------------------------------------


def run_config(config: Any, server: VMServer, cache_dir: Path) -> None:
    """Run a task's setup steps with desktop-env's SetupController. Bad steps are an EvaluatorError before any
    request; a step failing is an EnvError naming it: setup runs before the agent acts, so its failure is the
    harness's, never the agent's."""
    validate_config(config, "config", cache_dir)
    if (failure := run_steps(config, server, cache_dir, [])) is not None:
        raise EnvError(failure)


def run_steps(config: list[dict[str, Any]], server: VMServer, cache_dir: Path, errors: list[str]) -> str | None:
    """Run already validated steps; why they failed (the step and the controller's error), or None. An
    unreachable server is an EnvError at once: SetupController would wait 100 s for it and then return False."""
    alive(server)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _, controller = controllers(server, cache_dir)
    outcome: list[str | None] = []
    worker = threading.Thread(target=lambda: outcome.append(_setup(controller, config)), daemon=True,
                              name="osworld-setup")
    with quiet(errors):
        worker.start()
        worker.join(SETUP_DEADLINE)
        if worker.is_alive():
            # OSWorld's `execute ... until` asks again every 0.3 s for ever while the condition is not met and
            # the server answers; pointed at a closed port its requests fail, and it gives up after 5 failures
            controller.http_server = f"http://{server.host}:9"
            worker.join(60)
            return f"the setup steps did not finish in {SETUP_DEADLINE:g} s (an execute step's `until` not met?)"
    return outcome[0] if outcome else "the setup steps ended without an outcome"


def _setup(controller: Any, config: list[dict[str, Any]]) -> str | None:
    try:
        controller.setup(config)
    except Exception as exc:  # noqa: BLE001 - SetupController wraps every step's failure in a bare Exception
        cause = exc.__cause__ or exc
        return f"{exc}" if str(cause) in str(exc) else f"{exc}: {type(cause).__name__}: {cause}"
    return None


def alive(server: VMServer) -> None:
    """An EnvError unless the VM server answers GET /platform (the harness's server, not the agent's state)."""
    import requests

    url = f"http://{server.host}:{server.server_port}/platform"
    try:
        status = requests.get(url, timeout=10, proxies={"http": "", "https": ""}).status_code
    except requests.RequestException as exc:
        raise EnvError(f"the VM server at {url} is unreachable: {type(exc).__name__}: {exc}") from exc
    if status >= 500:
        raise EnvError(f"the VM server at {url} answers {status}")
