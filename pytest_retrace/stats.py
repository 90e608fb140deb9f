"""Aggregate per-test result records into recovery rates with confidence intervals.

Each finished test yields one record (a JSON-able dict with ``nodeid``, ``model``,
``strategy``, ``domain``, ``verdict``, ``r_o``, ``r_tc``, ``ssim``, ``error`` ...).
Records are grouped per (model, strategy) and per (model, strategy, domain).

Infrastructure errors (``verdict == "error"``) say nothing about the agent, so they
are excluded from every rate and only counted (``errors``, ``error_kinds``).
Recovery success means ``verdict == "recovered"``.

Why the Wilson score interval: benchmark cells are small (often 5-30 cases) and
good or bad agents sit near 0% or 100%. There the usual normal approximation
``p ± z·sqrt(p(1-p)/n)`` breaks down: at 0/10 or 10/10 its width collapses to zero,
and elsewhere it can leave [0, 1]. The Wilson interval stays inside [0, 1], is never
degenerate, and keeps close to nominal coverage for small n, at no extra cost
(closed form, stdlib only).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

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


@dataclass(frozen=True)
class GroupStats:
    """Recovery statistics of one (model, strategy[, domain]) cell."""

    model: str
    strategy: str
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with floats rounded to 6 decimals."""
        return {k: round(v, _DIGITS) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _share(count: int, n: int) -> float | None:
    return count / n if n else None


def _group_stats(model: str, strategy: str, domain: str | None, records: list[dict[str, Any]]) -> GroupStats:
    ok = [r for r in records if r.get("verdict") != "error"]
    n = len(ok)
    recovered = sum(r.get("verdict") == "recovered" for r in ok)
    low, high = wilson_interval(recovered, n)
    ssims = [float(r["ssim"]) for r in ok if r.get("ssim") is not None]
    return GroupStats(
        model=model,
        strategy=strategy,
        domain=domain,
        n=n,
        recovered=recovered,
        rate=_share(recovered, n),
        ci_low=low,
        ci_high=high,
        r_o_rate=_share(sum(r.get("r_o") is True for r in ok), n),
        r_tc_rate=_share(sum(r.get("r_tc") is True for r in ok), n),
        errors=len(records) - n,
        total=len(records),
        mean_ssim=math.fsum(ssims) / len(ssims) if ssims else None,
    )


def _dedupe(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the LAST record per nodeid.

    A resumed run appends to the same results file and re-executes the tests that
    errored before, so the later record is the up-to-date outcome of that test.
    Records without a nodeid are all kept.
    """
    by_id: dict[Any, dict[str, Any]] = {}
    for i, record in enumerate(records):
        nodeid = record.get("nodeid")
        key = nodeid if nodeid is not None else ("<no nodeid>", i)
        by_id.pop(key, None)  # re-insert so dict order follows the winning record
        by_id[key] = record
    return list(by_id.values())


def _key(record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    return "" if value is None else str(value)


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Summarise records into a JSON-able dict, independent of record order.

    Returns ``{"groups", "domains", "n_records", "n_errors", "error_kinds"}`` where
    ``groups`` holds one ``GroupStats.to_dict()`` per (model, strategy) and ``domains``
    one per (model, strategy, domain), both sorted; ``n_records``/``n_errors`` count
    the records left after duplicate nodeids are resolved (last one wins).
    """
    unique = _dedupe(records)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in unique:
        model, strategy, domain = _key(r, "model"), _key(r, "strategy"), _key(r, "domain")
        groups.setdefault((model, strategy), []).append(r)
        cells.setdefault((model, strategy, domain), []).append(r)
    errors = [r for r in unique if r.get("verdict") == "error"]
    kinds = Counter(str((r.get("error") or {}).get("kind") or "unknown") for r in errors)
    return {
        "groups": [_group_stats(m, s, None, groups[m, s]).to_dict() for m, s in sorted(groups)],
        "domains": [_group_stats(m, s, d, cells[m, s, d]).to_dict() for m, s, d in sorted(cells)],
        "n_records": len(unique),
        "n_errors": len(errors),
        "error_kinds": dict(sorted(kinds.items())),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_table(summary: dict[str, Any], *, by_domain: bool = False) -> str:
    """Fixed-width plain-text table of a ``summarize()`` result; ``'-'`` marks missing values."""
    header = [
        "model",
        "strategy",
        *(["domain"] if by_domain else []),
        "n",
        "recovered",
        "rate",
        "95% CI",
        "R_O",
        "R_TC",
        "errors",
    ]
    rows = [header]
    for g in summary["domains" if by_domain else "groups"]:
        ci = "-" if g["rate"] is None else f"[{100 * g['ci_low']:.1f}, {100 * g['ci_high']:.1f}]"
        rows.append(
            [
                g["model"],
                g["strategy"],
                *([g["domain"] or "-"] if by_domain else []),
                str(g["n"]),
                str(g["recovered"]),
                _pct(g["rate"]),
                ci,
                _pct(g["r_o_rate"]),
                _pct(g["r_tc_rate"]),
                str(g["errors"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
