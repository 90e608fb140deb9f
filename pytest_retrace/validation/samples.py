"""What a person or an LLM judge is shown of one finished recovery test (paper B.3): a :class:`Sample`, built here
only (:func:`load_samples`) from a run's records and the case files they ran.

A sample is one finished record (infrastructure errors say nothing about recovery and are never sampled). It
holds what the paper's evaluator saw: the instruction, the observation–action history up to the error (the
prefix and the perturbation), the recovery actions with the agent's words, and the target, error and recovered
screenshots; and, kept apart so a blind reader never needs them, the oracle's verdict and its two halves.

A sample's ``id`` is stable across machines and reruns of the same command: the run directory's name and the
test's id, hashed. Judges, annotations and sample plans refer to samples by it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_retrace.replay.cases import CaseError, load_case
from pytest_retrace.results import rundir
from pytest_retrace.results.provenance import case_files
from pytest_retrace.results.records import Record, Step, dedupe
from pytest_retrace.results.session import read_records


class SampleError(ValueError):
    """A run whose samples cannot be built; the message names the file."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Oracle(_Frozen):
    """ReTrace's verdict on the sample and its two halves (R = R_O ∧ R_TC), with the SSIM R_O compared."""

    recovered: bool
    r_o: bool | None
    r_tc: bool | None
    ssim: float | None
    ssim_threshold: float | None


class Sample(_Frozen):
    id: str  # sample_id(run, nodeid)
    run: str  # the run directory's name
    nodeid: str
    case: str
    task: str | None
    domain: str | None
    kind: str | None
    model: str
    strategy: str
    budget: int
    run_index: int
    instruction: str
    history: list[Step]  # up to the error: the prefix's and the perturbation's actions
    recovery: list[Step]  # the agent's actions, with its words (``rationale``)
    target: Path  # the screenshots, absolute
    error: Path
    recovered: Path | None  # None where the run kept no image of the recovered screen
    oracle: Oracle

    def shown(self) -> dict[str, Any]:
        """What a blind reader is given: everything but the oracle's verdict (the annotation page, the judge)."""
        return self.model_dump(mode="json", exclude={"oracle"})


def sample_id(run: str, nodeid: str) -> str:
    return hashlib.sha256(f"{run}\0{nodeid}".encode()).hexdigest()[:12]


def _case_root(run_dir: Path) -> Path:
    """Where the run's test ids are relative to: the directory pytest ran in (summary.json's ``run.cwd``), else
    the current one."""
    summary = rundir.summary_json(run_dir)
    if summary.is_file():
        try:
            cwd = json.loads(summary.read_text(encoding="utf-8")).get("run", {}).get("cwd")
        except (OSError, ValueError):
            cwd = None
        if cwd and Path(cwd).is_dir():
            return Path(cwd)
    return Path.cwd()


def load_samples(run: Path, *, case_root: Path | None = None) -> list[Sample]:
    """Every finished test of a run (a run directory or its results.jsonl) as a sample, in the order they
    finished. ``case_root``: where the test ids' case files are (default: where the run was made)."""
    run_dir = run.parent if run.name == rundir.RESULTS else run
    path = rundir.results_file(run_dir)
    if not path.is_file():
        raise SampleError(f"{path}: no such file (a run directory or its {rundir.RESULTS})")
    records = [r for r in dedupe(read_records(path))[0] if not r.is_error and r.case is not None]
    files = case_files(records, case_root or _case_root(run_dir))
    cases: dict[str, Any] = {}
    out = []
    for r in records:
        if r.case not in cases:
            try:
                cases[r.case] = load_case(files[r.case])
            except (CaseError, OSError) as exc:
                raise SampleError(f"{path}: the case of {r.nodeid} does not load: {exc}") from None
        out.append(_sample(run_dir, r, cases[r.case]))
    return out


def _sample(run_dir: Path, r: Record, case: Any) -> Sample:
    recovered = r.artifacts.get("recovered")
    return Sample(
        id=sample_id(run_dir.name, r.nodeid), run=run_dir.name, nodeid=r.nodeid, case=r.case or "", task=r.task,
        domain=r.domain, kind=r.kind, model=r.model, strategy=r.strategy, budget=r.budget, run_index=r.run_index,
        instruction=case.task.instruction,
        history=_history(r),
        recovery=[s for s in r.actions if s.stage == "recover"],
        target=case.target_png.resolve(), error=case.error_png.resolve(),
        recovered=(run_dir / recovered).resolve() if recovered else None,
        oracle=Oracle(recovered=r.verdict == "recovered", r_o=r.r_o, r_tc=r.r_tc, ssim=r.ssim,
                      ssim_threshold=r.ssim_threshold),
    )


def _history(r: Record) -> list[Step]:
    """The prefix's and the perturbation's actions, up to the last of the perturbation: the oracle's restore
    replays the prefix during its recovery, recorded as prefix steps too, and those come after the error."""
    perturb = [i for i, s in enumerate(r.actions) if s.stage == "perturb"]
    upto = r.actions[: perturb[-1] + 1] if perturb else r.actions
    return [s for s in upto if s.stage in ("prefix", "perturb")]
