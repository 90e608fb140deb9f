"""Aggregate per-test result records into recovery rates with confidence intervals.

Each finished test yields one :class:`~pytest_retrace.results.records.Record` (``nodeid``, ``model``,
``strategy``, ``budget``, ``domain``, ``verdict``, ``r_o``, ``r_tc``, ``ssim``, ``error``, ``usage`` ...).
Records are grouped per (model, strategy, budget) and, for the breakdowns, per (model, strategy, budget) and
one of the case's domain, kind (visible, subtle, hidden-state, visual-only) or horizon (short, long).

Infrastructure errors (``verdict == "error"``) say nothing about the agent, so they
are excluded from every rate and only counted (``errors``, ``error_kinds``).
Recovery success means ``verdict == "recovered"``.

Excluding errors keeps a rate honest about what was measured, but when models are compared an
unreliable API could still help one: its errors would fall on hard cases as likely as on easy ones,
yet the other model is scored on all of them. So when several models share a (strategy, budget)
cell, each group also carries ``common_*``: the rate on the cases where *no* compared model had an
infrastructure error — the fair basis for a comparison.

Each group's 95 % interval is clustered by case (:mod:`.intervals`); the tables are in :mod:`.tables`.

:func:`summarize` returns :class:`Statistics`, one :class:`Row` per cell: typed, built here only, and read by
field by every reader (tables, report, plots, merge, the gate). results.summary.Summary is a Statistics with
the run's settings. The statistics become JSON only at the boundary: summary.json (``Summary.to_dict``),
``retrace summary --json`` (``Statistics.to_dict``) and ``retrace report --json`` (``MergedReport.to_dict``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer

from pytest_retrace.replay.cases import KINDS
from pytest_retrace.results.intervals import cluster_wilson_interval
from pytest_retrace.results.records import Record, dedupe

_DIGITS: int = 6


class Row(BaseModel):
    """Recovery statistics of one (model, strategy, budget[, domain | kind | horizon]) cell: a row of
    ``groups`` or of a breakdown (``domains``, ``kinds``, ``horizons``). Its floats are rounded to 6 decimals
    when it is built, so a row read back from summary.json equals the one the run computed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    strategy: str
    budget: int | None
    domain: str | None  # None = all domains (groups, kinds, horizons)
    n: int  # finished tests (not infrastructure errors)
    recovered: int
    rate: float | None  # None when n == 0
    ci_low: float
    ci_high: float
    r_o_rate: float | None
    r_tc_rate: float | None
    errors: int
    total: int  # n + errors
    mean_ssim: float | None
    calls: int  # model calls (the agent's, then the contextualizer's and verifier's)
    input_tokens: int
    output_tokens: int
    cost: float | None  # estimated USD; None when no record carries a price
    common_n: int | None = None  # on the cases no compared model errored on (None: a single model)
    common_recovered: int | None = None
    common_rate: float | None = None
    # --retrace-runs K > 1 only (None otherwise): see _repeated
    runs: int | None = None
    rate_mean: float | None = None
    rate_sd: float | None = None
    success_at: dict[str, float] | None = None  # "k" -> success@k
    clusters: int | None = None  # cases behind ci_low / ci_high when some case ran more than once
    # the interval's effective sample size then (cluster_wilson_interval), which gives the count of trials as
    # an int where their variance is 0: int | float keeps it so, as summary.json always wrote it
    effective_n: int | float | None = None
    # the "kinds" / "horizons" breakdowns only ("" = the case does not say)
    kind: str | None = None
    horizon: str | None = None
    # the four outcomes of a finished test: recovered is R_O ∧ R_TC; these are one criterion without the other
    r_o_only: int = 0
    r_tc_only: int = 0
    # retrace report only (results.merge): the row's rate in each of the runs it averages
    per_run: list[float | None] | None = None

    def category(self, by: str) -> str:
        """The row's value of a breakdown field (BREAKDOWNS: domain, kind, horizon); "" where the case does not
        say."""
        return getattr(self, by) or ""

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # kind and horizon only in the rows of their own breakdown, per_run only in a merged report: the rows
        # of summary.json keep the keys they always had
        return {k: v for k, v in handler(self).items() if v is not None or k not in _ONLY_WHERE_SET}


_ONLY_WHERE_SET = ("kind", "horizon", "per_run")


