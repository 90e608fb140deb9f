"""Collection: a case YAML under the case roots is a test module (:class:`CaseFile`) holding one test,
``test_recovery``, parametrized with a :class:`CaseRun` per model x strategy x budget x run; ``--retrace-sample``
and ``--retrace-resume`` deselect. A forward run (``--retrace-experiment=forward``) collects ``test_forward``
instead, a :class:`ForwardRun` per model x run, kept for the first file (case id, or task file) of each task
only; OSWorld task files (``<domain>/<id>.json``) under the case roots are collected too. An ideal-recovery run
collects its run plan (``--retrace-plan``): ``test_forward`` with a continuation per annotated episode x
condition x k x model."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.plugin.experiments import left_out_by_protocol, recovery_modes_of
from pytest_retrace.plugin.options import FORWARD_LIKE, Settings, settings_key, strategies_of
from pytest_retrace.replay.cases import CaseError, RecoveryCase, Task, load_case
from pytest_retrace.replay.sample import pick
from pytest_retrace.results.caserun import CaseRun, ForwardRun, case_run_of, forward_run_of

case_key = pytest.StashKey[RecoveryCase]()
finished_key = pytest.StashKey[frozenset[str]]()  # --retrace-resume: nodeids that already have a verdict
# end-to-end: per task id, the probe getters of its cases (what a recovery agent's restore must match)
task_getters_key = pytest.StashKey[dict[str, tuple[Any, ...]]]()


def pytest_itemcollected(item: pytest.Item) -> None:
    """A recovery test answers to ``-k`` by its case's horizon, kind and domain as well as by its id
    (``-k horizon_long``, ``-k "kind_hidden-state and not domain_files"``): the paper's figures are per horizon.
    Before -k deselects, which pytest does in its own collection_modifyitems."""
    run = case_run_of(item)
    if run is not None:
        case = run.case
        item.extra_keyword_matches.update({f"horizon_{case.horizon}",
                                           f"kind_{case.metadata.get('kind') or 'unknown'}",
                                           f"domain_{case.task.domain}"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--retrace-sample: the tests of cases outside the sample are deselected; --retrace-resume: a test whose
    verdict is already in the run is not run again (it is deselected)."""
    settings = config.stash.get(settings_key, None)
    if settings is not None and settings.experiment == "end-to-end":  # before any case is deselected
        config.stash[task_getters_key] = _task_getters(items)
    if settings is not None and settings.sample is not None:
        runs = {item: run for item in items if (run := case_run_of(item) or forward_run_of(item)) is not None
                and run.case is not None}  # an OSWorld task file's forward test is no case's: not sampled
        chosen = pick((run.case for run in runs.values()), settings.sample)
        _deselect(config, items, [item for item, run in runs.items() if run.case.id not in chosen])
    _deselect(config, items, _same_task(items))
    if settings is not None and settings.protocol == "paper":  # the paper's case selection (docs/paper.md)
        _deselect(config, items, [item for item in items if (run := case_run_of(item)) is not None
                                  and left_out_by_protocol(settings, run.case) is not None])
    finished = config.stash.get(finished_key, frozenset())
    if finished:
        _deselect(config, items, [item for item in items if item.nodeid in finished])
    if settings is not None and hasattr(config, "workerinput"):
        # an xdist worker: every worker collects alike, and the controller hands out tests in that order
        items[:] = spread(items)


