"""Paired comparisons on matched trials: two models under one strategy and budget, and one model × strategy ×
budget in two runs (before / after).

Models are compared in pairs that share a strategy and a budget, on matched trials where both finished (no
infrastructure error on either side). A trial is a case in a run at a run index, matched with the same trial
of the other model when the two models ran in the same run(s) ("same run"), or else, when they were run in
separate run directories, with the trial of the i-th run holding the other model, in the order the runs were
given ("run order"). The rate difference is over the matched trials. Significance is McNemar's exact test
(baseline.mcnemar_p) on *cases*: b counts the cases A recovered more often than B over their matched trials,
c the reverse, ties are dropped. With one run that is exactly McNemar's test on the discordant pairs; with
several runs it is the sign test on per-case differences, because the runs of one case are not independent
(a deterministic agent repeats itself) and counting each as a pair would overstate the evidence.

The same model × strategy × budget in two run directories is a before / after comparison (a changed prompt,
a new model version under the same config): the runs are paired the same way, on the cases and run indices
both finished, with the same per-case McNemar test.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from pytest_retrace.results.baseline import mcnemar_p
from pytest_retrace.results.records import Record, dedupe

Trials = dict[tuple[int, int, str | None], bool]  # (run, run index, case) -> recovered


@dataclass(frozen=True)
class PairedDiff:
    """Model A against model B under one strategy and budget, on their matched finished trials."""

    strategy: str
    budget: int
    model_a: str
    model_b: str
    pairing: str  # "same run" or "run order" (module docstring)
    pairs: int  # matched trials, both finished
    cases: int  # distinct cases among them
    rate_a: float | None
    rate_b: float | None
    b: int  # cases A recovered more often than B (one run: A recovered, B did not)
    c: int  # cases B recovered more often than A
    p_value: float  # McNemar's exact test on b and c

    @property
    def diff_points(self) -> float | None:
        return _points(self.rate_a, self.rate_b)

    def to_dict(self) -> dict[str, Any]:
        return _rounded({**asdict(self), "diff_points": self.diff_points})


@dataclass(frozen=True)
class RunDiff:
    """One model × strategy × budget in two runs, before (the run given first) and after, on their matched
    finished trials (same case, same run index)."""

    model: str
    strategy: str
    budget: int
    before: str  # run labels
    after: str
    pairs: int
    cases: int
    rate_before: float | None
    rate_after: float | None
    worse: int  # cases the before run recovered more often
    better: int  # cases the after run recovered more often
    p_value: float  # McNemar's exact test on worse and better

    @property
    def change_points(self) -> float | None:
        return _points(self.rate_after, self.rate_before)

    def to_dict(self) -> dict[str, Any]:
        return _rounded({**asdict(self), "change_points": self.change_points})


def _points(rate: float | None, than: float | None) -> float | None:
    """How many percentage points `rate` is above `than` (None if either is)."""
    return None if rate is None or than is None else 100 * (rate - than)


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}


def comparisons(per_run: list[list[Record]]) -> list[PairedDiff]:
    """Every two models that share a strategy and budget, paired on their matched trials (module docstring)."""
    cells: dict[tuple[str, int], dict[str, Trials]] = {}
    for run, records in enumerate(per_run):
        unique, _ = dedupe(records)
        for r in unique:
            if not r.is_error:
                trials = cells.setdefault((r.strategy, r.budget), {}).setdefault(r.model, {})
                trials.setdefault((run, r.run_index, r.case), r.verdict == "recovered")
    return [_paired(strategy, budget, a, models[a], b, models[b])
            for (strategy, budget), models in sorted(cells.items())
            for a, b in itertools.combinations(sorted(models), 2)]


def _by_order(trials: Trials) -> Trials:
    rank = {run: i for i, run in enumerate(sorted({k[0] for k in trials}))}
    return {(rank[k[0]], k[1], k[2]): v for k, v in trials.items()}


def _paired(strategy: str, budget: int, model_a: str, a: Trials, model_b: str, b: Trials) -> PairedDiff:
    same = bool({k[0] for k in a} & {k[0] for k in b})
    if not same:
        a, b = _by_order(a), _by_order(b)
    return PairedDiff(strategy, budget, model_a, model_b, "same run" if same else "run order", *_matched(a, b))


def _matched(a: Trials, b: Trials) -> tuple[int, int, float | None, float | None, int, int, float]:
    """On the trials both finished: (pairs, cases, rate of a, rate of b, cases a recovered more often, cases b
    recovered more often, McNemar's exact p on those two counts)."""
    keys = sorted(set(a) & set(b), key=lambda k: (k[0], k[1], str(k[2])))
    wins: dict[str | None, list[int]] = {}
    for key in keys:
        w = wins.setdefault(key[2], [0, 0])
        w[0] += a[key]
        w[1] += b[key]
    better_a = sum(x > y for x, y in wins.values())
    better_b = sum(y > x for x, y in wins.values())
    return (len(keys), len(wins), sum(a[k] for k in keys) / len(keys) if keys else None,
            sum(b[k] for k in keys) / len(keys) if keys else None, better_a, better_b, mcnemar_p(better_a, better_b))


def run_comparisons(per_run: list[list[Record]], labels: list[str]) -> list[RunDiff]:
    """Before / after: every model × strategy × budget that two runs both hold, paired on (run index, case)."""
    cells: dict[tuple[str, str, int], dict[int, Trials]] = {}
    for run, records in enumerate(per_run):
        for r in dedupe(records)[0]:
            if not r.is_error:
                trials = cells.setdefault((r.model, r.strategy, r.budget), {}).setdefault(run, {})
                trials.setdefault((0, r.run_index, r.case), r.verdict == "recovered")
    out = []
    for (model, strategy, budget), by_run in sorted(cells.items()):
        for i, j in itertools.combinations(sorted(by_run), 2):
            pairs, cases, before, after, worse, better, p = _matched(by_run[i], by_run[j])
            out.append(RunDiff(model, strategy, budget, labels[i], labels[j], pairs, cases, before, after, worse,
                               better, p))
    return out
