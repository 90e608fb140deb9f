"""The CI gate: with any gate option set, a run's exit status says whether the agent may be released, not
whether single recoveries failed (every benchmark run has failed recoveries; that is what it measures).

Checked on the summary only, so ``retrace summary`` of the same records would decide the same way:
- ``fail_under``: every model × strategy × budget group must recover at least this share of its cases;
- ``max_errors``: at most this many infrastructure errors in the run — past it, the rates rest on too few cases;
- ``baseline``: no model × strategy × budget may regress against a saved run: a drop of more than
  ``max_drop`` points on the cases both runs share that McNemar's exact test supports (p < 0.05, baseline.py);
  a drop within noise passes. A baseline that shares no test with the run compared nothing, and fails (a
  renamed model would otherwise pass unseen). Every group's comparison is printed, pass or fail, with notes on
  baseline cases missing from the run and on groups too small for the test to ever reach p < 0.05, which
  ``strict`` turns into failures: in strict mode every group of the run must be one the test could fail;
- a case file that could not be loaded fails the gate: a release must not pass on a suite that silently shrank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_retrace.results import baseline as _baseline
from pytest_retrace.results.summary import GateVerdict, Summary

if TYPE_CHECKING:
    from pytest_retrace.results.records import Record


@dataclass(frozen=True)
class CaseFileError:
    """A case file that could not be loaded: its path as pytest names it, and why (the error's first line)."""

    file: str
    error: str

    def __str__(self) -> str:
        return f"{self.file}: {self.error}"


def describe_case_file_errors(errors: Sequence[CaseFileError]) -> str:
    return f"{len(errors)} case file(s) could not be loaded: " + "; ".join(map(str, errors))


@dataclass(frozen=True)
class GateResult:
    problems: list[str]  # why the gate fails; empty when it passes
    notes: list[str]  # what a reader of a passing gate must know too
    comparisons: list[_baseline.Comparison]

    @property
    def passed(self) -> bool:
        return not self.problems

    def verdict(self, gate: Gate) -> GateVerdict:
        """What summary.json says of it: the verdict, why, and with a baseline every group's comparison."""
        baseline = None if gate.baseline is None else {"path": str(gate.baseline),
                                                      **_baseline.summary_block(self.comparisons, gate.max_drop)}
        return GateVerdict(passed=self.passed, problems=self.problems, notes=self.notes, strict=gate.strict,
                           baseline=baseline)


@dataclass(frozen=True)
class Gate:
    fail_under: float | None = None  # a rate in [0, 1]
    max_errors: int | None = None
    baseline: Path | None = None
    max_drop: float = 0.0  # points
    strict: bool = False  # fail on groups the regression test could not fail (too few shared cases)

    @property
    def active(self) -> bool:
        return self.fail_under is not None or self.max_errors is not None or self.baseline is not None

    def compare(self, records: list[Record]) -> list[_baseline.Comparison]:
        assert self.baseline is not None
        return _baseline.compare(_baseline.load(self.baseline), _baseline.verdicts(records),
                                 _baseline.errored(records))

    def evaluate(self, summary: Summary, records: list[Record],
                 case_file_errors: Sequence[CaseFileError] = ()) -> GateResult:
        problems: list[str] = []
        comparisons: list[_baseline.Comparison] = []
        notes: list[str] = []
        if self.baseline is not None:
            try:
                comparisons = self.compare(records)
            except ValueError as exc:  # the baseline file is broken: the gate cannot pass on it
                problems.append(str(exc))
            else:
                problems += self._baseline_problems(comparisons)
                notes += self._baseline_notes(comparisons)
        problems += self.problems(summary, case_file_errors)
        return GateResult(problems, notes, comparisons)

    def _baseline_problems(self, comparisons: Sequence[_baseline.Comparison]) -> list[str]:
        if not any(c.shared for c in comparisons):
            ours = ", ".join(f"{c.name} ({c.baseline_n} verdict(s))" for c in comparisons if c.baseline_n)
            theirs = ", ".join(f"{c.name} ({c.run_n} verdict(s))" for c in comparisons if c.run_n)
            return [f"nothing compared: baseline {self.baseline} shares no test with this run (a renamed "
                    f"model, strategy or budget, or other cases?); baseline groups: {ours or 'none'}; "
                    f"run groups: {theirs or 'none'}"]
        out = [f"regression: {c.describe()}" for c in comparisons if c.regressed(self.max_drop)]
        if self.strict:  # every group of the run must be one the test could have failed
            out += [f"underpowered (--retrace-gate-strict): {c.name}: "
                    + (c.describe_power() if c.baseline_n else "not in the baseline, nothing compared")
                    for c in comparisons if c.run_n and c.underpowered]
        return out

    def _baseline_notes(self, comparisons: Sequence[_baseline.Comparison]) -> list[str]:
        out: list[str] = []
        if not any(c.shared for c in comparisons):
            return out  # the problem names both sides' groups already
        for c in comparisons:
            if not c.run_n:
                out.append(f"{c.name}: in the baseline ({c.baseline_n} verdict(s)), not in this run")
                continue
            if not c.baseline_n:
                if not self.strict:  # strict: a problem
                    out.append(f"{c.name}: not in the baseline, nothing compared ({c.run_n} verdict(s))")
                continue
            if c.missing:
                out.append(f"{c.name}: {c.describe_missing()}")
            if c.underpowered and not self.strict:
                out.append(f"{c.name}: {c.describe_power()}; --retrace-gate-strict fails the gate on this")
        return out

    def problems(self, summary: Summary, case_file_errors: Sequence[CaseFileError] = ()) -> list[str]:
        """Why the run fails the gate's checks on the summary and the collection; empty when it passes."""
        out = []
        if case_file_errors:
            out.append(describe_case_file_errors(case_file_errors))
        if self.max_errors is not None and summary.n_errors > self.max_errors:
            out.append(f"{summary.n_errors} infrastructure error(s) > --retrace-max-errors {self.max_errors} "
                       f"({', '.join(f'{k}: {v}' for k, v in summary.error_kinds.items())})")
        if self.fail_under is not None:
            for g in summary.groups:
                if g.rate is None or g.rate < self.fail_under:
                    rate = "no finished case" if g.rate is None else f"{100 * g.rate:.1f}%"
                    out.append(f"{g.model} {g.strategy} r={g.budget}: recovery rate {rate} "
                               f"< --retrace-fail-under {100 * self.fail_under:.1f}% (n={g.n})")
        return out


def format_gate(result: GateResult, gate: Gate) -> list[str]:
    """The gate's verdict for the terminal: why it fails, every group's comparison (pass or fail: a passing
    gate shows what it compared), then the notes."""
    out = [f"  {problem}" for problem in result.problems]
    if any(c.shared for c in result.comparisons):
        strict = ", strict" if gate.strict else ""
        out.append(f"  against baseline {gate.baseline} (McNemar exact, alpha {_baseline.ALPHA}, "
                   f"max drop {gate.max_drop:g} points{strict}):")
        for c in result.comparisons:
            if c.shared:
                flag = "  REGRESSED" if c.regressed(gate.max_drop) else "  (underpowered)" * c.underpowered
                out.append(f"    {c.describe()}{flag}")
    out += [f"  note: {note}" for note in result.notes]
    return out
