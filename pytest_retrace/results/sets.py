"""Independently sampled evaluation sets (the paper's Table 8: "the mean success rate across three different
trials from three independently sampled evaluation sets"), as ``retrace report`` shows them.

A set is what a run was measured on: the case ids its records cover. Runs over the same case ids are one set
(several models, or reruns, on one suite), and so is a run over part of a set's cases (a partial rerun, a
sample); runs over ids neither of which contains the other are different sets, for example suites made by
``retrace build --seed S`` with different seeds. When a report's runs cover two or more sets, each (model,
strategy, budget) gets its rate on each set (the set's runs pooled, infrastructure errors excluded) and the mean
± sample sd (n - 1) of those per-set rates: the spread a reader should expect from drawing another set.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from pytest_retrace.results.records import Record, dedupe


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvaluationSet(_Frozen):
    label: str  # "set 1", "set 2" ... in the order their first run was given
    runs: list[str]  # the labels of its runs
    cases: int


class SetRow(_Frozen):
    model: str
    strategy: str
    budget: int
    rates: list[float | None]  # per set, in EvaluationSet order; None: no finished test of this cell there
    n: list[int]
    mean: float | None  # over the sets with a rate
    sd: float | None  # sample sd over them; None for fewer than two


def evaluation_sets(labels: Sequence[str], per_run: Sequence[Sequence[Record]]
                    ) -> tuple[list[EvaluationSet], list[SetRow]]:
    """The sets the runs cover and each cell's rate per set; ``([], [])`` when they cover one set only."""
    found = [frozenset(r.case for r in records if r.case is not None) for records in per_run]
    # a run over part of another run's cases (a partial rerun, a --retrace-sample of it) measured that set, not
    # another one: it joins the smallest set that contains its cases
    keys: list[frozenset[str]] = []
    for cases in sorted({c for c in found if c}, key=len, reverse=True):
        if not any(cases <= k for k in keys):
            keys.append(cases)
    if len(keys) < 2:
        return [], []
    order = sorted(range(len(keys)), key=lambda k: min(i for i, c in enumerate(found) if c and c <= keys[k]))
    keys = [keys[k] for k in order]  # sets in the order their first run was given
    members: list[list[int]] = [[] for _ in keys]
    for i, cases in enumerate(found):
        if cases:
            members[min((k for k in range(len(keys)) if cases <= keys[k]), key=lambda k: len(keys[k]))].append(i)
    sets = [EvaluationSet(label=f"set {k + 1}", runs=[labels[i] for i in runs], cases=len(keys[k]))
            for k, runs in enumerate(members)]
    counts: dict[tuple[str, str, int], list[list[int]]] = {}
    for k, runs in enumerate(members):
        for i in runs:
            for r in dedupe(per_run[i])[0]:  # a test's first finished verdict, within its own run
                if r.is_error:
                    continue
                cell = counts.setdefault((r.model, r.strategy, r.budget), [[0, 0] for _ in keys])[k]
                cell[0] += r.verdict == "recovered"
                cell[1] += 1
    rows = []
    for (model, strategy, budget), cells in sorted(counts.items()):
        rates = [round(y / n, 6) if n else None for y, n in cells]
        present = [x for x in rates if x is not None]
        rows.append(SetRow(model=model, strategy=strategy, budget=budget, rates=rates, n=[n for _, n in cells],
                           mean=round(statistics.fmean(present), 6) if present else None,
                           sd=round(statistics.stdev(present), 6) if len(present) > 1 else None))
    return sets, rows
