"""A forward run's record and its rows (--retrace-experiment=forward): one :class:`ForwardRecord` per episode,
typed and versioned like a recovery's Record, kept in ``forward.jsonl`` beside results.jsonl, and built here
only (:meth:`ForwardRecord.of_result`, :meth:`ForwardRecord.of_error`); :func:`forward_rows` is the summary's
``forward`` section, one row per (model, max_steps).

Infrastructure errors are counted and excluded from the rates, as for recoveries: a forward agent cannot change
its own n either (experiments/forward.py).

An ideal-recovery continuation (experiments/ideal.py) is a forward episode resumed: its record carries its
:class:`Continuation` (schema 2), and its rows are results.success's Success@K, not :func:`forward_rows`'.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_retrace.results.intervals import wilson_interval
from pytest_retrace.results.records import Failure, RecordError, Step, dedupe, read_lines, validate_versioned

if TYPE_CHECKING:
    from pytest_retrace.experiments.forward import ForwardResult
    from pytest_retrace.results.caserun import ForwardRun

SCHEMA_VERSION = 2  # 2: ``start`` (ideal recovery) and ``end_to_end`` (a version 1 record is a plain episode)
READS = (1, 2)


class Continuation(BaseModel):
    """Where an ideal-recovery continuation started (experiments.ideal.Start) and how its state was reached."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episode: str  # the saved episode, relative to the plan's trajectories directory
    forward_model: str  # the agent that ran it (its directory in OSWorld's layout)
    condition: str  # reset | E-1 | E-random | R_LLM
    step: int  # R
    error_step: int  # E
    sample: int  # which of the K continuations, from 0
    samples: int  # K
    replays: int = 0  # prefix replays it took to reach the recorded screen of step R (0: R = 0, no prefix)


class RecoveryAttempt(BaseModel):
    """One recovery of an end-to-end episode (experiments.endtoend.Attempt). ``r_o`` and ``probes`` are
    optional additions to schema 2: a record without them was written when ``reached`` was R_O alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: int  # forward actions spent when the error detector fired
    error_step: int  # E
    step: int  # R
    reached: bool | None  # the restore reached s_R: R_O and every probe matches (older records: R_O alone)
    ssim: float | None
    r_o: bool | None = None  # the screen against the one recorded after step R, alone
    probes: dict[str, bool] | None = None  # per probe getter, its value equals the one after step R; None: none
    actions: int  # the recovery agent's
    usage: dict[str, Any] = {}
    error_rationale: str = ""
    recovery_rationale: str = ""


class EndToEnd(BaseModel):
    """An end-to-end episode's recovery setting and what happened (experiments.endtoend)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str  # none | ideal | a recovery strategy
    max_recoveries: int
    recoveries: list[RecoveryAttempt] = []
    detector_calls: int = 0
    detector_usage: dict[str, Any] = {}


class ForwardRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    record: Literal["forward"] = "forward"
    # -- what ran
    nodeid: str
    task: str
    domain: str | None
    source: str  # where the task was taken from: a case's id, or an OSWorld task file
    model: str
    max_steps: int
    run_index: int = 0
    privileged: bool = False  # a scripted agent that reads the ground truth: not a model
    finished_at: str
    # -- the verdict
    verdict: Literal["solved", "unsolved", "error"]
    score: float | None = None
    evaluator_details: list[str] = []
    last_action: str | None = None  # DONE / FAIL when the agent ended the episode itself
    error: Failure | None = None
    # -- how it got there
    agent_turns: int = 0
    steps_used: int = 0  # of max_steps: executed actions, failed actions and invalid replies
    invalid_steps: int = 0
    failed_actions: int = 0
    cut_actions: int = 0
    usage: dict[str, Any] = {}
    timings: dict[str, float] = {}
    actions: list[Step] = []
    trajectory: str | None = None  # its directory in OSWorld's results layout, relative to the run directory
    start: Continuation | None = None  # an ideal-recovery continuation's start
    end_to_end: EndToEnd | None = None  # an end-to-end episode's recoveries

    @property
    def is_error(self) -> bool:
        return self.verdict == "error"

    @classmethod
    def _what(cls, run: ForwardRun, nodeid: str, privileged: bool, replays: int = 0) -> dict[str, Any]:
        start = None if run.start is None else Continuation(
            episode=run.start.name, forward_model=run.start.who, condition=run.start.condition, step=run.start.step,
            error_step=run.start.error_step, sample=run.start.sample, samples=run.start.samples, replays=replays)
        e2e = None if run.recovery is None else EndToEnd(mode=run.recovery, max_recoveries=run.max_recoveries)
        return {"nodeid": nodeid, "task": run.task.id, "domain": run.task.domain,
                "source": run.source, "model": run.model.name, "max_steps": run.max_steps,
                "run_index": run.run_index, "privileged": privileged, "start": start, "end_to_end": e2e,
                "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    @classmethod
    def of_result(cls, run: ForwardRun, result: ForwardResult, *, nodeid: str, privileged: bool = False,
                  trajectory: str | None = None) -> ForwardRecord:
        drive, ev, err = result.drive, result.evaluation, result.error
        replays = drive.attempts if run.start is not None and run.start.step else 0
        what = cls._what(run, nodeid, privileged, replays)
        if run.recovery is not None:
            what["end_to_end"] = EndToEnd(
                mode=run.recovery, max_recoveries=run.max_recoveries, detector_calls=result.detector_calls,
                detector_usage=result.detector_usage.to_dict(),
                recoveries=[RecoveryAttempt(
                    at=a.at, error_step=a.error_step, step=a.step, reached=a.reached, ssim=a.ssim, r_o=a.r_o,
                    probes=a.probes, actions=a.actions,
                    usage=a.usage.to_dict(), error_rationale=a.decisions["error"]["rationale"],
                    recovery_rationale=a.decisions["recovery"]["rationale"]) for a in result.recoveries])
        return cls(
            **what, verdict=result.verdict,  # type: ignore[arg-type]
            score=None if err or ev is None else ev.score, evaluator_details=list(ev.details) if ev else [],
            last_action=result.last_action,
            error=Failure(stage=err.stage, kind=err.kind, message=err.message) if err else None,
            agent_turns=drive.agent_turns, steps_used=drive.actions_used, invalid_steps=drive.invalid_steps,
            failed_actions=drive.failed_actions, cut_actions=drive.cut_actions, usage=drive.usage.to_dict(),
            timings=dict(drive.timings),
            actions=[Step(stage="forward", **s.action, settle=s.settle, settled=s.settled,
                          rationale=s.rationale or None, error=s.error) for s in drive.steps],
            trajectory=trajectory)

    @classmethod
    def of_error(cls, run: ForwardRun, failure: Failure, *, nodeid: str) -> ForwardRecord:
        return cls(**cls._what(run, nodeid, False), verdict="error", error=failure)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, line: str) -> ForwardRecord:
        import json

        try:
            data = json.loads(line)
        except ValueError as exc:
            raise RecordError(f"not JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> ForwardRecord:
        return validate_versioned(cls, data, what="forward record", reads=READS, error=RecordError)


def read_forward(path: Path) -> list[ForwardRecord]:
    """The records of a forward.jsonl (records.read_lines)."""
    return read_lines(path, ForwardRecord.from_json)


class ForwardRow(BaseModel):
    """summary.json's ``forward``: one (model, max_steps), over its episodes that have a verdict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    max_steps: int
    n: int  # episodes with a verdict
    solved: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    errors: int  # infrastructure errors, excluded from n
    tasks: int
    mean_steps: float | None  # of the solved episodes
    runs: int
    rate_sd: float | None = None  # across runs, with --retrace-runs K > 1
    error_kinds: dict[str, int] = Field(default_factory=dict)


def forward_rows(records: Iterable[ForwardRecord]) -> list[ForwardRow]:
    """One row per (model, max_steps), in the order models first appear. A rerun of an episode that already
    has a verdict is ignored, as for recoveries (records.dedupe). Continuations are not episodes of the task
    from its start: results.success summarises them."""
    kept, _ = dedupe(r for r in records if r.start is None and r.end_to_end is None)
    groups: dict[tuple[str, int], list[ForwardRecord]] = defaultdict(list)
    for r in kept:
        groups[(r.model, r.max_steps)].append(r)
    rows = []
    for (model, max_steps), group in groups.items():
        counted = [r for r in group if not r.is_error]
        solved = [r for r in counted if r.verdict == "solved"]
        low, high = wilson_interval(len(solved), len(counted)) if counted else (None, None)
        by_run: dict[int, list[bool]] = defaultdict(list)
        for r in counted:
            by_run[r.run_index].append(r.verdict == "solved")
        rates = [sum(v) / len(v) for v in by_run.values()]
        rows.append(ForwardRow(
            model=model, max_steps=max_steps, n=len(counted), solved=len(solved),
            rate=round(len(solved) / len(counted), 6) if counted else None,
            ci_low=None if low is None else round(low, 6), ci_high=None if high is None else round(high, 6),
            errors=len(group) - len(counted), tasks=len({r.task for r in group}),
            mean_steps=round(statistics.mean(r.steps_used for r in solved), 3) if solved else None,
            runs=len(by_run), rate_sd=round(statistics.stdev(rates), 6) if len(rates) > 1 else None,
            error_kinds=error_kinds(group)))
    return rows


def error_kinds(records: Iterable[ForwardRecord]) -> dict[str, int]:
    """How many of ``records`` are infrastructure errors, per ``stage/kind``, sorted: every row's error_kinds."""
    kinds: dict[str, int] = defaultdict(int)
    for r in records:
        if r.error is not None:
            kinds[f"{r.error.stage}/{r.error.kind}"] += 1
    return dict(sorted(kinds.items()))
