"""Figures of recovery rates for a run's summary.md and for ``retrace report --out``, each as PNG (linked
from the markdown), PDF and SVG (vector, for a paper):

- ``rates``: the rate of each model × strategy (× budget) with its error bar;
- ``budget``: rate against the recovery budget r, one line per model × strategy (only when r varies: with
  a single r it would be one point per line);
- ``domains``, ``kinds``, ``horizons``: the rate per domain / kind of mistake / horizon, grouped bars;
- ``criteria``: what each model × strategy (× budget) scored on the two criteria, stacked: recovered
  (R_O ∧ R_TC), R_O only (the screen is back, the task state is not), R_TC only, neither;
- the paper's figures (results.paper_figures): ``best_explicit`` (Figure 7) beside these; ``success_at_k``
  (Figure 3) and ``end_to_end`` (Figure 8) instead of them, in an ideal-recovery and an end-to-end run.

Error bars are the 95 % Wilson interval of a single run, and the sample sd of the per-run rates around their
mean where a group spans several runs (``--retrace-runs K`` or merged run directories) — the interval of
pooled repeats of the same cases would claim a precision the runs do not have. Each title says which.

Sizes, formats and the deterministic style are results.plotkit's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_retrace.replay.cases import KINDS
from pytest_retrace.results import paper_figures
from pytest_retrace.results.best import best_explicit_rows
from pytest_retrace.results.plotkit import figure, percent_axis, write_figures
from pytest_retrace.results.stats import HORIZON_ORDER, Row, Statistics, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pytest_retrace.results.records import Record

PLOTS: tuple[str, ...] = ("rates.png", "budget.png", "domains.png", "kinds.png", "horizons.png", "criteria.png")
BEST_PLOTS: tuple[str, ...] = ("best_explicit.png",)  # a recovery run's where an explicit strategy ran (Figure 7)
INTENTION_PLOTS: tuple[str, ...] = ("intention.png",)  # a recovery run's where a model explained (Figure 6)
IDEAL_PLOTS: tuple[str, ...] = ("success_at_k.png",)  # an ideal-recovery run's, instead of PLOTS (Figure 3)
END_TO_END_PLOTS: tuple[str, ...] = ("end_to_end.png",)  # an end-to-end run's, instead of PLOTS (Figure 8)
ALL_PLOTS: tuple[str, ...] = PLOTS + BEST_PLOTS + INTENTION_PLOTS + IDEAL_PLOTS + END_TO_END_PLOTS
Point = tuple[float, float, float]  # value, error below, error above (percent)


def write_plots(data: Statistics | Iterable[Record], out_dir: Path, *,
                errors: list[str] | None = None) -> list[Path]:
    """Write a run's figures into ``out_dir``, each in every one of plotkit.FORMATS, from a summary
    (results.summary.Summary, a merged report's statistics) or from records (summarised here); returns the PNG of
    each figure written (its PDF and SVG lie beside it). A recovery run's are :data:`PLOTS` (``budget.png`` only
    with more than one budget) and, where an explicit strategy ran, ``best_explicit.png``; an ideal-recovery run's
    :data:`IDEAL_PLOTS`, an end-to-end run's :data:`END_TO_END_PLOTS` instead. A figure that fails raises
    plotkit.PlotError naming its file — or, when ``errors`` is given, is recorded there and the other figures are
    still written. A figure not drawn this time has its files from an earlier call removed, so that nothing links
    a stale picture."""
    summary = data if isinstance(data, Statistics) else summarize(list(data))
    figures: dict[str, Callable[[Statistics], Figure]] = {
        "rates.png": _rates, "budget.png": _budget, "criteria.png": _criteria,
        "domains.png": lambda s: _breakdown(s, "domain", (), "Recovery rate by domain"),
        "kinds.png": lambda s: _breakdown(s, "kind", KINDS, "Recovery rate by kind of mistake"),
        "horizons.png": lambda s: _breakdown(s, "horizon", HORIZON_ORDER, "Recovery rate by horizon"),
        "best_explicit.png": paper_figures.best_explicit, "success_at_k.png": paper_figures.success_at_k,
        "end_to_end.png": paper_figures.end_to_end, "intention.png": paper_figures.intention,
    }
    draw = {name: figures[name] for name in ALL_PLOTS}  # written (and returned) in this order
    if getattr(summary, "ideal_recovery", None):  # an ideal-recovery run has no recovery rates to draw
        keep = set(IDEAL_PLOTS)
    elif getattr(summary, "end_to_end", None):  # nor has an end-to-end run
        keep = set(END_TO_END_PLOTS)
    else:
        keep = set(PLOTS) - (set() if len(_budgets(summary)) > 1 else {"budget.png"})
        keep |= set(BEST_PLOTS) if best_explicit_rows(summary) else set()
        keep |= set(INTENTION_PLOTS) if getattr(summary, "intention", None) else set()
    return write_figures(summary, out_dir, draw, set(draw) - keep, errors)


class _Colours:
    """One colour per model × strategy, the same in every figure; tab10, or tab20 past ten of them (with
    hatching past twenty, where colours alone would repeat)."""

    def __init__(self, summary: Statistics) -> None:
        self.pairs = list(dict.fromkeys((g.model, g.strategy) for g in summary.groups))

    def __call__(self, model: str, strategy: str) -> tuple[Any, str | None]:
        import matplotlib

        i = self.pairs.index((model, strategy))
        cmap = matplotlib.colormaps["tab10" if len(self.pairs) <= 10 else "tab20"]
        return cmap(i % cmap.N), [None, "//", "..", "xx"][i // cmap.N % 4]


def _point(g: Row) -> Point | None:
    """The bar of a group: its mean ± sd over several runs, else its rate and Wilson interval."""
    if (g.runs or 0) > 1 and g.rate_mean is not None:
        mean, sd = 100 * g.rate_mean, 100 * (g.rate_sd or 0.0)
        return mean, min(sd, mean), min(sd, 100 - mean)  # drawn within 0-100 %: no rate lies outside
    if g.rate is None:
        return None
    rate = 100 * g.rate
    return rate, rate - 100 * g.ci_low, 100 * g.ci_high - rate


def _error_bars(groups: list[Row]) -> str:
    repeated = any((g.runs or 0) > 1 for g in groups)
    single = any((g.runs or 0) <= 1 for g in groups)
    if repeated and single:
        return "error bars: 95% Wilson interval (one run), sd across runs (several runs)"
    return "mean of runs, error bars: sd across runs" if repeated else "error bars: 95% Wilson interval"


def _budgets(summary: Statistics) -> list[int | None]:
    return sorted({g.budget for g in summary.groups}, key=lambda b: (b is None, b or 0))


def _labels(groups: list[Row], budgets: bool) -> list[str]:
    """A bar's label: its model and strategy, and its budget where the budgets differ."""
    return [f"{g.model}\n{g.strategy}" + (f"\nr={g.budget}" if budgets else "") for g in groups]