def spread(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests, each domain's case files spread evenly over the run (a file's tests together, each domain's
    files in their order): by collection order the suite ran app by app, and its CPU-heavy apps (chromium,
    LibreOffice) loaded the machine at once while the others mostly waited. Measured on the built-in suite's
    calibration (-n 16, README): the machine evenly busy instead, and the run shorter. Results do not depend
    on the order: every test starts from a fresh desktop."""
    files: dict[Any, list[pytest.Item]] = {}
    domain: dict[Any, str] = {}
    for item in items:
        run, forward = case_run_of(item), forward_run_of(item)
        task = run.case.task if run is not None else forward.task if forward is not None else None
        files.setdefault(item.path, []).append(item)
        domain.setdefault(item.path, task.domain if task is not None else "")
    return [item for path in spread_evenly(domain) for item in files[path]]


def spread_evenly(domains: dict[Any, str]) -> list[Any]:
    """The keys of `domains` (in their order) reordered so that each domain's keys, still in their order, are
    spread evenly: the i-th of a domain's n at (i + 0.5) / n of the whole, ties by the domains' first appearance."""
    by_domain: dict[str, list[Any]] = {}
    for key, name in domains.items():
        by_domain.setdefault(name, []).append(key)
    order = sorted(((i + 0.5) / len(keys), d, i) for d, keys in enumerate(by_domain.values()) for i in range(len(keys)))
    groups = list(by_domain.values())
    return [groups[d][i] for _, d, i in order]


def _deselect(config: pytest.Config, items: list[pytest.Item], left_out: list[pytest.Item]) -> None:
    if left_out:
        dropped = set(left_out)
        items[:] = [item for item in items if item not in dropped]
        config.hook.pytest_deselected(items=left_out)


def _task_getters(items: list[pytest.Item]) -> dict[str, tuple[Any, ...]]:
    """Per task id, the getters of its cases' probes (each once, in case id order): a task's forward test is
    collected from one of its cases, but what any of them probes is state the task's steps may change."""
    cases = {run.case.id: run.case for item in items if (run := forward_run_of(item)) is not None and run.case}
    out: dict[str, dict[str, Any]] = {}
    for case_id in sorted(cases):
        case = cases[case_id]
        for probe in case.probes:
            out.setdefault(case.task.id, {}).setdefault(probe.get.model_dump_json(), probe.get)
    return {task: tuple(getters.values()) for task, getters in out.items()}


def _same_task(items: list[pytest.Item]) -> list[pytest.Item]:
    """Forward tests of a task that an earlier case (by id) holds too: a task is solved once per model and run,
    however many cases were built from it. The same choice on every xdist worker (it depends on ids only)."""
    runs = {item: run for item in items if (run := forward_run_of(item)) is not None}
    first: dict[str, str] = {}
    for run in sorted(runs.values(), key=lambda r: r.source):
        first.setdefault(run.task.id, run.source)
    return [item for item, run in runs.items() if first[run.task.id] != run.source]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    settings = parent.config.stash.get(settings_key, None)
    if settings is not None and settings.plan is not None:
        return PlanFile.from_parent(parent, path=file_path) if file_path == settings.plan else None
    if settings is None or not any(file_path == root or root in file_path.parents for root in settings.case_roots):
        return None
    if file_path.suffix in (".yaml", ".yml"):
        return CaseFile.from_parent(parent, path=file_path)
    if file_path.suffix == ".json" and settings.experiment in ("forward", "end-to-end") and is_osworld_task(file_path):
        return OSWorldTaskFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.Module):
    """A case YAML collected like a test module holding one test, ``test_recovery``."""

    def _getobj(self) -> types.ModuleType:
        case = load_case(self.path)  # CaseError -> a collection error naming the file and field
        self.stash[case_key] = case
        from pytest_retrace.plugin import suite

        module = types.ModuleType(f"retrace_case_{case.id}")
        module.__file__ = str(self.path)
        if self.config.stash[settings_key].experiment in FORWARD_LIKE:
            module.test_forward = suite.test_forward  # type: ignore[attr-defined]
        else:
            module.test_recovery = suite.test_recovery  # type: ignore[attr-defined]
        module.__retrace_case__ = case  # type: ignore[attr-defined]
        return module

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
        if isinstance(excinfo.value, CaseError):
            return str(excinfo.value)
        # A loader bug, not a broken file: still only this file's collection error, with the traceback.
        exc = excinfo.value
        header = f"{self.path}: unexpected {type(exc).__name__} while loading the case: {exc}"
        return f"{header}\n{super().repr_failure(excinfo)}"


class OSWorldTaskFile(CaseFile):
    """An OSWorld task file (OSWorld's schema: ``<domain>/<id>.json``) under the case roots, in a forward run:
    a test module holding ``test_forward``. Its files come from ``--retrace-osworld-cache`` (OSWorld's cache
    layout); a task OSWorld's code cannot run here is this file's collection error, with the reason."""

    def _getobj(self) -> types.ModuleType:
        from pytest_retrace.plugin import suite

        task = load_osworld_task(self.path, self.config.stash[settings_key])
        module = types.ModuleType(f"retrace_task_{task.id}")
        module.__file__ = str(self.path)
        module.test_forward = suite.test_forward  # type: ignore[attr-defined]
        module.__retrace_task__ = task  # type: ignore[attr-defined]
        return module


