"""The run's summary: typed and versioned, built in one place (:func:`build_summary`) from the run's records
(its statistics and rows: results.stats), and what summary.json holds (:meth:`Summary.to_dict`, the keys it
always had, written and read only here). The gate's verdict and a saved
baseline are fields of it, set by copying (:meth:`Summary.gated`, :meth:`Summary.with_run`), never by editing
a dict; and the run's exit status is decided here only (:meth:`Summary.exit_status`).

``schema_version`` changes when a field changes meaning or disappears; adding an optional field does not
change it. :meth:`Summary.read` accepts every version written so far (1) and refuses others by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from pytest_retrace.results.endtoend import EndToEndRow, end_to_end_rows
from pytest_retrace.results.forward import ForwardRecord, ForwardRow, forward_rows
from pytest_retrace.results.intention import IntentionRow, intention
from pytest_retrace.results.success import SuccessRow, success_rows
from pytest_retrace.results.records import Record, dedupe, validate_versioned
from pytest_retrace.results.stats import Statistics, summarize

SCHEMA_VERSION = 1  # of summary.json
READS = (1,)  # the versions Summary.read accepts


class SummaryError(ValueError):
    """A summary.json this version cannot read."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseFileProblem(_Frozen):
    """A case file that could not be loaded (summary.json: ``run.case_file_errors``)."""

    file: str
    error: str


class RunInfo(BaseModel):
    """summary.json's ``run``: the run's settings, its outcome, and its provenance (results.provenance:
    commit, versions, command, model configs, case digests), which are kept as they are."""

    model_config = ConfigDict(extra="allow", frozen=True)

    models: list[str]
    env: str
    budgets: list[int]
    ssim_threshold: float
    exitstatus: int  # the process's: set again once it is final (session.write_exitstatus)
    sample: int | None = None  # --retrace-sample K: the first K cases of every app x kind only
    collection_errors: int = 0
    case_file_errors: list[CaseFileProblem] = []
    saved_baseline: str | None = None  # --retrace-save-baseline: where this run's verdicts were saved

    @property
    def provenance(self) -> dict[str, Any]:
        """The fields results.provenance.run_metadata added (started_at, git, versions, command, model_configs,
        cases ...): kept as that module writes them."""
        return dict(self.model_extra or {})


class ErrorAt(_Frozen):
    """Where an infrastructure error happened: the record's Failure without its message."""

    stage: str
    kind: str


class FailedTest(_Frozen):
    """A counted test that did not recover or broke (summary.json: ``failed``): what failed and its artifacts
    (paths relative to the run directory)."""

    nodeid: str
    case: str | None
    model: str
    strategy: str
    budget: int
    run_index: int
    verdict: str
    r_o: bool | None
    r_tc: bool | None
    ssim: float | None
    artifacts: dict[str, str]
    error: ErrorAt | None = None  # an infrastructure error's stage and kind

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)  # "error" only for an infrastructure error, as summary.json always had it
        return out if self.error is not None else {k: v for k, v in out.items() if k != "error"}


class GateVerdict(_Frozen):
    """summary.json's ``gate``, present when a gate option was set (results.gate)."""

    passed: bool
    problems: list[str]
    notes: list[str]
    strict: bool
    baseline: dict[str, Any] | None = None  # --retrace-baseline: its path and every group's comparison