class Statistics(BaseModel):
    """What :func:`summarize` computes from records: the rows and the run's counts (summary.json's keys;
    results.summary.Summary adds the run's settings, failures and gate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[Row]
    domains: list[Row] = []
    kinds: list[Row] = []
    horizons: list[Row] = []
    n_records: int
    n_errors: int
    n_ignored_reruns: int = 0  # later records of tests that already had a finished verdict
    error_kinds: dict[str, int] = {}
    # finished tests of hidden-state cases whose s_error nothing at replay confirms (verified_by: determinism):
    # a perturbation that silently stopped working would show as a recovery, not a desync
    n_verified_by_determinism: int = 0

    def rows(self, by: str | None = None) -> list[Row]:
        """``groups``, or the breakdown by "domain", "kind" or "horizon"."""
        if by is None:
            return self.groups
        if by not in BREAKDOWNS:
            raise ValueError(f"no breakdown by {by!r}: one of {', '.join(BREAKDOWNS)}")
        return getattr(self, BREAKDOWNS[by])

    def to_dict(self) -> dict[str, Any]:
        """As JSON (``retrace summary --json``; summary.json's keys)."""
        return self.model_dump(mode="json")


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, _DIGITS)
    return {k: _rounded(x) for k, x in v.items()} if isinstance(v, dict) else v


def _share(count: int, n: int) -> float | None:
    return count / n if n else None


def _usage_sum(records: list[Record], field: str) -> float | None:
    values = [usage.get(field) for r in records for usage in (r.usage, r.context_usage)]
    present = [v for v in values if v is not None]
    return math.fsum(present) if present else None


def _repeated(records: list[Record]) -> dict[str, Any]:
    """Statistics of repeated runs (``--retrace-runs K``), as the paper reports three-run results.

    ``rate_mean`` / ``rate_sd``: the rate of each run index on its finished records, then their mean and
    sample standard deviation (n - 1) across runs. ``success_at[k]``: the unbiased estimator of the chance that
    at least one of k runs of a case recovers, 1 - C(n - c, k) / C(n, k) for a case with n finished runs of
    which c recovered, averaged over the cases with n >= k (Chen et al. 2021's pass@k)."""
    indices = sorted({r.run_index for r in records})
    if len(indices) < 2:
        return {}
    ok = [r for r in records if not r.is_error]
    per_run = []
    for index in indices:
        verdicts = [r.verdict == "recovered" for r in ok if r.run_index == index]
        if verdicts:
            per_run.append(sum(verdicts) / len(verdicts))
    by_case: dict[str | None, list[bool]] = {}
    for r in ok:
        by_case.setdefault(r.case, []).append(r.verdict == "recovered")
    success_at = {}
    for k in range(1, len(indices) + 1):
        values = [1 - math.comb(len(v) - sum(v), k) / math.comb(len(v), k) for v in by_case.values() if len(v) >= k]
        if values:
            success_at[str(k)] = math.fsum(values) / len(values)
    return {
        "runs": len(indices),
        "rate_mean": math.fsum(per_run) / len(per_run) if per_run else None,
        "rate_sd": statistics.stdev(per_run) if len(per_run) > 1 else None,
        "success_at": success_at,
    }


def _group_stats(model: str, strategy: str, budget: int | None, domain: str | None,
                 records: list[Record], common: set[str] | None = None, **by: str) -> Row:
    ok = [r for r in records if not r.is_error]
    n = len(ok)
    recovered = sum(r.verdict == "recovered" for r in ok)
    by_case = _by_case(ok)
    low, high, n_eff = cluster_wilson_interval(by_case.values())
    repeated = len(by_case) < n  # some case has several trials: the interval is clustered by case
    ssims = [r.ssim for r in ok if r.ssim is not None]
    shared = [r for r in ok if common is not None and r.case in common]
    shared_recovered = sum(r.verdict == "recovered" for r in shared)
    return Row(**{k: _rounded(v) for k, v in dict(
        model=model,
        strategy=strategy,
        budget=budget,
        domain=domain,
        n=n,
        recovered=recovered,
        rate=_share(recovered, n),
        ci_low=low,
        ci_high=high,
        r_o_rate=_share(sum(r.r_o is True for r in ok), n),
        r_tc_rate=_share(sum(r.r_tc is True for r in ok), n),
        errors=len(records) - n,
        total=len(records),
        mean_ssim=math.fsum(ssims) / len(ssims) if ssims else None,
        calls=int(_usage_sum(records, "calls") or 0),
        input_tokens=int(_usage_sum(records, "input_tokens") or 0),
        output_tokens=int(_usage_sum(records, "output_tokens") or 0),
        cost=_usage_sum(records, "cost"),
        common_n=None if common is None else len(shared),
        common_recovered=None if common is None else shared_recovered,
        common_rate=None if common is None else _share(shared_recovered, len(shared)),
        **_repeated(records),
        clusters=len(by_case) if repeated else None,
        effective_n=n_eff if repeated else None,
        **by,
        r_o_only=sum(r.r_o is True and r.r_tc is not True for r in ok),
        r_tc_only=sum(r.r_tc is True and r.r_o is not True for r in ok),
    ).items()})


def _by_case(ok: list[Record]) -> dict[str, tuple[int, int]]:
    """(recovered, finished) per case: the clusters of the interval. A record without a case (a crashed
    worker's) is its own cluster."""
    cells: dict[str, list[int]] = {}
    for r in ok:
        cell = cells.setdefault(r.case if r.case is not None else f"nodeid:{r.nodeid}", [0, 0])
        cell[0] += r.verdict == "recovered"
        cell[1] += 1
    return {case: (y, n) for case, (y, n) in cells.items()}


