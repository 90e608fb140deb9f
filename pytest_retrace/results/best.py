"""The best explicit strategy per model (the paper's Figure 7: "maximum long-horizon recovery success rate among
four different explicit recovery strategies"), from a summary's rows: one row per (model, budget, horizon), the
horizon ``None`` for all cases together, beside the model's implicit rate on the same cells.

Which rate is compared: where the rows carry ``common_*`` (several models or, under --retrace-protocol=paper, the
one subset every (model, strategy) of a budget finished), that shared rate, so that each model's maximum is taken
over the same cases as the others'; otherwise the row's own rate. ``basis`` says which. A maximum over several
strategies is an optimistic estimate (the best of k noisy rates is biased upwards): the paper reports it as such,
and so do the tables here, with each strategy's own interval and n.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pytest_retrace.results.intervals import wilson_interval
from pytest_retrace.results.stats import HORIZON_ORDER, Row, Statistics

IMPLICIT = "implicit"


class BestExplicitRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    budget: int | None
    horizon: str | None  # None: every case; "" the cases that do not say their horizon
    strategy: str  # the explicit strategy with the highest rate (ties: the first by name)
    rate: float | None
    n: int
    recovered: int
    ci_low: float
    ci_high: float
    basis: Literal["shared", "all"]  # the shared cases' rate (common_*) or the row's own
    compared: list[str]  # the explicit strategies the maximum is over, each with a finished test
    implicit_rate: float | None = None  # the model's implicit rate on the same basis; None if it did not run
    implicit_n: int | None = None


def _basis(row: Row) -> tuple[int, int, Literal["shared", "all"]]:
    if row.common_n is not None and row.common_recovered is not None:
        return row.common_recovered, row.common_n, "shared"
    return row.recovered, row.n, "all"


def best_explicit_rows(summary: Statistics) -> list[BestExplicitRow]:
    """Per (model, budget) over all cases and per horizon: the explicit strategy with the highest rate. Empty
    when no explicit strategy finished a test."""
    out = []
    for rows in (summary.groups, summary.horizons):
        cells: dict[tuple[str, int | None, str | None], list[Row]] = {}
        for row in rows:  # a horizons row's horizon is a str ("" where the case does not say), a group's None
            cells.setdefault((row.model, row.budget, row.horizon), []).append(row)
        for (model, budget, horizon), cell in cells.items():
            best = _best(model, budget, horizon, cell)
            if best is not None:
                out.append(best)
    def order(r: BestExplicitRow) -> tuple[object, ...]:  # each model's budgets: every case, then the horizons
        rank = HORIZON_ORDER.index(r.horizon) if r.horizon in HORIZON_ORDER else len(HORIZON_ORDER)
        return (r.model, r.budget is None, r.budget or 0, r.horizon is not None, rank, r.horizon or "")
    return sorted(out, key=order)


def _best(model: str, budget: int | None, horizon: str | None, cell: Sequence[Row]) -> BestExplicitRow | None:
    explicit = [r for r in cell if r.strategy.startswith("explicit") and _basis(r)[1] > 0]
    if not explicit:
        return None
    # max() keeps the first of equal rates: by name, so a tie is broken the same way every time
    top = max(sorted(explicit, key=lambda r: r.strategy), key=lambda r: _basis(r)[0] / _basis(r)[1])
    recovered, n, basis = _basis(top)
    low, high = wilson_interval(recovered, n)
    implicit = next((r for r in cell if r.strategy == IMPLICIT), None)
    imp = _basis(implicit) if implicit is not None else None
    return BestExplicitRow(model=model, budget=budget, horizon=horizon, strategy=top.strategy,
                           rate=round(recovered / n, 6), n=n, recovered=recovered, ci_low=round(low, 6),
                           ci_high=round(high, 6), basis=basis, compared=sorted(r.strategy for r in explicit),
                           implicit_rate=None if not imp or not imp[1] else round(imp[0] / imp[1], 6),
                           implicit_n=None if imp is None else imp[1])
