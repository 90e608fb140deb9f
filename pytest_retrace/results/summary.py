"""The run's summary: typed and versioned, built in one place (:func:`build_summary`) from the run's records,
and what summary.json holds (:meth:`Summary.to_dict`, the keys it always had). The gate's verdict and a saved
baseline are fields of it, set by copying (:meth:`Summary.gated`, :meth:`Summary.with_run`), never by editing
a dict; and the run's exit status is decided here only (:meth:`Summary.exit_status`).

``schema_version`` changes when a field changes meaning or disappears; adding an optional field does not
change it. :meth:`Summary.read` accepts every version written so far (1) and refuses others by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_retrace.results.records import Record, dedupe
from pytest_retrace.results.stats import summarize

SCHEMA_VERSION = 1  # of summary.json
READS = (1,)  # the versions Summary.read accepts


class SummaryError(ValueError):
    """A summary.json this version cannot read."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Row(BaseModel):
    """One row of ``groups`` (model × strategy × budget) or of a breakdown (``domains``, ``kinds``,
    ``horizons``): the fields a reader of the summary relies on are typed; the rest of the row (intervals,
    tokens, cost, runs: results.stats.GroupStats) is kept as it is."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str
    strategy: str
    budget: int | None
    domain: str | None  # None: all domains (groups, kinds, horizons)
    n: int  # finished tests (not infrastructure errors)
    recovered: int
    rate: float | None  # None: no finished test
    errors: int
    total: int


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


class GateVerdict(_Frozen):
    """summary.json's ``gate``, present when a gate option was set (results.gate)."""

    passed: bool
    problems: list[str]
    notes: list[str]
    strict: bool
    baseline: dict[str, Any] | None = None  # --retrace-baseline: its path and every group's comparison


class Summary(_Frozen):
    schema_version: int = SCHEMA_VERSION
    groups: list[Row]
    domains: list[Row] = []
    kinds: list[Row] = []
    horizons: list[Row] = []
    n_records: int
    n_errors: int
    n_ignored_reruns: int = 0  # later records of tests that already had a finished verdict
    error_kinds: dict[str, int] = {}
    n_verified_by_determinism: int = 0  # finished tests whose s_error only the recording confirms
    run: RunInfo
    failed: list[dict[str, Any]] = []  # failed_tests()
    gate: GateVerdict | None = None

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
        if self.run.saved_baseline is None:
            del out["run"]["saved_baseline"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Summary:
        if not isinstance(data, dict):
            raise SummaryError(f"a summary must be a JSON object, got {type(data).__name__}")
        if data.get("schema_version") not in READS:
            raise SummaryError(f"summary schema_version {data.get('schema_version')!r}: this version of "
                               f"pytest-retrace reads {', '.join(map(str, READS))}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SummaryError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None

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


def build_summary(records: Iterable[Record], run: RunInfo) -> Summary:
    """The summary of a run's records (results.stats) with its ``run`` and the tests that failed."""
    records = list(records)
    return Summary(**summarize(records), run=run, failed=failed_tests(records))


def failed_tests(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Every counted test that did not recover or broke, in the order they finished: what failed (R_O, R_TC,
    the error's stage and kind) and its artifacts (paths relative to the run directory)."""
    out = []
    for r in dedupe(records)[0]:
        if r.verdict == "recovered":
            continue
        row: dict[str, Any] = {"nodeid": r.nodeid, "case": r.case, "model": r.model, "strategy": r.strategy,
                               "budget": r.budget, "run_index": r.run_index, "verdict": r.verdict,
                               "r_o": r.r_o, "r_tc": r.r_tc, "ssim": r.ssim, "artifacts": dict(r.artifacts)}
        if r.error is not None:
            row["error"] = {"stage": r.error.stage, "kind": r.error.kind}
        out.append(row)
    return out