def _key(record: Record, field: str) -> str:
    value = getattr(record, field)
    return "" if value is None else str(value)


def _budget(record: Record) -> int | None:
    return record.budget


def _common_cases(records: list[Record], across_strategies: bool = False) -> dict[tuple[str, int | None], set[str] | None]:
    """Per (strategy, budget): the cases every compared model finished without an infrastructure error
    (None where only one model ran: nothing to compare). ``across_strategies`` (the paper's fair-comparison
    subset, docs/paper.md row 5): every (model, strategy) of a budget is compared, and each strategy's cell gets
    that one set."""
    by_cell: dict[tuple[str, int | None], dict[str, dict[str, bool]]] = {}
    for r in records:
        cell = by_cell.setdefault(("*" if across_strategies else _key(r, "strategy"), _budget(r)), {})
        who = f"{_key(r, 'model')} · {_key(r, 'strategy')}" if across_strategies else _key(r, "model")
        cases = cell.setdefault(who, {})
        case = _key(r, "case")
        cases[case] = cases.get(case, True) and not r.is_error
    out: dict[tuple[str, int | None], set[str] | None] = {}
    for cell, models in by_cell.items():
        if len(models) < 2:
            out[cell] = None
            continue
        sets = [{c for c, ok in cases.items() if ok} for cases in models.values()]
        out[cell] = set.intersection(*sets)
    if across_strategies:  # the one set of a budget, under every strategy's key
        strategies = {_key(r, "strategy") for r in records}
        return {(s, b): shared for (_, b), shared in out.items() for s in strategies}
    return out


# the record field each breakdown groups by, and its key in the summary
BREAKDOWNS: dict[str, str] = {"domain": "domains", "kind": "kinds", "horizon": "horizons"}
# kinds and horizons are listed in this order (KINDS: from the most to the least visible mistake; short before
# long), values not listed after them alphabetically
HORIZON_ORDER: tuple[str, ...] = ("short", "long")
_RANKS: dict[str, tuple[str, ...]] = {"kind": KINDS, "horizon": HORIZON_ORDER}


def _ranked(field: str) -> Any:
    order = _RANKS.get(field, ())

    def key(cell: tuple[str, str, int | None, str]) -> tuple[Any, ...]:
        *group, value = cell
        rank = order.index(value) if value in order else len(order)
        return (*_order(tuple(group)), rank, value)
    return key


def _order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) if isinstance(v, int) or v is None else (False, v) for v in key)


def summarize(records: Iterable[Record], *, shared_across_strategies: bool = False) -> Statistics:
    """The statistics of records, independent of their order: one row per (model, strategy, budget) in
    ``groups``, one per (model, strategy, budget, domain) in ``domains``, ``kinds`` and ``horizons`` likewise
    per the case's kind and horizon, all sorted; ``n_records`` / ``n_errors`` count the records left after
    duplicate nodeids are resolved (:func:`~pytest_retrace.results.records.dedupe`), ``n_ignored_reruns`` the
    records that tried to replace a finished verdict. ``shared_across_strategies``: the ``common_*`` cases
    are those every (model, strategy) of a budget finished (--retrace-protocol=paper), not every model of a
    (strategy, budget)."""
    unique, ignored = dedupe(records)
    groups: dict[tuple[str, str, int | None], list[Record]] = {}
    cells: dict[str, dict[tuple[str, str, int | None, str], list[Record]]] = {f: {} for f in BREAKDOWNS}
    for r in unique:
        model, strategy, budget = _key(r, "model"), _key(r, "strategy"), _budget(r)
        groups.setdefault((model, strategy, budget), []).append(r)
        for field in BREAKDOWNS:
            cells[field].setdefault((model, strategy, budget, _key(r, field)), []).append(r)
    common = _common_cases(unique, shared_across_strategies)

    def breakdown(field: str) -> list[Row]:
        by = cells[field]
        return [_group_stats(m, s, b, v if field == "domain" else None, by[m, s, b, v], common[s, b],
                             **({} if field == "domain" else {field: v}))
                for m, s, b, v in sorted(by, key=_ranked(field))]

    errors = [r for r in unique if r.is_error]
    kinds = Counter((r.error.kind if r.error else "") or "unknown" for r in errors)
    return Statistics(
        groups=[_group_stats(m, s, b, None, groups[m, s, b], common[s, b]) for m, s, b in sorted(groups, key=_order)],
        domains=breakdown("domain"),
        kinds=breakdown("kind"),
        horizons=breakdown("horizon"),
        n_records=len(unique),
        n_errors=len(errors),
        n_ignored_reruns=ignored,
        error_kinds=dict(sorted(kinds.items())),
        n_verified_by_determinism=sum(r.error_state_verified_by == "determinism" for r in unique if not r.is_error),
    )
