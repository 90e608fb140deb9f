"""Success@K of the ideal-recovery experiment (paper §4, Figure 3, appendix B.1), from its continuations'
records (ForwardRecord with a ``start``): summary.json's ``ideal_recovery``, one row per (model, condition) over
every domain and one per domain.

Per instance (a saved episode under one condition) with n continuations that reached their start state and c of
them solved, Success@K is the unbiased estimator of "at least one of K continuations solves" (Chen et al. 2021):
1 - C(n-c, K) / C(n, K), defined for K <= n; the row's value is its mean over the instances where it is defined,
with a 95 % percentile bootstrap interval over instances (scipy.stats.bootstrap, a fixed seed: the same interval
every time). A continuation whose prefix did not reproduce, or any other infrastructure error, is excluded and
counted; an instance none of whose continuations reached its state is excluded and counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from math import comb

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pytest_retrace.results.forward import ForwardRecord, error_kinds
from pytest_retrace.results.records import dedupe

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
CONDITION_ORDER = ("reset", "E-1", "E-random", "R_LLM")


def success_at_k(n: int, c: int, k: int) -> float | None:
    """The chance that k of the n continuations, drawn without replacement, include one of the c solved."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"success_at_k(n={n}, c={c}, k={k}): needs 0 <= c <= n and k >= 1")
    if k > n:
        return None
    return 1.0 - comb(n - c, k) / comb(n, k)


def bootstrap_interval(values: list[float]) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of the mean of ``values``; a single or constant sample is its own."""
    if len(values) < 2 or min(values) == max(values):
        return values[0], values[0]
    from scipy.stats import bootstrap

    res = bootstrap((np.asarray(values, dtype=float),), np.mean, confidence_level=CONFIDENCE,
                    n_resamples=RESAMPLES, method="percentile", random_state=SEED)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


class SuccessRow(BaseModel):
    """One (model, condition[, domain]): Success@K for K = 1..samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str  # the continuing agent
    condition: str
    domain: str | None  # None: every domain
    samples: int  # K continuations per instance
    instances: int  # instances with at least one continuation that reached its state
    excluded: int  # instances none of whose continuations did
    continuations: int  # that reached their state
    solved: int
    errors: int  # continuations excluded: the prefix did not reproduce (desync), or another infrastructure error
    mean_step: float | None  # mean R over the instances
    success: list[float | None]  # Success@K, K = 1..samples (None: no instance has K continuations)
    ci_low: list[float | None]
    ci_high: list[float | None]
    counted: list[int]  # instances Success@K is the mean over, K = 1..samples
    error_kinds: dict[str, int] = Field(default_factory=dict)


def success_rows(records: Iterable[ForwardRecord]) -> list[SuccessRow]:
    """Every continuation's record (a rerun of a test with a verdict ignored, as everywhere: records.dedupe),
    grouped per (model, condition) and per (model, condition, domain); conditions in the paper's order."""
    kept, _ = dedupe(r for r in records if r.start is not None)
    groups: dict[tuple[str, str, str | None], list[ForwardRecord]] = defaultdict(list)
    for r in kept:
        assert r.start is not None
        groups[(r.model, r.start.condition, None)].append(r)
        groups[(r.model, r.start.condition, r.domain or "")].append(r)
    order = {c: i for i, c in enumerate(CONDITION_ORDER)}
    models = list(dict.fromkeys(r.model for r in kept))
    keys = sorted(groups, key=lambda k: (models.index(k[0]), order.get(k[1], len(order)), k[1], k[2] is not None,
                                         k[2] or ""))
    return [_row(key, groups[key]) for key in keys]


def _row(key: tuple[str, str, str | None], group: list[ForwardRecord]) -> SuccessRow:
    model, condition, domain = key
    samples = max(r.start.samples for r in group if r.start is not None)
    by_instance: dict[str, list[ForwardRecord]] = defaultdict(list)
    for r in group:
        assert r.start is not None
        by_instance[r.start.episode].append(r)
    counted = {e: [r for r in rs if not r.is_error] for e, rs in by_instance.items()}
    reached = {e: rs for e, rs in counted.items() if rs}
    success: list[float | None] = []
    low: list[float | None] = []
    high: list[float | None] = []
    at: list[int] = []
    for k in range(1, samples + 1):
        values = [v for rs in reached.values()
                  if (v := success_at_k(len(rs), sum(r.verdict == "solved" for r in rs), k)) is not None]
        at.append(len(values))
        cells: tuple[float | None, ...] = (None, None, None)
        if values:
            lo, hi = bootstrap_interval(values)
            cells = (round(float(np.mean(values)), 6), round(lo, 6), round(hi, 6))
        for column, cell in zip((success, low, high), cells):
            column.append(cell)
    steps = [rs[0].start.step for rs in by_instance.values() if rs[0].start is not None]
    return SuccessRow(
        model=model, condition=condition, domain=domain, samples=samples, instances=len(reached),
        excluded=len(by_instance) - len(reached), continuations=sum(map(len, reached.values())),
        solved=sum(r.verdict == "solved" for rs in reached.values() for r in rs),
        errors=sum(r.is_error for r in group), mean_step=round(float(np.mean(steps)), 3) if steps else None,
        success=success, ci_low=low, ci_high=high, counted=at, error_kinds=error_kinds(group))
