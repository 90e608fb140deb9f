"""The paper's figures that are not recovery rates per model: Figure 6 (recovery intention, a recovery run's where
a model explained its recovery), Figure 3 (Success@K under ideal recovery, an
ideal-recovery run's), Figure 7 (the best explicit strategy per model, beside the implicit rate, a recovery run's
where an explicit strategy ran) and Figure 8 (end-to-end: the change in success against the number of recoveries
allowed, an end-to-end run's). Each draws from the summary's typed rows (results.success, results.best,
results.endtoend); results.plots writes them with the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_retrace.results.best import best_explicit_rows
from pytest_retrace.results.intention import IntentionRow
from pytest_retrace.results.plotkit import figure, percent_axis
from pytest_retrace.results.stats import Statistics

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def success_at_k(summary: Any) -> Figure:
    """Figure 3: Success@K against K, a line per recovery-step condition with its 95 % bootstrap band; a panel
    per model."""
    rows = [r for r in summary.ideal_recovery if r.domain is None]
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = figure(7.0, len(models))
    import matplotlib

    colours = matplotlib.colormaps["tab10"]
    conditions = list(dict.fromkeys(r.condition for r in rows))
    for ax, model in zip(axes, models):
        for row in (r for r in rows if r.model == model):
            ks = [k + 1 for k, v in enumerate(row.success) if v is not None]
            if not ks:
                continue
            values = [100 * row.success[k - 1] for k in ks]
            colour = colours(conditions.index(row.condition) % colours.N)
            ax.plot(ks, values, marker="o", color=colour, label=f"R = {row.condition} ({row.instances} inst.)")
            ax.fill_between(ks, [100 * row.ci_low[k - 1] for k in ks], [100 * row.ci_high[k - 1] for k in ks],
                            color=colour, alpha=0.15, linewidth=0)
        ax.set_title(f"Success@K under ideal recovery: {model}\n(95 % percentile bootstrap over instances)",
                     fontsize=11)
        ax.set_xlabel("K (continuations)")
        ax.set_xticks(range(1, max((r.samples for r in rows), default=1) + 1))
        percent_axis(ax, top=105.0, label="Success@K (%)")
        ax.legend(fontsize=8, loc="lower right")
    return fig


def best_explicit(summary: Statistics) -> Figure:
    """Figure 7: per model, the best explicit strategy's rate (its name on the bar, its 95 % Wilson interval)
    beside the model's implicit rate; a panel per horizon the cases have (the paper's figure is the long one),
    else one over every case; a panel per budget when several ran."""
    import matplotlib

    rows = best_explicit_rows(summary)
    horizons = [h for h in ("long", "short") if any(r.horizon == h for r in rows)] or [None]
    panels = [(b, h) for b in dict.fromkeys(r.budget for r in rows) for h in horizons]
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = figure(1.6 * len(models) + 3, len(panels))
    colours = matplotlib.colormaps["tab10"]
    for ax, (budget, horizon) in zip(axes, panels):
        cell = {r.model: r for r in rows if r.budget == budget and r.horizon == horizon}
        for i, model in enumerate(models):
            row = cell.get(model)
            if row is None or row.rate is None:
                continue
            value = 100 * row.rate
            ax.bar(i + 0.2, value, width=0.38, color=colours(1), edgecolor="black", linewidth=0.6,
                   label="best explicit" if i == 0 else None)
            ax.errorbar(i + 0.2, value, yerr=[[value - 100 * row.ci_low], [100 * row.ci_high - value]], fmt="none",
                        ecolor="black", capsize=4, linewidth=1.0)
            ax.text(i + 0.2, 100 * row.ci_high + 1.5, f"{value:.1f}%\n{row.strategy}\nn={row.n}", ha="center",
                    va="bottom", fontsize=7)
            if row.implicit_rate is not None:
                ax.bar(i - 0.2, 100 * row.implicit_rate, width=0.38, color=colours(0), edgecolor="black",
                       linewidth=0.6, label="implicit" if i == 0 else None)
                ax.text(i - 0.2, 100 * row.implicit_rate + 1.5, f"{100 * row.implicit_rate:.1f}%", ha="center",
                        va="bottom", fontsize=7)
        ax.set_xticks(range(len(models)), models, fontsize=9)
        ax.set_xlim(-0.6, len(models) - 0.4)
        percent_axis(ax, 125.0)
        where = f"{horizon} horizon" if horizon else "every case"
        ax.set_title(f"Best explicit recovery strategy per model: {where}" + (f", r = {budget}" if budget else "")
                     + "\n(the maximum over the explicit strategies that ran; error bars: 95% Wilson interval)",
                     fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    return fig


def end_to_end(summary: Any) -> Figure:
    """Figure 8: Δ, the change in success against the same model's no-recovery episodes on the same (task, run)
    pairs, against the number of recoveries allowed; a line per (model, recovery mode)."""
    rows = [r for r in summary.end_to_end if r.mode != "none"]
    fig, [ax] = figure(7.5)
    lines = list(dict.fromkeys((r.model, r.mode) for r in rows))
    for model, mode in lines:
        points = sorted((r.max_recoveries, 100 * r.delta) for r in rows
                        if (r.model, r.mode) == (model, mode) and r.delta is not None)
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"{model} · {mode}")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ticks = sorted({r.max_recoveries for r in rows})
    ax.set_xticks(ticks or [1])
    ax.set_xlabel("recoveries allowed per episode")
    ax.set_ylabel("Δ success vs no recovery (points)")
    ax.grid(alpha=0.3)
    ax.set_title("End-to-end recovery: change in task success by recoveries allowed\n(paired on (task, run) with "
                 "the same model's episodes without recovery)", fontsize=10)
    if lines:
        ax.legend(fontsize=8, loc="best")
    return fig


def intention(summary: Any) -> Figure:
    """Figure 6 of a run's summary."""
    return intention_rows(summary.intention)


def intention_rows(rows: Sequence[IntentionRow]) -> Figure:
    """Figure 6: the recovery intention's scores per (model, strategy) as box plots, the mean marked."""
    fig, [ax] = figure(0.9 * len(rows) + 3)
    ax.boxplot([r.scores or [float("nan")] for r in rows], showmeans=True, widths=0.6)
    ax.set_xticks(range(1, len(rows) + 1), [f"{r.model}\n{r.strategy}\nn={len(r.scores)}" for r in rows], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("TF-IDF cosine with the recovery prompt")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Recovery intention: the agents' recovery rationales against the recovery prompt", fontsize=10)
    return fig
