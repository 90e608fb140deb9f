"""retrace's terminal output (``retrace run``'s default, ``--retrace-progress`` under plain pytest): one line
per test saying what it measured, and on a terminal a live line saying what the running tests are doing
(case, model, stage, turn), for runs that take hours against paid APIs.

pytest's own per-test output is turned off for recovery tests (their status letters and words are blanked
through ``pytest_report_teststatus``; the counts in pytest's last line are untouched): under xdist with -v it
prints two lines per test, and its tracebacks of expected failures bury the table.

The live line follows the plugin's own stage hooks. Without xdist they run in this process, inside a test,
where pytest captures the output: the line is redrawn at each stage with capturing suspended for the write
(as ``capsys.disabled()`` does). pytest-xdist has no channel from a worker to the controller while a test runs:
each worker writes its current stage to a small file in the run directory's ``.progress/`` (:class:`StageFile`)
and a thread of the controller reads them twice a second. Only that thread and the per-test lines write to the
terminal while tests run, under one lock, so the live line never tears a result line.
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_retrace.results import rundir
from pytest_retrace.results.caserun import case_run_of, forward_run_of

if TYPE_CHECKING:
    from pytest_retrace.replay.result import Stage
    from pytest_retrace.results.forward import ForwardRecord
    from pytest_retrace.results.records import Record

REFRESH = 0.5  # seconds between redraws of the live line
WHY_WIDTH = 100  # on a terminal, an error's text in a per-test line is cut to this many characters


def _progress_dir(run_dir: Path) -> Path:
    return rundir.progress_dir(run_dir)


class _Current:
    """What this process's test is doing: its case, stage, last turn, and since when it runs."""

    def __init__(self) -> None:
        self.nodeid: str | None = None
        self.turn: int | None = None
        self.since = 0.0

    def update(self, item: pytest.Item, stage: Stage) -> dict[str, Any] | None:
        run, forward = case_run_of(item), forward_run_of(item)
        if run is None and forward is None:
            return None
        if item.nodeid != self.nodeid:
            self.nodeid, self.turn, self.since = item.nodeid, None, time.time()
        self.turn = stage.turn or self.turn
        what = {"case": run.case.id, "model": run.model.name, "max_turns": run.max_turns} if run is not None else {
            "case": forward.task.id, "model": forward.model.name,  # type: ignore[union-attr]
            "max_turns": 2 * forward.max_steps + 2}  # type: ignore[union-attr]
        return {"nodeid": item.nodeid, **what, "stage": stage.name, "title": stage.title, "turn": self.turn,
                "since": self.since}


class StageFile:
    """On an xdist worker: its current stage, in ``<run>/.progress/<worker>.json`` (replaced atomically, so the
    reader never sees half a file)."""

    def __init__(self, run_dir: Path, worker: str) -> None:
        self.path = _progress_dir(run_dir) / f"{worker}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._current = _Current()

    def _write(self, data: dict[str, Any] | None) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            if data is None:
                self.path.unlink(missing_ok=True)
                return
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a progress display must never cost a measurement

    @pytest.hookimpl
    def pytest_retrace_stage_start(self, item: pytest.Item, stage: Stage) -> None:
        doing = self._current.update(item, stage)
        if doing is not None:
            self._write(doing)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._write(None)


