"""The controller of a retrace run (or its only process without xdist): every test's record as it arrives, a
crashed worker's test as an infrastructure error, and at the end the summary, the gate, the saved baseline and
the terminal's summary tables."""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.plugin.collection import case_runs, forward_runs_in
from pytest_retrace.plugin.options import FORWARD_LIKE, option, settings_key
from pytest_retrace.plugin.workers import distributes
from pytest_retrace.replay.cases import load_case
from pytest_retrace.results.baseline import baseline_path
from pytest_retrace.results.baseline import save as save_baseline
from pytest_retrace.results.baseline import verdicts as baseline_verdicts
from pytest_retrace.results.forward import ForwardRecord
from pytest_retrace.results.gate import CaseFileError, GateResult, format_gate
from pytest_retrace.results.records import Failure, Record
from pytest_retrace.results.session import RetraceSession

session_key = pytest.StashKey[RetraceSession]()
# What the session's end imports: the figures' matplotlib and the intention measure's scikit-learn, 2.2 CPU-s
# (benchmarks/bench_startup.py). Under xdist the controller only waits while the workers test, and the end runs
# on one core after the last test: imported on a thread meanwhile, they are off that tail.
END_IMPORTS = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.style",
               "matplotlib.backends.backend_pdf", "matplotlib.backends.backend_svg",  # fontTools: 0.33 CPU-s
               "pytest_retrace.results.plots", "pytest_retrace.results.report", "sklearn.feature_extraction.text")


