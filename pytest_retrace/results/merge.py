"""Merging several runs into one report (``retrace report``): reading each run, the pooled summary with every
row's per-run rates, and the warnings a reader needs (a run given twice, different case sets, changed cases,
two case files behind one test id).

A run is one results.jsonl. Runs are merged without letting one run's tests stand in for another's: a test's
first finished verdict is final *within* its run (records.dedupe), while the same test in another run is a
new measurement. So every record is re-labelled with its run before the pooled summary is computed, and each
run — or each run index of a run made with ``--retrace-runs K`` — is one of the runs whose rates the report
averages: mean ± sample sd (n - 1) of the per-run rates, as the paper reports three-run results. The paired
comparisons of models and of runs are in :mod:`.compare`; rendering is :mod:`.report`'s.

The report warns when runs cover different case sets, and when a case's files changed between runs (the
digests in their summary.json differ): rates across such runs measure different things.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as _field
from pathlib import Path
from typing import Any

from pytest_retrace.results import rundir
from pytest_retrace.results.compare import PairedDiff, RunDiff, comparisons, run_comparisons
from pytest_retrace.results.records import Record, RecordError, dedupe
from pytest_retrace.results.session import read_records
from pytest_retrace.results.sets import EvaluationSet, SetRow, evaluation_sets
from pytest_retrace.results.stats import BREAKDOWNS, Row, Statistics, summarize


class ReportError(ValueError):
    """A run that cannot be read; the message starts with the file."""


@dataclass(frozen=True)
class MergedRun:
    """One of the runs a report merges."""

    label: str
    path: Path  # its results.jsonl
    summary: Statistics  # of this run alone
    digests: dict[str, str | None]  # case id -> digest of its files, from the run's summary.json (if any)
    provenance: dict[str, Any] = _field(default_factory=dict)  # that summary.json's "run" (provenance.py)


@dataclass(frozen=True)
class MergedReport:
    runs: list[MergedRun]
    units: list[str]  # the runs averaged over: a results.jsonl, or a run index of one (label:runK)
    summary: Statistics  # of all runs' records kept apart; each row has its per_run rates
    comparisons: list[PairedDiff]
    warnings: list[str]
    run_comparisons: list[RunDiff] = _field(default_factory=list)
    # the runs' evaluation sets when they cover more than one, and each cell's rate per set (results.sets)
    sets: list[EvaluationSet] = _field(default_factory=list)
    set_rows: list[SetRow] = _field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """As JSON (``retrace report --json``)."""
        return {"runs": [{"label": r.label, "path": str(r.path), "summary": r.summary.to_dict()} for r in self.runs],
                "units": self.units, "merged": self.summary.to_dict(),
                "comparisons": [c.to_dict() for c in self.comparisons],
                "run_comparisons": [c.to_dict() for c in self.run_comparisons], "warnings": self.warnings,
                "sets": [s.model_dump(mode="json") for s in self.sets],
                "set_rows": [r.model_dump(mode="json") for r in self.set_rows]}


def find_run(run: str | Path, report_dir: Path | None = None) -> Path:
    """RUN as given (a run directory or a results.jsonl), else the run of that name under ``report_dir``.
    Raises :class:`ReportError` saying every place it looked, and which runs ``report_dir`` holds."""
    given = Path(run)
    tried = [given]
    if report_dir is not None and not given.is_absolute():
        tried.append(report_dir / given)
    for path in tried:
        if path.exists():
            return path
    looked = " and ".join(str(p) for p in tried)
    hint = ""
    if report_dir is not None:
        runs = rundir.runs_in(report_dir)
        names = [f.parent.name for f in runs[:8]]
        hint = (f"; {report_dir} holds no run" if not runs else
                f"; runs in {report_dir}: {', '.join(names)}{', ...' if len(runs) > 8 else ''}")
        if not report_dir.is_dir():
            hint = f"; {report_dir} does not exist (--report-dir)"
    raise ReportError(f"{run}: no such run: looked for {looked}{hint}")


def merge_runs(run_dirs: Sequence[str | Path], report_dir: Path | None = None) -> MergedReport:
    """Read each run's results.jsonl, summarise each alone and all together (module docstring). A RUN that is
    not a path is looked up under ``report_dir``. Raises :class:`ReportError` naming the file for a missing or
    unreadable results.jsonl, and the places it looked for a run it did not find."""
    paths: list[Path] = []
    warnings: list[str] = []
    for run in run_dirs:
        path = rundir.results_of(find_run(run, report_dir))
        if any(path.resolve() == p.resolve() for p in paths):
            warnings.append(f"{path} was given twice; it is counted once")
            continue
        paths.append(path)
    names = [rundir.run_label(p) for p in paths]
    labels = [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths)]
    runs: list[MergedRun] = []
    per_run: list[list[Record]] = []
    for label, path in zip(labels, paths):
        records = _read(path)
        if not records:
            warnings.append(f"{label}: {path} holds no records")
        warnings += _collisions(label, records)
        meta = _run_meta(path)
        runs.append(MergedRun(label, path, summarize(records), _digests(meta), meta))
        per_run.append(records)
    warnings += _case_sets(runs, per_run) + _changed_cases(runs)
    units: list[str] = []
    pooled: list[Record] = []
    for i, (label, records) in enumerate(zip(labels, per_run)):
        indices = sorted({r.run_index for r in records})
        unit_of = {}
        for index in indices:
            unit_of[index] = len(units)
            units.append(label if len(indices) == 1 else f"{label}:run{index}")
        # a test of this run is not the same test as in another run: only the run's own reruns dedupe
        pooled += [r.model_copy(update={"nodeid": f"{i}|{r.nodeid}", "run_index": unit_of[r.run_index]})
                   for r in records]
    summary = _with_per_run(summarize(pooled), pooled, len(units))
    sets, set_rows = evaluation_sets(labels, per_run)
    return MergedReport(runs, units, summary, comparisons(per_run), warnings,
                        run_comparisons(per_run, [r.label for r in runs]), sets, set_rows)


def _run_meta(results: Path) -> dict[str, Any]:
    """The ``run`` of the summary.json beside a results.jsonl; empty for a run without one (a bare results
    file, an interrupted run)."""
    try:
        meta = json.loads(rundir.summary_json(results.parent).read_text(encoding="utf-8"))["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _digests(meta: dict[str, Any]) -> dict[str, str | None]:
    """Case digests of a run's provenance (provenance.case_digests); none from a version that did not record
    them."""
    try:
        return {case: entry.get("digest") for case, entry in meta.get("cases", {}).items()}
    except AttributeError:
        return {}


def _examples(cases: set[str], limit: int = 5) -> str:
    names = sorted(cases)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _case_sets(runs: list[MergedRun], per_run: list[list[Record]]) -> list[str]:
    """A warning for every run that lacks some of the cases the runs cover together: their rates are over
    different cases, and the mean across runs mixes them."""
    sets = [{r.case for r in records if r.case is not None} for records in per_run]
    if len(sets) < 2 or all(s == sets[0] for s in sets):
        return []
    union = set().union(*sets)
    return [f"runs cover different case sets: {run.label} lacks {len(union - cases)} of the {len(union)} cases "
            f"the runs cover ({_examples(union - cases)}); rates across these runs are over different cases"
            for run, cases in zip(runs, sets) if union - cases]


def _changed_cases(runs: list[MergedRun]) -> list[str]:
    """A warning per pair of runs whose shared case ids have different file digests."""
    out = []
    for a, b in itertools.combinations(runs, 2):
        changed = {c for c, d in a.digests.items() if d and b.digests.get(c) and b.digests[c] != d}
        if changed:
            out.append(f"{len(changed)} case(s) changed between runs {a.label} and {b.label} (their files' "
                       f"digests differ: {_examples(changed)}): the same case id is not the same case")
    return out


def _read(path: Path) -> list[Record]:
    try:
        return read_records(path)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (not a run directory?)") from None
    except OSError as exc:
        raise ReportError(f"{path}: {exc.strerror or exc}") from None
    except RecordError as exc:  # names the file and the line already
        raise ReportError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not a text file ({exc.reason})") from None


_IDENTITY = ("case", "task", "domain", "kind", "horizon")


def _collisions(label: str, records: list[Record]) -> list[str]:
    """Two case files behind one test id, or one case id under two test ids, within a run. The summary would
    fold the first into one test (the first finished verdict wins) and the comparison keys trials by case id,
    so either would merge two different measurements without a word."""
    out = []
    first: dict[str, Record] = {}
    ids: dict[tuple[Any, ...], list[str]] = {}
    warned: set[tuple[Any, ...]] = set()
    for r in records:
        seen = first.setdefault(r.nodeid, r)
        differ = [f"{f} {getattr(seen, f)!r} vs {getattr(r, f)!r}" for f in _IDENTITY
                  if getattr(seen, f) != getattr(r, f)]
        if differ and (r.nodeid, *(getattr(r, f) for f in _IDENTITY)) not in warned:
            warned.add((r.nodeid, *(getattr(r, f) for f in _IDENTITY)))
            out.append(f"{label}: test id {r.nodeid} belongs to two different case files ({'; '.join(differ)}); "
                       f"only its first finished verdict is counted")
        if r.case is not None:
            names = ids.setdefault((r.case, r.model, r.strategy, r.budget, r.run_index), [])
            if r.nodeid not in names:
                names.append(r.nodeid)
    for (case, model, strategy, budget, _), names in ids.items():
        if len(names) > 1:
            out.append(f"{label}: case id {case} ({model} {strategy} r={budget}) ran as {len(names)} tests "
                       f"({', '.join(names)}): two case files with the same id? Comparisons use the first")
    return out


def _with_per_run(summary: Statistics, pooled: list[Record], units: int) -> Statistics:
    """The summary whose every row has its rate in each run (None where the run has no finished test of it),
    in ``units`` order."""
    unique, _ = dedupe(pooled)
    counts: dict[tuple[Any, ...], list[int]] = {}
    for r in unique:
        if r.is_error:
            continue
        base = (r.model, r.strategy, r.budget)
        for key in (base, *((field, *base, getattr(r, field) or "") for field in BREAKDOWNS)):
            cell = counts.setdefault((*key, r.run_index), [0, 0])
            cell[0] += r.verdict == "recovered"
            cell[1] += 1

    def with_rates(g: Row, key: tuple[Any, ...]) -> Row:
        cells = [counts.get((*key, u)) for u in range(units)]
        return g.model_copy(update={"per_run": [None if c is None else round(c[0] / c[1], 6) for c in cells]})

    return summary.model_copy(update={
        "groups": [with_rates(g, (g.model, g.strategy, g.budget)) for g in summary.groups],
        **{key: [with_rates(g, (field, g.model, g.strategy, g.budget, g.category(field))) for g in summary.rows(field)]
           for field, key in BREAKDOWNS.items()},
    })
