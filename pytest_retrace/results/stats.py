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

Why the Wilson score interval: benchmark cells are small (often 5-30 cases) and
good or bad agents sit near 0% or 100%. There the usual normal approximation
``p ± z·sqrt(p(1-p)/n)`` breaks down: at 0/10 or 10/10 its width collapses to zero,
and elsewhere it can leave [0, 1]. The Wilson interval stays inside [0, 1], is never
degenerate, and keeps close to nominal coverage for small n, at no extra cost
(closed form, stdlib only).

Repeated runs (``--retrace-runs K``, or runs merged by ``retrace report``) put K trials of each case in a
group. Those are not K·n independent trials: a case an agent recovers once it tends to recover again (a
deterministic baseline always does). So the interval is clustered by case (:func:`cluster_wilson_interval`):
the Wilson interval at the *effective* sample size n_eff = p(1 - p) / V, where V is the cluster-robust
(sandwich, CR0) variance of the pooled rate over cases. A case recovered in all K runs then weighs as one
case, not as K trials; with one trial per case it is exactly the Wilson interval above.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_retrace.results.records import Record

Z_95: float = 1.959963984540054  # two-sided 95% normal quantile
_DIGITS: int = 6


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n``; ``(0.0, 1.0)`` when ``n == 0``."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # the bounds are exactly 0 at k = 0 and exactly 1 at k = n; pin them against rounding noise
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score bounds of a share ``p`` at a (possibly fractional, effective) sample size ``n`` > 0."""
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_wilson_interval(clusters: Iterable[tuple[int, int]], z: float = Z_95) -> tuple[float, float, float]:
    """The 95 % interval of a pooled rate whose trials come in clusters (a case's K runs), and its effective
    sample size: ``(low, high, n_eff)`` from ``(successes, trials)`` per cluster.

    p = Σy / Σn over clusters; V = Σ (y_i - p·n_i)² / (Σn)² is the cluster-robust (CR0) variance of p, which
    makes no assumption about how a case's runs depend on each other; n_eff = p(1 - p) / V (Kish's effective
    sample size, N over the design effect), capped at N, the count of trials, since clustering cannot add
    information. When every trial agrees (p = 0 or 1) V is 0 and says nothing: n_eff is then the count of
    clusters, the conservative reading (each case one trial). So 4 of 10 cases recovered in all 3 runs and 6
    in none give exactly ``wilson_interval(4, 10)``, and one trial per cluster gives ``wilson_interval`` itself.
    """
    cells = [(y, n) for y, n in clusters if n > 0]
    for y, n in cells:
        if not 0 <= y <= n:
            raise ValueError(f"need 0 <= successes <= trials in a cluster, got {y}/{n}")
    total = sum(n for _, n in cells)
    if total == 0:
        return 0.0, 1.0, 0.0
    successes = sum(y for y, _ in cells)
    p = successes / total
    variance = math.fsum((y - p * n) ** 2 for y, n in cells) / total**2
    if successes in (0, total):
        n_eff = float(len(cells))
    else:
        n_eff = total if variance == 0 else min(float(total), p * (1 - p) / variance)
    low, high = _wilson(p, n_eff, z)
    # exactly 0 at no success and 1 at all successes, as wilson_interval
    return (0.0 if successes == 0 else low), (1.0 if successes == total else high), n_eff


@dataclass(frozen=True)
class GroupStats:
    """Recovery statistics of one (model, strategy, budget[, domain | kind | horizon]) cell."""

    model: str
    strategy: str
    budget: int | None
    domain: str | None  # None = all domains
    n: int  # non-error records
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
    effective_n: float | None = None  # the interval's effective sample size then (cluster_wilson_interval)
    # the "kinds" / "horizons" breakdowns only ("" = the case does not say); see to_dict
    kind: str | None = None
    horizon: str | None = None
    # the four outcomes of a finished test: recovered is R_O ∧ R_TC; these are one criterion without the other
    r_o_only: int = 0
    r_tc_only: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with floats rounded to 6 decimals. ``kind`` and ``horizon`` appear only in the rows of
        their own breakdown, so the groups and domains rows of summary.json keep the keys they always had."""
        def rounded(v: Any) -> Any:
            if isinstance(v, float):
                return round(v, _DIGITS)
            return {k: rounded(x) for k, x in v.items()} if isinstance(v, dict) else v

        return {k: rounded(v) for k, v in asdict(self).items()
                if v is not None or k not in _BREAKDOWN_ONLY}