class Summary(Statistics):
    """The run's statistics (results.stats: its rows, read by field) with its settings, failures and gate."""

    schema_version: int = SCHEMA_VERSION
    run: RunInfo
    failed: list[FailedTest] = Field(default_factory=list)  # failed_tests()
    gate: GateVerdict | None = None
    forward: list[ForwardRow] = Field(default_factory=list)  # a forward run's rows (results.forward)
    ideal_recovery: list[SuccessRow] = Field(default_factory=list)  # Success@K of its continuations (results.success)
    end_to_end: list[EndToEndRow] = Field(default_factory=list)  # end-to-end recovery's (results.endtoend)
    # recovery intention (results.intention, Figure 6): where some model explained its recovery
    intention: list[IntentionRow] = Field(default_factory=list)

    # -- copies with one more fact ---------------------------------------------------------------------
    def gated(self, verdict: GateVerdict) -> Summary:
        return self.model_copy(update={"gate": verdict})

    def with_run(self, **fields: Any) -> Summary:
        """A copy whose ``run`` has these fields changed (``exitstatus``, ``saved_baseline``)."""
        return self.model_copy(update={"run": self.run.model_copy(update=fields)})

    # -- the exit status, decided here only ---------------------------------------------------------
    def exit_status(self, status: int, *, measuring: bool = False) -> int:
        """The process's exit status, given pytest's. An interrupted or broken session keeps pytest's. With a
        gate option, the gate decides (0 or 1): every benchmark run has failed recoveries. Otherwise plain
        pytest keeps its own (1 when a recovery failed), while ``retrace run`` (``measuring``) exits 0 for a
        completed run whatever the agents scored, and 4 when a case file did not load."""
        if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return int(status)
        if self.gate is not None:
            return int(pytest.ExitCode.OK if self.gate.passed else pytest.ExitCode.TESTS_FAILED)
        if not measuring:
            return int(status)
        return int(pytest.ExitCode.USAGE_ERROR if self.run.collection_errors else pytest.ExitCode.OK)

    # -- summary.json ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """summary.json's object: the keys it always had. ``gate`` and ``run.saved_baseline`` appear only
        when there is one, as before."""
        out = self.model_dump(mode="json", exclude={"gate"} if self.gate is None else set())
        for experiment in ("forward", "ideal_recovery", "end_to_end", "intention"):
            if not getattr(self, experiment):
                del out[experiment]  # a recovery run's summary.json has the keys it always had
        if self.run.saved_baseline is None:
            del out["run"]["saved_baseline"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Summary:
        return validate_versioned(cls, data, what="summary", reads=READS, error=SummaryError)

    @classmethod
    def read(cls, path: Path) -> Summary:
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:  # SummaryError is a ValueError too
            raise SummaryError(f"{path}: {exc}") from None

    # -- for hook implementations written against the dict this hook passed before -------------------
    def __getitem__(self, key: str) -> Any:
        """``summary["groups"]``: summary.json's value (plain JSON), as a dict summary gave it."""
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)


def build_summary(records: Iterable[Record], run: RunInfo, forward: Iterable[ForwardRecord] = (),
                  prompt_files: Callable[[str], dict[str, Path] | None] | None = None) -> Summary:
    """The summary of a run's records (results.stats) with its ``run`` and the tests that failed; a forward
    run's records make its ``forward`` rows, an ideal-recovery run's continuations its ``ideal_recovery`` rows, an
    end-to-end run's episodes its ``end_to_end`` rows. Given each model's prompt files (``prompt_files``, model
    name -> key -> path), the recovery intention of the models that explained their recovery."""
    records, forward = list(records), list(forward)
    spoke = prompt_files is not None and any(s.stage == "recover" and s.rationale for r in records for s in r.actions)
    stats = summarize(records, shared_across_strategies=(run.model_extra or {}).get("protocol") == "paper")
    return Summary(**{name: getattr(stats, name) for name in Statistics.model_fields}, run=run,
                   failed=failed_tests(records), forward=forward_rows(forward), ideal_recovery=success_rows(forward),
                   end_to_end=end_to_end_rows(forward),
                   intention=intention(records, prompt_files) if spoke and prompt_files else [])


def failed_tests(records: Sequence[Record]) -> list[FailedTest]:
    """Every counted test that did not recover or broke, by test id: the summary of a run does not depend on the
    order its tests ran or finished in (xdist hands them out spread over the domains, plugin/collection.py)."""
    return [FailedTest(nodeid=r.nodeid, case=r.case, model=r.model, strategy=r.strategy, budget=r.budget,
                       run_index=r.run_index, verdict=r.verdict, r_o=r.r_o, r_tc=r.r_tc, ssim=r.ssim,
                       artifacts=dict(r.artifacts),
                       error=None if r.error is None else ErrorAt(stage=r.error.stage, kind=r.error.kind))
            for r in sorted(dedupe(records)[0], key=lambda r: r.nodeid) if r.verdict != "recovered"]