def _empty(fig: Figure, ax: Axes, title: str) -> Figure:
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, "no finished tests", ha="center", va="center", fontsize=12, transform=ax.transAxes)
    return fig


def _rates(summary: Statistics) -> Figure:
    groups = summary.groups
    fig, [ax] = figure(1.3 * len(groups) + 2)
    title = "Recovery rate per model × strategy"
    if not groups:
        return _empty(fig, ax, title)
    colour = _Colours(summary)
    several = len(_budgets(summary)) > 1
    for i, g in enumerate(groups):
        point = _point(g)
        if point is None:
            ax.text(i, 2, "no verdict", ha="center", va="bottom", fontsize=8, rotation=90)
            continue
        value, below, above = point
        face, hatch = colour(g.model, g.strategy)
        ax.bar(i, value, width=0.6, color=face, hatch=hatch, edgecolor="black", linewidth=0.6)
        ax.errorbar(i, value, yerr=[[below], [above]], fmt="none", ecolor="black", capsize=5, linewidth=1.2)
        runs = f", {g.runs} runs" if (g.runs or 0) > 1 else ""
        ax.text(i, value + above + 1.5, f"{value:.1f}%\nn={g.n}{runs}", ha="center", va="bottom", fontsize=8)
    labels = _labels(groups, several)
    ax.set_xticks(range(len(groups)), labels, fontsize=9)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    percent_axis(ax)
    ax.set_title(f"{title}\n({_error_bars(groups)})", fontsize=11)
    return fig


def _budget(summary: Statistics) -> Figure:
    groups = summary.groups
    fig, [ax] = figure(8.0)
    title = "Recovery rate vs recovery budget r"
    lines: dict[tuple[str, str], list[tuple[int, Point]]] = {}
    for g in groups:
        point = _point(g)
        if point is not None and g.budget is not None:
            lines.setdefault((g.model, g.strategy), []).append((g.budget, point))
    if not lines:
        return _empty(fig, ax, title)
    colour = _Colours(summary)
    budgets = sorted({b for points in lines.values() for b, _ in points})
    log = budgets[-1] >= 10 * budgets[0]  # 1, 3, 10, 30: equal steps on a log axis
    step = min((b - a for a, b in itertools.pairwise(budgets)), default=1)
    markers = "osD^vP*X"
    for i, ((model, strategy), points) in enumerate(lines.items()):
        points.sort()
        # a small sideways shift per line, so that lines at the same rate do not hide each other
        shift = (i - (len(lines) - 1) / 2) * 0.04
        xs = [b * 10 ** (shift / 4) if log else b + shift * step for b, _ in points]
        ax.errorbar(xs, [p[0] for _, p in points], yerr=[[p[1] for _, p in points], [p[2] for _, p in points]],
                    color=colour(model, strategy)[0], marker=markers[i % len(markers)], markersize=7, capsize=4,
                    linewidth=1.6, label=f"{model} · {strategy}")
    if log:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(budgets, [str(b) for b in budgets])
    if len(budgets) == 1:
        ax.set_xlim(budgets[0] - 1, budgets[0] + 1)
    ax.set_xlabel("recovery budget r (actions)")
    percent_axis(ax, 105.0, -4.0)  # below 0 so that a marker at 0% is not cut in half
    ax.set_title(f"{title}\n({_error_bars(groups)})", fontsize=11)
    fig.legend(loc="outside lower center", ncols=min(len(lines), 4), fontsize=9, frameon=False)
    return fig