class PlanFile(CaseFile):
    """The ideal-recovery run plan: a test module holding ``test_forward``, one continuation per annotated
    episode x condition x k x model. An episode it cannot continue (its task file gone) is its collection error."""

    def _getobj(self) -> types.ModuleType:
        from pytest_retrace.experiments.ideal import StartError, starts_of
        from pytest_retrace.experiments.plan import Plan, PlanError
        from pytest_retrace.plugin import suite

        settings = self.config.stash[settings_key]
        try:
            starts = starts_of(Plan.read(self.path), self.path, settings.conditions, settings.samples)
        except (PlanError, StartError) as exc:
            raise CaseError(self.path, "", str(exc)) from None
        module = types.ModuleType("retrace_plan")
        module.__file__ = str(self.path)
        module.test_forward = suite.test_forward  # type: ignore[attr-defined]
        module.__retrace_starts__ = starts  # type: ignore[attr-defined]
        return module


def is_osworld_task(path: Path) -> bool:
    """A JSON object with an instruction and an evaluator (not test_all.json, not a results file)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "instruction" in data and "evaluator" in data


def load_osworld_task(path: Path, settings: Settings) -> Task:
    from pytest_retrace.dataset.osworld_task import build_task

    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))  # a BOM, as OSWorld's Windows tasks have
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CaseError(path, "", f"not an OSWorld task file: {exc}") from None
    task = build_task(data, path.parent.name, path.stem, settings.osworld_cache)
    if isinstance(task, str):
        raise CaseError(path, "", task)
    return task


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    settings = metafunc.config.stash.get(settings_key, None)
    if settings is None:
        return
    if "retrace_forward_run" in metafunc.fixturenames:
        forward = forward_runs_of(metafunc.module, settings)
        metafunc.parametrize("retrace_forward_run", forward, ids=[r.id for r in forward], scope="function")
        return
    case = getattr(metafunc.module, "__retrace_case__", None)
    if case is not None and "retrace_run" in metafunc.fixturenames:
        runs = case_runs(case, settings)
        metafunc.parametrize("retrace_run", runs, ids=[r.id for r in runs], scope="function")


def case_runs(case: RecoveryCase, settings: Settings) -> list[CaseRun]:
    """The tests of one case: every model x strategy x budget x run, in the order they are collected."""
    return [CaseRun(case, m, strategy, budget, i, settings.runs) for m in settings.models
            for strategy in strategies_of(settings, m) for budget in settings.budgets for i in range(settings.runs)]


def forward_runs_of(module: Any, settings: Settings) -> list[ForwardRun]:
    """The forward tests a collected file holds (before _same_task keeps one per task): every model x run. A
    case gives its task, its directory and its ground truth; an OSWorld task file its task only; a run plan its
    continuations (with the ground truth their episode was run with, if any: for the scripted agents)."""
    starts = getattr(module, "__retrace_starts__", None)
    if starts is not None:
        return [ForwardRun(start.task, start.task_dir, start.name, m, settings.max_steps, start=start,
                           ground_truth=start.ground_truth) for start in starts for m in settings.models]
    case: RecoveryCase | None = getattr(module, "__retrace_case__", None)
    if case is not None:
        task, where, source, gt = case.task, case.dir, case.id, tuple(case.trajectory)
    else:
        task, where, gt = module.__retrace_task__, Path(module.__file__).parent, None
        source = module.__file__
    if settings.experiment == "end-to-end":  # each model x recovery mode x max recoveries (none: one) x run
        return [ForwardRun(task, where, source, m, settings.max_steps, i, settings.runs, gt, case, recovery=mode,
                           max_recoveries=most)
                for m in settings.models for mode in recovery_modes_of(settings, m)
                for most in ((0,) if mode == "none" else settings.max_recoveries) for i in range(settings.runs)]
    return [ForwardRun(task, where, source, m, settings.max_steps, i, settings.runs, gt, case)
            for m in settings.models for i in range(settings.runs)]


def forward_runs_in(path: Path, settings: Settings) -> list[ForwardRun]:
    """The forward tests of a file as collected (the controller's view of a crashed worker's test)."""
    if settings.plan is not None and path == settings.plan:
        from pytest_retrace.experiments.ideal import starts_of
        from pytest_retrace.experiments.plan import Plan

        module = types.SimpleNamespace(__retrace_starts__=starts_of(Plan.read(path), path, settings.conditions,
                                                                    settings.samples))
        return forward_runs_of(module, settings)
    if path.suffix == ".json":
        module = types.SimpleNamespace(__retrace_task__=load_osworld_task(path, settings), __file__=str(path))
    else:
        module = types.SimpleNamespace(__retrace_case__=load_case(path))
    return forward_runs_of(module, settings)
