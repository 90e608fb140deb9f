"""pytest-retrace: every recovery case is a pytest test. This module is the plugin's entry point (pytest11
``retrace``): it wires the run together at configure time; each job is a module of its own, registered with
it (pytest_addhooks): options.py (options and Settings), collection.py (case files, parametrisation,
sample and resume), fixtures.py (the worker's fixtures and the test's record), controller.py (records, summary,
gate and baseline at session end), workers.py (how xdist's workers start), dryrun.py. The state of a run lives in ``config.stash``; xdist results
reach the controller inside the test reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.plugin import collection, controller, fixtures, hookspecs, options
from pytest_retrace.plugin.collection import finished_key
from pytest_retrace.plugin.controller import Controller, session_key
from pytest_retrace.plugin.dryrun import DryRun
from pytest_retrace.plugin.experiments import with_experiment
from pytest_retrace.plugin.options import (
    Settings,
    check_models,
    check_rootdir,
    listed,
    option,
    progress_enabled,
    read_settings,
    settings_key,
)
from pytest_retrace.plugin.workers import ForkedWorkers, distributes
from pytest_retrace.results import rundir
from pytest_retrace.results.records import RecordError
from pytest_retrace.results.session import RetraceSession, new_run_name


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Called once, as this plugin is registered: the plugin's own hooks, and each job's module with its hooks
    and fixtures (registered here, not through ``pytest_plugins``: these modules are imported already, and
    pytest would warn that it cannot rewrite their asserts). Blocking this plugin (-p no:retrace) blocks them.
    The test functions' module is marked for assertion rewriting here, not when this module is imported: a worker
    forked from the fork server imported it before pytest's rewriting hook existed."""
    pytest.register_assert_rewrite("pytest_retrace.plugin.suite")  # `assert result == recovered` explains itself
    pluginmanager.add_hookspecs(hookspecs)
    for module in (options, collection, fixtures, controller):
        pluginmanager.register(module, module.__name__)


@pytest.hookimpl(tryfirst=True)  # before xdist's: a dry run must not start workers
def pytest_configure(config: pytest.Config) -> None:
    if listed(config, "model"):
        # before the settings: a moved rootdir also moves the default agents/ and envs/, and the model lookup
        # would then blame the model for what the option's spelling did
        check_rootdir(config)
    settings = read_settings(config)
    if settings is None:
        return
    settings = with_experiment(config, settings)  # the experiments' own options (plugin.experiments)
    config.stash[settings_key] = settings
    if not config.known_args_namespace.file_or_dir:
        # No paths on the command line: the suite is the case directories, wherever they are (pytest's own
        # default, testpaths or the current directory, knows nothing of --retrace-cases).
        config.args = [str(p) for p in settings.case_roots] if settings.plan is None else [str(settings.plan)]
    # One malformed case file must not stop the others: it stays a collection error, the rest runs.
    config.option.continue_on_collection_errors = True
    if settings.restore == "checkpoint" and getattr(config.option, "dist", "no") in ("load", "worksteal"):
        # a case's checkpoint lives on the desktop that took it: its tests go to one worker (xdist reads the
        # mode when its session starts, after this)
        config.option.dist = "loadfile"
    if settings.dry_run:
        config.option.collectonly = True  # list the tests, run none, call no model, need no key
        config.pluginmanager.register(DryRun(settings), "retrace-dry-run")
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        if settings.workers == "fork" and distributes(config):
            config.pluginmanager.register(ForkedWorkers(config, settings), "retrace-forked-workers")
        if not config.option.collectonly:
            check_models(settings)
        session = RetraceSession(_run_dir_of(config, settings))
        try:
            session.load()  # records of an earlier session under this run: the summary covers all of them
        except (OSError, RecordError) as exc:
            raise pytest.UsageError(f"retrace: cannot read the run's results: {exc}") from None
        if option(config, "resume"):
            config.stash[finished_key] = session.finished()
        config.stash[session_key] = session
        config.pluginmanager.register(Controller(config, session), "retrace-controller")
        # the built-in writers are implementations of the plugin's own hooks, like a third party's
        from pytest_retrace.results.writers import Plots, ResultsJsonl, SummaryJson, SummaryMarkdown

        config.pluginmanager.register(ResultsJsonl(session.run_dir), "retrace-results-jsonl")
        config.pluginmanager.register(SummaryJson(), "retrace-summary-json")
        config.pluginmanager.register(Plots(), "retrace-plots")
        config.pluginmanager.register(SummaryMarkdown(), "retrace-summary-md")
        if progress_enabled(config) and not config.option.collectonly:
            from pytest_retrace.results.progress import ProgressReporter

            config.pluginmanager.register(ProgressReporter(config, session.run_dir, settings.runs), "retrace-progress")
    else:
        config.stash[finished_key] = frozenset(workerinput.get("retrace_finished", ()))
        if workerinput.get("retrace_progress"):
            from pytest_retrace.results.progress import StageFile

            config.pluginmanager.register(StageFile(Path(workerinput["retrace_run_dir"]), workerinput["workerid"]),
                                          "retrace-stage-file")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "retrace-xdist")
    if getattr(config.option, "allure_report_dir", None):  # allure-pytest's --alluredir, here and on workers
        from pytest_retrace.results.allure import AllureWriter

        environment = {"models": ", ".join(m.name for m in settings.models), "env": settings.env.describe(),
                       "budgets": ", ".join(map(str, settings.budgets)),
                       "ssim_threshold": str(settings.ssim_threshold), "runs": str(settings.runs)}
        config.pluginmanager.register(AllureWriter(Path(config.option.allure_report_dir), environment),
                                      "retrace-allure")