def _categories(rows: list[Row], field: str, order: tuple[str, ...]) -> list[str]:
    present = {r.category(field) for r in rows}
    known = [c for c in order if c in present]
    return known + sorted(present - set(order))


def _breakdown(summary: Statistics, field: str, order: tuple[str, ...], title: str) -> Figure:
    """Grouped bars: a group per category, a bar per model × strategy in it; one panel per budget, so that a
    sweep over r does not crowd a dozen bars into each group."""
    rows = summary.rows(field)
    categories = _categories(rows, field, order)
    colour = _Colours(summary)
    series = colour.pairs
    budgets = _budgets(summary)
    fig, axes = figure(1.1 * len(categories) * max(len(series), 2) / 2 + 3, max(len(budgets), 1))
    if not rows:
        return _empty(fig, axes[0], title)
    cells = {(r.model, r.strategy, r.budget, r.category(field)): r for r in rows}
    width = 0.8 / len(series)
    annotate = len(series) <= 4  # past that the labels would overlap
    for ax, budget in zip(axes, budgets):
        for i, (model, strategy) in enumerate(series):
            xs, values, below, above, ns = [], [], [], [], []
            for x, category in enumerate(categories):
                row = cells.get((model, strategy, budget, category))
                point = _point(row) if row else None
                if row is None or point is None:
                    continue
                xs.append(x + (i - (len(series) - 1) / 2) * width)
                values.append(point[0])
                below.append(point[1])
                above.append(point[2])
                ns.append(row.n)
            face, hatch = colour(model, strategy)
            ax.bar(xs, values, width=width * 0.92, color=face, hatch=hatch, edgecolor="black", linewidth=0.5,
                   label=f"{model} · {strategy}" if ax is axes[0] else None)
            ax.errorbar(xs, values, yerr=[below, above], fmt="none", ecolor="black", capsize=3, linewidth=1.0)
            if annotate:
                for x, v, up, n in zip(xs, values, above, ns):
                    ax.text(x, v + up + 1.5, f"{v:.0f}%\nn={n}", ha="center", va="bottom", fontsize=7)
        percent_axis(ax)
        if len(budgets) > 1:
            ax.set_title(f"r = {budget}", fontsize=10, loc="left")
    axes[-1].set_xticks(range(len(categories)), [c or "unknown" for c in categories], fontsize=10)
    axes[-1].set_xlim(-0.6, len(categories) - 0.4)
    fig.suptitle(f"{title}\n({_error_bars(rows)})", fontsize=11)
    fig.legend(loc="outside lower center", ncols=min(len(series), 4), fontsize=9, frameon=False)
    return fig


# the stack of the criteria figure, bottom up: its key, legend and colour
_OUTCOMES: tuple[tuple[str, str, str], ...] = (
    ("recovered", "recovered (R_O ∧ R_TC)", "#2ca02c"),
    ("r_o_only", "R_O only (screen back, task state not)", "#1f77b4"),
    ("r_tc_only", "R_TC only (task state back, screen not)", "#ff7f0e"),
    ("neither", "neither", "#d3d3d3"),
)


def _outcomes(g: Row) -> dict[str, float]:
    n = g.n
    counts = {"recovered": g.recovered, "r_o_only": g.r_o_only, "r_tc_only": g.r_tc_only}
    counts["neither"] = n - sum(counts.values())
    return {k: 100 * v / n for k, v in counts.items()}


def _criteria(summary: Statistics) -> Figure:
    """R_O against R_TC: the share of finished tests in each of the four outcomes, per group (pooled over
    runs: a share of trials, no interval)."""
    groups = [g for g in summary.groups if g.n]
    fig, [ax] = figure(1.3 * len(groups) + 2)
    title = "R_O vs R_TC per model × strategy"
    if not groups:
        return _empty(fig, ax, title)
    several = len(_budgets(summary)) > 1
    bottoms = [0.0] * len(groups)
    for key, label, face in _OUTCOMES:
        values = [_outcomes(g)[key] for g in groups]
        ax.bar(range(len(groups)), values, bottom=bottoms, width=0.6, color=face, edgecolor="black",
               linewidth=0.6, label=label)
        for i, (value, bottom) in enumerate(zip(values, bottoms)):
            if value >= 6:  # a label fits
                ax.text(i, bottom + value / 2, f"{value:.0f}%", ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, g in enumerate(groups):
        ax.text(i, 101.5, f"n={g.n}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), _labels(groups, several), fontsize=9)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    percent_axis(ax, 110.0)
    ax.set_ylabel("share of finished tests (%)")
    ax.set_title(f"{title}\n(recovered = both criteria; the others fail one or both)", fontsize=11)
    fig.legend(loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