_BREAKDOWN_ONLY = ("kind", "horizon")


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
                 records: list[Record], common: set[str] | None = None, **by: str) -> GroupStats:
    ok = [r for r in records if not r.is_error]
    n = len(ok)
    recovered = sum(r.verdict == "recovered" for r in ok)
    by_case = _by_case(ok)
    low, high, n_eff = cluster_wilson_interval(by_case.values())
    repeated = len(by_case) < n  # some case has several trials: the interval is clustered by case
    ssims = [r.ssim for r in ok if r.ssim is not None]
    shared = [r for r in ok if common is not None and r.case in common]
    shared_recovered = sum(r.verdict == "recovered" for r in shared)
    return GroupStats(
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
    )


def _by_case(ok: list[Record]) -> dict[str, tuple[int, int]]:
    """(recovered, finished) per case: the clusters of the interval. A record without a case (a crashed
    worker's) is its own cluster."""
    cells: dict[str, list[int]] = {}
    for r in ok:
        cell = cells.setdefault(r.case if r.case is not None else f"nodeid:{r.nodeid}", [0, 0])
        cell[0] += r.verdict == "recovered"
        cell[1] += 1
    return {case: (y, n) for case, (y, n) in cells.items()}


def _dedupe(records: Iterable[Record]) -> tuple[list[Record], int]:
    """One record per nodeid, and how many later records were ignored.

    The first finished verdict (recovered / not recovered) of a test is final: a rerun under the same run
    (``--lf``, a repeated command) never replaces it, or rerunning failures would turn a run into best-of-k.
    An infrastructure error is replaced by any later record of its test: it measured nothing.
    """
    by_id: dict[str, Record] = {}
    ignored = 0
    for record in records:
        old = by_id.get(record.nodeid)
        if old is not None and not old.is_error:
            ignored += 1
            continue
        by_id.pop(record.nodeid, None)  # re-insert so dict order follows the winning record
        by_id[record.nodeid] = record
    return list(by_id.values()), ignored


def _key(record: Record, field: str) -> str:
    value = getattr(record, field)
    return "" if value is None else str(value)


def _budget(record: Record) -> int | None:
    return record.budget


def _common_cases(records: list[Record]) -> dict[tuple[str, int | None], set[str] | None]:
    """Per (strategy, budget): the cases every compared model finished without an infrastructure error
    (None where only one model ran: nothing to compare)."""
    by_cell: dict[tuple[str, int | None], dict[str, dict[str, bool]]] = {}
    for r in records:
        cell = by_cell.setdefault((_key(r, "strategy"), _budget(r)), {})
        cases = cell.setdefault(_key(r, "model"), {})
        case = _key(r, "case")
        cases[case] = cases.get(case, True) and not r.is_error
    out: dict[tuple[str, int | None], set[str] | None] = {}
    for cell, models in by_cell.items():
        if len(models) < 2:
            out[cell] = None
            continue
        sets = [{c for c, ok in cases.items() if ok} for cases in models.values()]
        out[cell] = set.intersection(*sets)
    return out


# the record field each breakdown groups by, and its key in the summary
BREAKDOWNS: dict[str, str] = {"domain": "domains", "kind": "kinds", "horizon": "horizons"}
# kinds and horizons are listed in this order (from the most to the least visible mistake; short before long),
# values not listed after them alphabetically
KIND_ORDER: tuple[str, ...] = ("visible", "subtle", "hidden-state", "visual-only")
HORIZON_ORDER: tuple[str, ...] = ("short", "long")
_RANKS: dict[str, tuple[str, ...]] = {"kind": KIND_ORDER, "horizon": HORIZON_ORDER}


def _ranked(field: str) -> Any:
    order = _RANKS.get(field, ())

    def key(cell: tuple[str, str, int | None, str]) -> tuple[Any, ...]:
        *group, value = cell
        rank = order.index(value) if value in order else len(order)
        return (*_order(tuple(group)), rank, value)
    return key


def _order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) if isinstance(v, int) or v is None else (False, v) for v in key)