class ProgressReporter:
    """On the controller: a line per finished recovery test, and the live line while tests run."""

    def __init__(self, config: pytest.Config, run_dir: Path, runs: int, live: bool | None = None) -> None:
        self.config = config
        self.runs = runs
        self.dir = _progress_dir(run_dir)
        self.live = live
        self.tty = False  # a log (CI) keeps every word of an error; a terminal gets it cut to fit
        self.lock = threading.Lock()
        self.done = 0
        self.recovered = 0
        self.errors = 0
        self._drawn = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current = _Current()

    @property
    def _tr(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    # -- silence pytest's per-test output for recovery tests -----------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        category, letter, word = yield
        if (("::test_recovery[" in report.nodeid or "::test_forward[" in report.nodeid)
                and report.when in ("setup", "call", "teardown", "???")):
            return category, "", ""  # counted in pytest's last line, printed here (pytest_runtest_logreport)
        return category, letter, word

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._session = session
        tr = self._tr
        if tr is None:
            return
        tr.showfspath = False  # no "cases/x.yaml" prefixes before each file's tests
        self.config.option.console_output_style = "classic"  # no [ 50%] fill: each line carries its count
        self.tty = bool(tr.isatty())
        if self.live is None:
            self.live = self.tty
        if self.live and self.config.pluginmanager.has_plugin("dsession"):  # xdist's controller: workers run tests
            self._thread = threading.Thread(target=self._loop, name="retrace-progress", daemon=True)
            self._thread.start()

    # -- the live line without xdist: this process runs the tests -------------------------------------------
    @pytest.hookimpl
    def pytest_retrace_stage_start(self, item: pytest.Item, stage: Stage) -> None:
        if not self.live:
            return
        self._here = self._current.update(item, stage)
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            self._draw(self.status())

    @pytest.hookimpl
    def pytest_runtest_logfinish(self) -> None:
        self._here = None

    _here: dict[str, Any] | None = None

    # -- a line per test ---------------------------------------------------------------------------------
    @pytest.hookimpl
    def pytest_retrace_record(self, record: Record, config: pytest.Config) -> None:
        self.recovered += record.verdict == "recovered"
        word, markup = _word(record)
        what = f"{record.case or record.nodeid:<32}  {record.model} · {record.strategy} · r={record.budget}"
        self._line(record, word, markup, what, _why(record, WHY_WIDTH if self.tty else None))

    @pytest.hookimpl
    def pytest_retrace_forward_record(self, record: ForwardRecord, config: pytest.Config) -> None:
        self.recovered += record.verdict == "solved"  # the live line's count of successes
        word, markup = {"solved": ("SOLVED", {"green": True}), "error": ("ERROR", {"yellow": True})}.get(
            record.verdict, ("NOT SOLVED", {"red": True}))
        if record.error is not None:
            why = _why(record, WHY_WIDTH if self.tty else None)  # type: ignore[arg-type]
        else:
            why = f"score {record.score:g}, {record.steps_used}/{record.max_steps} steps, ended {record.last_action or '-'}"
        how = "forward" if record.start is None else f"R={record.start.condition} ({record.start.step}) · " \
                                                     f"k{record.start.sample + 1}"
        self._line(record, word, markup, f"{record.task:<32}  {record.model} · {how}", why)

    def _line(self, record: Record | ForwardRecord, word: str, markup: dict[str, bool], what: str, why: str) -> None:
        self.done += 1
        self.errors += record.is_error
        total = getattr(self._session, "testscollected", 0) or "?"
        width = len(str(total))
        if self.runs > 1:
            what += f" · run {record.run_index + 1}"
        seconds = record.timings.get("total")
        took = f"  {seconds:.1f}s" if seconds is not None else ""
        with self.lock:
            tr = self._tr
            self._clear(tr)
            tr.ensure_newline()
            tr.write(f"[{self.done:>{width}}/{total}] ")
            tr.write(f"{word:<14}", **markup)
            tr.write(f"{what}  {why}{took}\n")
            tr.flush()

    _session: pytest.Session | None = None

    # -- the live line ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(REFRESH):
            self._draw(self.status())

    def _draw(self, text: str) -> None:
        with self.lock:
            tr = self._tr
            if tr is None:
                return
            if text:
                tr.rewrite(_shorten(text, max(tr._tw.fullwidth - 1, 20)), erase=True, cyan=True)
                tr.flush()
                self._drawn = True
            else:
                self._clear(tr)

    def _running(self) -> list[dict[str, Any]]:
        if self._here is not None:
            return [self._here]
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # replaced or removed while we read: next time
        return out

    def status(self) -> str:
        """``running 2: typo-short (noop) turn 3/22 | ...  ·  12 done, 3 recovered, 0 errors``."""
        now, parts = time.time(), []
        for s in self._running():
            where = f"turn {s['turn']}/{s['max_turns']}" if s["stage"] in ("turn", "recover") and s.get("turn") \
                else s["title"].split(":")[0]
            parts.append(f"{s['case']} ({s['model']}) {where} {now - s['since']:.0f}s")
        if not parts:
            return ""
        return (f"running {len(parts)}: " + " | ".join(parts) +
                f"  ·  {self.done} done, {self.recovered} recovered, {self.errors} errors")

    def _clear(self, tr: Any) -> None:
        if self._drawn and tr is not None:
            tr.rewrite("", erase=True)
            tr.rewrite("")
            self._drawn = False

    @pytest.hookimpl(tryfirst=True)  # before the terminal's summary is written
    def pytest_sessionfinish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.lock:
            self._clear(self._tr)
        for path in self.dir.glob("*"):
            path.unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass


def _shorten(text: str, width: int) -> str:
    """``text`` cut at the last word boundary that fits ``width`` with an ellipsis; a first word longer than
    that is cut inside (textwrap.shorten would leave only the ellipsis)."""
    if len(text) <= width:
        return text
    cut = textwrap.shorten(text, width, placeholder=" …")
    return text[: width - 1] + "…" if cut.strip() == "…" else cut


def _word(record: Record) -> tuple[str, dict[str, bool]]:
    if record.verdict == "recovered":
        return "RECOVERED", {"green": True}
    if record.is_error:
        return "ERROR", {"yellow": True}
    return "NOT RECOVERED", {"red": True}


def _why(record: Record, width: int | None = None) -> str:
    """A few words: which half of the oracle failed, or what broke (the error's whole text, or on a terminal
    at most ``width`` characters of it, cut between words)."""
    if record.error is not None:
        message = " ".join(record.error.message.split())
        text = message if width is None else _shorten(message, width)
        return f"{record.error.kind} at {record.error.stage}: {text}"
    r_o = "-" if record.ssim is None else f"{'ok' if record.r_o else 'failed'} ({record.ssim:.4f})"
    r_tc = "-" if record.r_tc is None else ("ok" if record.r_tc else "failed")
    used = f"{record.actions_used}/{record.budget} actions"
    return f"R_O {r_o}, R_TC {r_tc}, {used}"
