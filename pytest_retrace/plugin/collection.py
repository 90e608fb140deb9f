"""Collection: a case YAML under the case roots is a test module (:class:`CaseFile`) holding one test,
``test_recovery``, parametrized with a :class:`CaseRun` per model x strategy x budget x run; ``--retrace-sample``
and ``--retrace-resume`` deselect."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.plugin.options import Settings, settings_key, strategies_of
from pytest_retrace.replay.cases import CaseError, RecoveryCase, load_case
from pytest_retrace.replay.sample import pick
from pytest_retrace.results.caserun import CaseRun, case_run_of

case_key = pytest.StashKey[RecoveryCase]()
finished_key = pytest.StashKey[frozenset[str]]()  # --retrace-resume: nodeids that already have a verdict


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--retrace-sample: the tests of cases outside the sample are deselected; --retrace-resume: a test whose
    verdict is already in the run is not run again (it is deselected)."""
    settings = config.stash.get(settings_key, None)
    if settings is not None and settings.sample is not None:
        runs = {item: run for item in items if (run := case_run_of(item)) is not None}
        chosen = pick((run.case for run in runs.values()), settings.sample)
        left_out = [item for item, run in runs.items() if run.case.id not in chosen]
        if left_out:
            dropped = set(left_out)
            items[:] = [item for item in items if item not in dropped]
            config.hook.pytest_deselected(items=left_out)
    finished = config.stash.get(finished_key, frozenset())
    if not finished:
        return
    done = [item for item in items if item.nodeid in finished]
    if done:
        items[:] = [item for item in items if item.nodeid not in finished]
        config.hook.pytest_deselected(items=done)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    settings = parent.config.stash.get(settings_key, None)
    if settings is None or file_path.suffix not in (".yaml", ".yml"):
        return None
    if any(file_path == root or root in file_path.parents for root in settings.case_roots):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.Module):
    """A case YAML collected like a test module holding one test, ``test_recovery``."""

    def _getobj(self) -> types.ModuleType:
        case = load_case(self.path)  # CaseError -> a collection error naming the file and field
        self.stash[case_key] = case
        from pytest_retrace.plugin import suite

        module = types.ModuleType(f"retrace_case_{case.id}")
        module.__file__ = str(self.path)
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "retrace_run" not in metafunc.fixturenames:
        return
    case = getattr(metafunc.module, "__retrace_case__", None)
    settings = metafunc.config.stash.get(settings_key, None)
    if case is None or settings is None:
        return
    runs = case_runs(case, settings)
    metafunc.parametrize("retrace_run", runs, ids=[r.id for r in runs], scope="function")


def case_runs(case: RecoveryCase, settings: Settings) -> list[CaseRun]:
    """The tests of one case: every model x strategy x budget x run, in the order they are collected."""
    return [CaseRun(case, m, strategy, budget, i, settings.runs) for m in settings.models
            for strategy in strategies_of(settings, m) for budget in settings.budgets for i in range(settings.runs)]