def summarize(records: Iterable[Record]) -> dict[str, Any]:
    """Summarise records into a JSON-able dict, independent of record order.

    Returns ``{"groups", "domains", "kinds", "horizons", "n_records", "n_errors", "n_ignored_reruns",
    "error_kinds", "n_verified_by_determinism"}`` where ``groups`` holds one ``GroupStats.to_dict()`` per (model, strategy, budget),
    ``domains`` one per (model, strategy, budget, domain), ``kinds`` and ``horizons`` likewise per the case's
    kind and horizon, all sorted; ``n_records``/``n_errors`` count the records left after duplicate nodeids
    are resolved (see ``_dedupe``), ``n_ignored_reruns`` the records that tried to replace a finished verdict.
    """
    unique, ignored = _dedupe(records)
    groups: dict[tuple[str, str, int | None], list[Record]] = {}
    cells: dict[str, dict[tuple[str, str, int | None, str], list[Record]]] = {f: {} for f in BREAKDOWNS}
    for r in unique:
        model, strategy, budget = _key(r, "model"), _key(r, "strategy"), _budget(r)
        groups.setdefault((model, strategy, budget), []).append(r)
        for field in BREAKDOWNS:
            cells[field].setdefault((model, strategy, budget, _key(r, field)), []).append(r)
    common = _common_cases(unique)

    def breakdown(field: str) -> list[dict[str, Any]]:
        by = cells[field]
        return [_group_stats(m, s, b, v if field == "domain" else None, by[m, s, b, v], common[s, b],
                             **({} if field == "domain" else {field: v})).to_dict()
                for m, s, b, v in sorted(by, key=_ranked(field))]

    errors = [r for r in unique if r.is_error]
    kinds = Counter((r.error.kind if r.error else "") or "unknown" for r in errors)
    return {
        "groups": [_group_stats(m, s, b, None, groups[m, s, b], common[s, b]).to_dict()
                   for m, s, b in sorted(groups, key=_order)],
        "domains": breakdown("domain"),
        "kinds": breakdown("kind"),
        "horizons": breakdown("horizon"),
        "n_records": len(unique),
        "n_errors": len(errors),
        "n_ignored_reruns": ignored,  # later records of tests that already had a finished verdict
        "error_kinds": dict(sorted(kinds.items())),
        # finished tests of hidden-state cases whose s_error nothing at replay confirms (verified_by:
        # determinism): a perturbation that silently stopped working would show as a recovery, not a desync
        "n_verified_by_determinism": sum(r.error_state_verified_by == "determinism" for r in unique
                                         if not r.is_error),
    }


def _spread(g: dict[str, Any]) -> str:
    if g.get("rate_mean") is None:
        return "-"
    sd = "-" if g.get("rate_sd") is None else f"{100 * g['rate_sd']:.1f}"
    return f"{100 * g['rate_mean']:.1f} ± {sd} ({g['runs']})"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_table(summary: dict[str, Any], *, by_domain: bool = False, by: str | None = None) -> str:
    """Fixed-width plain-text table of a ``summarize()`` result; ``'-'`` marks missing values. The
    ``shared`` column (several models only) is each rate on the cases no compared model errored on.
    ``by`` ("domain", "kind" or "horizon") gives that breakdown; ``by_domain=True`` is ``by="domain"``."""
    return pad_table(table_rows(summary, by="domain" if by_domain else by))


def pad_table(rows: list[list[str]]) -> str:
    """Rows of cells (the first the header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def table_rows(summary: dict[str, Any], *, by: str | None = None) -> list[list[str]]:
    """The cells of :func:`format_table` (header first), for other renderings of the same table (report.py)."""
    if by is not None and by not in BREAKDOWNS:
        raise ValueError(f"no breakdown by {by!r}: one of {', '.join(BREAKDOWNS)}")
    rows_in = summary.get(BREAKDOWNS[by], []) if by else summary["groups"]
    shared = any(g.get("common_n") is not None for g in rows_in)
    costly = any(g.get("calls") for g in rows_in)
    repeated = any(g.get("runs") for g in rows_in)
    header = [
        "model",
        "strategy",
        "r",
        *([by] if by else []),
        "n",
        "recovered",
        "rate",
        "95% CI",
        "R_O",
        "R_TC",
        "errors",
        *(["runs: mean ± sd", "success@k"] if repeated else []),
        *(["shared (n)"] if shared else []),
        *(["calls", "cost"] if costly else []),
    ]
    rows = [header]
    for g in rows_in:
        ci = "-" if g["rate"] is None else f"[{100 * g['ci_low']:.1f}, {100 * g['ci_high']:.1f}]"
        rows.append(
            [
                g["model"],
                g["strategy"],
                "-" if g.get("budget") is None else str(g["budget"]),
                *([g.get(by) or "-"] if by else []),
                str(g["n"]),
                str(g["recovered"]),
                _pct(g["rate"]),
                ci,
                _pct(g["r_o_rate"]),
                _pct(g["r_tc_rate"]),
                str(g["errors"]),
                *([_spread(g), " ".join(f"@{k} {_pct(v)}" for k, v in (g.get("success_at") or {}).items()) or "-"]
                  if repeated else []),
                *(["-" if g.get("common_n") is None else f"{_pct(g.get('common_rate'))} ({g['common_n']})"]
                  if shared else []),
                *([str(g.get("calls") or 0), "-" if g.get("cost") is None else f"${g['cost']:.2f}"] if costly else []),
            ]
        )
    return rows