def _prefetch(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the end imports it again and reports what is wrong there
            continue


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """pytest-xdist reports a test whose worker died (kill -9, out of memory) as failed at stage "???", and pytest
    would count it among the failed recoveries; it is an infrastructure error (the record's `crash`), so pytest's
    summary counts it as an error, like every other infrastructure error."""
    if (report.when == "???" and report.failed and ("::test_recovery[" in report.nodeid or "::test_forward[" in report.nodeid)
            and settings_key in config.stash):
        return "error", "E", "ERROR"
    return None


class Controller:
    """Registered on the controller (or the only process) of a retrace run: collects every record,
    writes results.jsonl as tests finish, and the summary at the end."""

    def __init__(self, config: pytest.Config, session: RetraceSession) -> None:
        self.config, self.session = config, session
        self.case_file_errors: dict[str, CaseFileError] = {}  # by file: under xdist every worker collects
        self.gate: GateResult | None = None  # None: no gate option set
        self.saved_baseline: Path | None = None
        self.prefetch: threading.Thread | None = None

    def pytest_sessionstart(self) -> None:
        if distributes(self.config):
            self.prefetch = threading.Thread(target=_prefetch, args=(END_IMPORTS,), name="retrace-prefetch",
                                             daemon=True)
            self.prefetch.start()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a case file that could not be loaded (reported by the worker that collected it)
            file = report.nodeid.split("::")[0] or report.nodeid
            error = _case_file_error(file, report.longreprtext, self.config.rootpath)
            self.case_file_errors.setdefault(file, error)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        forward = getattr(report, "retrace_forward", None)
        if forward is not None or (report.when == "???" and "::test_forward[" in report.nodeid):
            record = ForwardRecord.from_dict(forward) if forward is not None else self._forward_crash(report)
            if record is not None:
                self.session.add_forward(record)
                self.config.hook.pytest_retrace_forward_record(record=record, config=self.config)
            return
        data = getattr(report, "retrace_record", None)
        if data is not None:
            record = Record.from_dict(data)
        elif report.when == "???" and report.failed:  # pytest-xdist: the worker running this test died
            record = self._crash_record(report)
            if record is None:
                return
        else:
            return
        self.session.add(record)
        self.config.hook.pytest_retrace_record(record=record, config=self.config)

    def _crash_record(self, report: pytest.TestReport) -> Record | None:
        """A test whose worker crashed (kill -9, out of memory) is an infrastructure error of that test (dropped
        only if its case file stopped loading since the worker loaded it). The controller collected nothing (the workers did): its CaseRun comes from the case file and
        the same parametrisation the worker collected it with (collection.case_runs), found by its test id."""
        path, _, rest = report.nodeid.partition("::test_recovery[")
        try:
            case = load_case(self.config.rootpath / path)
        except Exception:  # noqa: BLE001 - changed since the worker loaded it: nothing to name the test by
            return None
        param = rest.removesuffix("]")
        run = next((r for r in case_runs(case, self.config.stash[settings_key]) if r.id == param), None)
        if run is None:
            return None
        failure = Failure(stage="worker", kind="crash", message=str(report.longrepr)[:2000])
        return Record.of_error(run, failure, nodeid=report.nodeid)

    def _forward_crash(self, report: pytest.TestReport) -> ForwardRecord | None:
        """A forward test whose worker died: an infrastructure error, found as _crash_record finds a recovery's."""
        if not report.failed:
            return None
        path, _, rest = report.nodeid.partition("::test_forward[")
        try:
            runs = forward_runs_in(self.config.rootpath / path, self.config.stash[settings_key])
        except Exception:  # noqa: BLE001 - changed since the worker loaded it
            return None
        param = rest.removesuffix("]")
        run = next((r for r in runs if r.id == param), None)
        if run is None:
            return None
        return ForwardRecord.of_error(run, Failure(stage="worker", kind="crash", message=str(report.longrepr)[:2000]),
                                      nodeid=report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.prefetch is not None:
            self.prefetch.join()  # no import left running into the summary, or into the interpreter's exit
        if self.config.option.collectonly:
            return  # nothing ran: no run directory, no summary
        settings = self.config.stash[settings_key]
        errors = list(self.case_file_errors.values())
        summary = self.session.finish({
            "models": [m.name for m in settings.models], "env": settings.env.describe(), "budgets": list(settings.budgets),
            "ssim_threshold": settings.ssim_threshold, "exitstatus": int(exitstatus), "sample": settings.sample,
            "collection_errors": len(errors), "case_file_errors": [{"file": e.file, "error": e.error} for e in errors],
            "experiment": settings.experiment, **({"max_steps": settings.max_steps} if settings.experiment in FORWARD_LIKE else {}),
            **({"protocol": settings.protocol} if settings.protocol != "default" else {}),
        }, root=self.config.rootpath, models=[*settings.models, *filter(None, (settings.contextualizer, settings.verifier))])
        self.pytest_session = session  # its exitstatus, final at pytest_unconfigure, goes into summary.json
        # an interrupted or broken session keeps its status: no gate, no baseline saved from it
        completed = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        if settings.gate.active and completed:
            self.gate = settings.gate.evaluate(summary, self.session.records, errors)
            summary = summary.gated(self.gate.verdict(settings.gate))
        name = option(self.config, "save-baseline")
        if name and completed:
            self.saved_baseline = baseline_path(str(name), settings.report_dir)
            save_baseline(self.saved_baseline, self.session.run_dir.name, self.session.records)
            summary = summary.with_run(saved_baseline=str(self.saved_baseline))
        session.exitstatus = summary.exit_status(exitstatus)
        summary = self.session.summary = summary.with_run(exitstatus=int(session.exitstatus))
        self.config.hook.pytest_retrace_summary(summary=summary, run_dir=str(self.session.run_dir), config=self.config)

    def pytest_unconfigure(self) -> None:
        if self.session.summary is not None and hasattr(self, "pytest_session"):
            self.session.set_exitstatus(int(self.pytest_session.exitstatus))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_retrace.results.tables import format_table

        summary, tr = self.session.summary, terminalreporter
        if summary is None:
            return
        if summary.end_to_end:
            from pytest_retrace.results.tables import format_end_to_end

            tr.write_sep("=", "retrace end-to-end recovery summary")
            tr.write_line(format_end_to_end(summary.end_to_end))
            tr.write_line(f"results: {self.session.forward_path}")
            return
        if summary.ideal_recovery:
            from pytest_retrace.results.tables import format_success

            tr.write_sep("=", "retrace ideal-recovery summary (Success@K)")
            tr.write_line(format_success(summary.ideal_recovery))
            tr.write_line(f"results: {self.session.forward_path}")
            return
        if summary.forward:
            from pytest_retrace.results.tables import format_forward

            tr.write_sep("=", "retrace forward summary")
            tr.write_line(format_forward(summary.forward))
            tr.write_line(f"results: {self.session.forward_path}")
            return
        tr.write_sep("=", "retrace recovery summary")
        tr.write_line(format_table(summary))
        if len({d.domain for d in summary.domains}) > 1:
            tr.write_line("")
            tr.write_line(format_table(summary, by_domain=True))
        if summary.n_errors:
            tr.write_line(f"infrastructure errors (excluded from rates): {summary.error_kinds}")
        if summary.n_ignored_reruns:
            tr.write_line(f"{summary.n_ignored_reruns} rerun(s) of tests that already had a verdict in this run "
                          f"were ignored: a finished verdict is final (a new measurement needs a new --retrace-run)")
        if self.case_file_errors:  # pytest's own report of them is hidden under `retrace run` (--tb=no)
            tr.write_line(f"{len(self.case_file_errors)} case file(s) could not be loaded (not in any rate):",
                          red=True)
            for error in self.case_file_errors.values():
                tr.write_line(f"  {error}")
        tr.write_line(f"results: {self.session.results_path}")
        if self.saved_baseline is not None:
            n = len(baseline_verdicts(self.session.records))
            tr.write_line(f"baseline saved: {self.saved_baseline} "
                          f"({n} verdict(s) of run {self.session.run_dir.name})")
        if self.gate is not None:
            tr.write_sep("=", "retrace gate: " + ("passed" if self.gate.passed else "FAILED"))
            for line in format_gate(self.gate, self.config.stash[settings_key].gate):
                tr.write_line(line)


def _case_file_error(file: str, text: str, rootpath: Path) -> CaseFileError:
    """The error's first line (a CaseError's whole message; a loader bug's header, not its traceback), without
    the file's own path when it starts with it."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no error text")
    for prefix in (f"{rootpath / file}: ", f"{file}: "):
        first = first.removeprefix(prefix)
    return CaseFileError(file, first)