def _run_dir_of(config: pytest.Config, settings: Settings) -> Path:
    resume = option(config, "resume")
    if not resume:
        return settings.report_dir / (option(config, "run") or new_run_name([m.name for m in settings.models]))
    path = Path(resume)
    run_dir = path if path.is_absolute() or len(path.parts) > 1 else settings.report_dir / path
    if not rundir.results_file(run_dir).is_file() and not rundir.forward_file(run_dir).is_file():
        # (a forward run's records are its forward.jsonl)
        raise pytest.UsageError(f"--retrace-resume: {run_dir} holds no results.jsonl: nothing to resume")
    return run_dir


class _XdistHooks:
    """Registered only when pytest-xdist is present: tell workers where the run directory is, and which
    tests a resumed run already finished."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        session = node.config.stash.get(session_key, None)
        if session is not None:
            node.workerinput["retrace_run_dir"] = str(session.run_dir)
            node.workerinput["retrace_finished"] = sorted(node.config.stash.get(finished_key, ()))
            node.workerinput["retrace_progress"] = progress_enabled(node.config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash.get(settings_key, None)
    if settings is None:
        return []
    models = ", ".join(f"{m.name} ({m.provider})" for m in settings.models)
    budgets = ",".join(map(str, settings.budgets))
    cases = ", ".join(str(p) for p in settings.case_roots)
    if settings.plan is not None:
        return [f"retrace ideal recovery: models {models}; env {settings.env.describe()}; {settings.samples} "
                f"continuation(s) from each of {', '.join(settings.conditions)}; at most {settings.max_steps} steps "
                f"an episode; the plan {settings.plan}"]
    if settings.experiment == "end-to-end":
        most = ",".join(map(str, settings.max_recoveries))
        detectors = f"detectors {settings.error_detector.name}, {settings.recovery_detector.name}; " \
            if settings.error_detector and settings.recovery_detector else ""
        return [f"retrace end-to-end recovery: models {models}; env {settings.env.describe()}; at most "
                f"{settings.max_steps} forward steps, {most} recoveries of {settings.budgets[0]} steps; {detectors}"
                f"the tasks of the cases in {cases}"]
    if settings.experiment == "forward":
        return [f"retrace forward runs: models {models}; env {settings.env.describe()}; at most {settings.max_steps} "
                f"steps; the tasks of the cases in {cases}"]
    protocol = "; the paper's protocol (docs/paper.md)" if settings.protocol == "paper" else ""
    restore = "; s_error restored from checkpoints (a case's tests on one worker: --dist loadfile)" \
        if settings.restore == "checkpoint" else ""
    return [f"retrace: models {models}; env {settings.env.describe()}; budget r={budgets}; "
            f"SSIM >= {settings.ssim_threshold}; cases {cases}{protocol}{restore}"]


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    from pytest_retrace.experiments.forward import ForwardResult
    from pytest_retrace.plugin.assertion import Recovered, Solved, explain, explain_forward
    from pytest_retrace.replay.result import RecoveryResult

    if op == "==" and isinstance(left, RecoveryResult) and isinstance(right, Recovered):
        return explain(left)
    if op == "==" and isinstance(left, ForwardResult) and isinstance(right, Solved):
        return explain_forward(left)
    return None
