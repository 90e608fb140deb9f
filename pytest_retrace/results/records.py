"""The result record: one per test, typed and versioned, and the only thing reports are computed from.

A record is built here and nowhere else (:meth:`Record.of_result` after a replay, :meth:`Record.of_error`
when a test broke before one). Every consumer — results.jsonl, summary.json, ``retrace summary``, Allure, a
third party's writer through the ``pytest_retrace_record`` hook — reads the same fields, so a number in any
report can be traced to the lines of results.jsonl it came from.

``schema_version`` changes when a field changes meaning or disappears; adding an optional field does not
change it. Readers refuse versions they do not know instead of guessing.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from pytest_retrace.replay.result import RecoveryResult
    from pytest_retrace.results.caserun import CaseRun

SCHEMA_VERSION = 1
Verdict = Literal["recovered", "not_recovered", "error"]
# RecoveryResult fields a record holds in another form (or takes from the CaseRun: budget); every other field
# the two share by name is copied as it is (Record.of_result)
_CONVERTED = frozenset({"budget", "probes", "usage", "context_usage", "error"})


class RecordError(ValueError):
    """A results.jsonl line that is not a record this version can read."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Failure(_Model):
    """Why a test is an infrastructure error (excluded from rates)."""

    stage: str  # reset, prefix, verify, perturb, agent, recover, suffix, evaluate, setup
    kind: str  # env, desync, transport, api, config, agent-bug, ...
    message: str


class Step(BaseModel):
    """One action as executed (or refused): the action's own fields (``action`` is its kind) plus these."""

    model_config = ConfigDict(extra="allow", frozen=True)

    stage: str  # prefix, perturb, recover, suffix
    action: str
    settle: float = 0.0  # seconds until the screen was stable
    settled: bool = True  # False: the screen still changed when the settle cap ran out
    rationale: str | None = None  # the model's words for this turn
    error: str | None = None  # why it failed: an invalid reply, an action the desktop refused


class ProbeCheck(_Model):
    """One of the case's error-state probes: it differed from its target value after the perturbation (else
    the test is an infrastructure error), and whether it equals it again after the recovery."""

    probe: str  # what it reads: "file ~/notes.txt", "command 'pwd'"
    restored: bool | None = None  # None: the recovery never finished


class Record(_Model):
    schema_version: int = SCHEMA_VERSION
    # -- what ran
    nodeid: str
    case: str | None
    task: str | None
    domain: str | None
    horizon: str | None
    kind: str | None  # the case's measured kind: visible, subtle, hidden-state, visual-only
    model: str
    strategy: str
    budget: int
    run_index: int = 0  # of --retrace-runs K: 0..K-1
    privileged: bool = False  # a scripted baseline that reads the case (oracle, undo): not a model
    finished_at: str
    # -- the verdict: R = R_O and R_TC; None where the stage never ran
    verdict: Verdict
    recovered: bool | None = None
    r_o: bool | None = None
    r_tc: bool | None = None
    ssim: float | None = None
    ssim_threshold: float | None = None
    evaluator_score: float | None = None
    evaluator_details: list[str] = []
    screen_diff: str | None = None
    probes: list[ProbeCheck] = []
    # what confirmed s_error on every replay: screen (its pixels), probes (and its pixels), or determinism (a
    # hidden-state case nothing can observe, declared `verified_by: determinism`: its recording only)
    error_state_verified_by: Literal["screen", "probes", "determinism"] | None = None
    error: Failure | None = None
    # -- how it got there
    attempts: int = 0  # tries the longest reconstruction of the target / error state took
    # state -> "pixels" | "verifier: ..."; with --retrace-restore=checkpoint also "restore" (s_error) and
    # "restore_target" (the oracle's ideal recovery) -> "checkpoint" | "replay (<why>)" (docs/checkpoints.md)
    reconstruction: dict[str, str] = {}
    agent_turns: int = 0
    actions_used: int = 0  # of the budget
    invalid_steps: int = 0
    failed_actions: int = 0
    cut_actions: int = 0
    usage: dict[str, Any] = {}  # the agent's model calls, tokens, cost
    context_usage: dict[str, Any] = {}  # the contextualizer's and verifier's
    timings: dict[str, float] = {}  # seconds per stage
    cpu: dict[str, float] = {}  # the harness's own CPU-seconds per stage (this worker; not the desktop's processes)
    actions: list[Step] = []
    artifacts: dict[str, str] = Field(default_factory=dict)  # name -> path, relative to the run directory

    @property
    def is_error(self) -> bool:
        return self.verdict == "error"

    # -- built here only -------------------------------------------------------------------------
    @classmethod
    def _what(cls, nodeid: str, run: CaseRun, privileged: bool) -> dict[str, Any]:
        case = run.case
        return {
            "nodeid": nodeid, "case": case.id, "task": case.task.id, "domain": case.task.domain,
            "horizon": case.horizon, "kind": case.metadata.get("kind"), "model": run.model.name,
            "strategy": run.strategy, "budget": run.budget, "run_index": run.run_index, "privileged": privileged,
            "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    @classmethod
    def of_result(cls, run: CaseRun, result: RecoveryResult, *, nodeid: str, privileged: bool = False,
                  artifacts: dict[str, str] | None = None) -> Record:
        """The record of a replay: what ran (``run``) and what it measured (``result``). The result's fields
        that a record keeps as they are (same name) are copied by name; the others are converted here."""
        ev, err = result.evaluation, result.error
        same = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
                if f.name in cls.model_fields and f.name not in _CONVERTED}
        return cls(
            **cls._what(nodeid, run, privileged), **same,
            verdict=result.verdict,  # type: ignore[arg-type]
            recovered=None if err else result.recovered,
            evaluator_score=ev.score if ev else None, evaluator_details=list(ev.details) if ev else [],
            screen_diff=result.diff.describe() if result.diff else result.unobserved,
            probes=[ProbeCheck(probe=p, restored=r) for p, r in result.probes.items()],
            error_state_verified_by=run.case.error_state_verified_by,  # type: ignore[arg-type]
            error=Failure(stage=err.stage, kind=err.kind, message=err.message) if err else None,
            usage=result.usage.to_dict(), context_usage=result.context_usage.to_dict(),
            actions=[Step(stage=s.stage, **s.action, settle=s.settle, settled=s.settled, rationale=s.rationale or None,
                          error=s.error)
                     for s in result.steps],
            artifacts=artifacts or {},
        )

    @classmethod
    def of_error(cls, run: CaseRun, failure: Failure, *, nodeid: str, privileged: bool = False) -> Record:
        """A test that broke before its replay produced a result (the desktop did not start, its worker died)."""
        return cls(**cls._what(nodeid, run, privileged), verdict="error", error=failure)

    # -- on disk: one JSON object per line -------------------------------------------------------
    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=False)

    @classmethod
    def from_json(cls, line: str) -> Record:
        return cls.from_dict(_loads(line))

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        return validate_versioned(cls, data, what="record", reads=(SCHEMA_VERSION,), error=RecordError)


def _loads(line: str) -> Any:
    import json

    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise RecordError(f"not JSON: {exc}") from None


class _Verdict(Protocol):
    nodeid: str

    @property
    def is_error(self) -> bool: ...


V = TypeVar("V", bound=_Verdict)


def dedupe(records: Iterable[V]) -> tuple[list[V], int]:
    """One record per nodeid, and how many later records were ignored.

    The first finished verdict (recovered / not recovered) of a test is final: a rerun under the same run
    (``--lf``, a repeated command) never replaces it, or rerunning failures would turn a run into best-of-k.
    An infrastructure error is replaced by any later record of its test: it measured nothing.
    """
    by_id: dict[str, V] = {}
    ignored = 0
    for record in records:
        old = by_id.get(record.nodeid)
        if old is not None and not old.is_error:
            ignored += 1
            continue
        by_id.pop(record.nodeid, None)  # re-insert so dict order follows the winning record
        by_id[record.nodeid] = record
    return list(by_id.values()), ignored


M = TypeVar("M", bound=BaseModel)
M2 = TypeVar("M2")


def validate_versioned(model: type[M], data: Any, *, what: str, reads: tuple[int, ...],
                       error: type[ValueError]) -> M:
    """``data`` (parsed JSON) as ``model``, for the run directory's versioned files (results.jsonl's records,
    summary.json): a non-object, a ``schema_version`` this version cannot read, or a field that does not
    validate is ``error`` naming the first field that failed."""
    if not isinstance(data, dict):
        raise error(f"a {what} must be a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version not in reads:
        raise error(f"{what} schema_version {version!r}: this version of pytest-retrace reads "
                    f"{', '.join(map(str, reads))} only")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise error(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def read_lines(path: Path, parse: Callable[[str], M2]) -> list[M2]:
    """The records of a JSON-lines file (results.jsonl, forward.jsonl). A torn last line (a run killed mid-write)
    is skipped; any other line that is not a record of this version is an error naming the file and the line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(parse(line))
        except RecordError as exc:
            if number == len(lines) and not line.endswith("}"):
                continue  # the write a kill interrupted
            raise RecordError(f"{path}:{number}: {exc}") from None
    return out
