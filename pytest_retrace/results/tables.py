"""The summary's tables as rows of text cells: the plain-text table of ``retrace summary`` and the end of a run,
and the cells report.py renders as markdown."""

from __future__ import annotations

from pytest_retrace.results.best import BestExplicitRow
from pytest_retrace.results.endtoend import EndToEndRow
from pytest_retrace.results.forward import ForwardRow
from pytest_retrace.results.intention import IntentionRow
from pytest_retrace.results.sets import EvaluationSet, SetRow
from pytest_retrace.results.stats import Row, Statistics
from pytest_retrace.results.success import SuccessRow


def _spread(g: Row) -> str:
    if g.rate_mean is None:
        return "-"
    sd = "-" if g.rate_sd is None else f"{100 * g.rate_sd:.1f}"
    return f"{100 * g.rate_mean:.1f} ± {sd} ({g.runs})"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_table(summary: Statistics, *, by_domain: bool = False, by: str | None = None) -> str:
    """Fixed-width plain-text table of a summary (results.summary.Summary, or the statistics of
    :func:`~pytest_retrace.results.stats.summarize`); ``'-'`` marks missing values. The ``shared`` column
    (several models only) is each rate on the cases no compared model errored on. ``by`` ("domain", "kind" or
    "horizon") gives that breakdown; ``by_domain=True`` is ``by="domain"``."""
    return pad_table(table_rows(summary, by="domain" if by_domain else by))


def pad_table(rows: list[list[str]]) -> str:
    """Rows of cells (the first the header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def table_rows(summary: Statistics, *, by: str | None = None) -> list[list[str]]:
    """The cells of :func:`format_table` (header first), for other renderings of the same table (report.py)."""
    rows_in = summary.rows(by)
    shared = any(g.common_n is not None for g in rows_in)
    costly = any(g.calls for g in rows_in)
    repeated = any(g.runs for g in rows_in)
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
        ci = "-" if g.rate is None else f"[{100 * g.ci_low:.1f}, {100 * g.ci_high:.1f}]"
        rows.append(
            [
                g.model,
                g.strategy,
                "-" if g.budget is None else str(g.budget),
                *([g.category(by) or "-"] if by else []),
                str(g.n),
                str(g.recovered),
                _pct(g.rate),
                ci,
                _pct(g.r_o_rate),
                _pct(g.r_tc_rate),
                str(g.errors),
                *([_spread(g), " ".join(f"@{k} {_pct(v)}" for k, v in (g.success_at or {}).items()) or "-"]
                  if repeated else []),
                *(["-" if g.common_n is None else f"{_pct(g.common_rate)} ({g.common_n})"] if shared else []),
                *([str(g.calls), "-" if g.cost is None else f"${g.cost:.2f}"] if costly else []),
            ]
        )
    return rows


def forward_cells(rows: list[ForwardRow]) -> list[list[str]]:
    """A forward run's rows (summary.forward): success rate with its 95 % interval per (model, max steps)."""
    repeated = any(r.runs > 1 for r in rows)
    header = ["model", "max steps", "tasks", "n", "solved", "rate", "95% CI", "mean steps (solved)", "errors"]
    out = [header + (["sd across runs"] if repeated else [])]
    for r in rows:
        ci = "-" if r.ci_low is None or r.ci_high is None else f"{100 * r.ci_low:.1f}–{100 * r.ci_high:.1f}"
        cells = [r.model, str(r.max_steps), str(r.tasks), str(r.n), str(r.solved), _pct(r.rate), ci,
                 "-" if r.mean_steps is None else f"{r.mean_steps:g}", str(r.errors)]
        out.append(cells + ([("-" if r.rate_sd is None else f"{100 * r.rate_sd:.1f}")] if repeated else []))
    return out


def format_forward(rows: list[ForwardRow]) -> str:
    return pad_table(forward_cells(rows))


def success_cells(rows: list[SuccessRow], *, domains: bool = False) -> list[list[str]]:
    """The ideal-recovery rows (summary.ideal_recovery): Success@K per (model, condition), with its 95 %
    bootstrap interval at the largest K; ``domains``: the per-domain rows instead of the overall ones."""
    rows = [r for r in rows if (r.domain is not None) == domains]
    samples = max((r.samples for r in rows), default=0)
    header = ["model", "R", *(["domain"] if domains else []), "instances", "mean R", "excluded", "errors",
              *(f"S@{k}" for k in range(1, samples + 1)), f"95% CI @{samples}"]
    out = [header]
    for r in rows:
        last = r.samples - 1
        ci = "-" if r.ci_low[last] is None or r.ci_high[last] is None else \
            f"{100 * r.ci_low[last]:.1f}–{100 * r.ci_high[last]:.1f}"
        cells = [r.model, r.condition, *([r.domain or "-"] if domains else []), str(r.instances),
                 "-" if r.mean_step is None else f"{r.mean_step:g}", str(r.excluded), str(r.errors),
                 *(_pct(r.success[k]) if k < len(r.success) else "-" for k in range(samples)), ci]
        out.append(cells)
    return out


def format_success(rows: list[SuccessRow]) -> str:
    return pad_table(success_cells(rows))


def end_to_end_cells(rows: list[EndToEndRow]) -> list[list[str]]:
    """End-to-end recovery's rows (summary.end_to_end): success with and without recovery per (model, mode,
    max recoveries), Δ against the same model's `none` on the same (task, run) pairs, and what the recoveries did."""
    repeated = any(r.runs > 1 for r in rows)
    header = ["model", "recovery", "max", "n", "solved", "rate", "95% CI", "Δ vs none", "rescued", "derailed",
              "recoveries", "reached s_R", "errors"] + (["sd across runs"] if repeated else [])
    out = [header]
    for r in rows:
        ci = "-" if r.ci_low is None or r.ci_high is None else f"{100 * r.ci_low:.1f}–{100 * r.ci_high:.1f}"
        delta = "-" if r.delta is None else f"{100 * r.delta:+.1f} ({r.paired})"
        cells = [r.model, r.mode, "-" if r.mode == "none" else str(r.max_recoveries), str(r.n), str(r.solved),
                 _pct(r.rate), ci, delta, str(r.rescued), str(r.derailed), str(r.recoveries),
                 f"{r.reached}/{r.recoveries}" if r.recoveries else "-", str(r.errors)]
        out.append(cells + ([("-" if r.rate_sd is None else f"{100 * r.rate_sd:.1f}")] if repeated else []))
    return out


def format_end_to_end(rows: list[EndToEndRow]) -> str:
    return pad_table(end_to_end_cells(rows))


def best_cells(rows: list[BestExplicitRow]) -> list[list[str]]:
    """The best explicit strategy per (model, budget, horizon) (results.best, the paper's Figure 7) beside the
    model's implicit rate on the same cases."""
    out = [["model", "r", "horizon", "best explicit", "rate", "95% CI", "n", "of", "implicit", "basis"]]
    for r in rows:
        out.append([r.model, "-" if r.budget is None else str(r.budget), "all" if r.horizon is None else r.horizon or "-", r.strategy,
                    _pct(r.rate), f"{100 * r.ci_low:.1f}–{100 * r.ci_high:.1f}", str(r.n), str(len(r.compared)),
                    "-" if r.implicit_rate is None else f"{_pct(r.implicit_rate)} ({r.implicit_n})", r.basis])
    return out


def set_cells(sets: list[EvaluationSet], rows: list[SetRow]) -> list[list[str]]:
    """Each cell's rate on each evaluation set (results.sets, the paper's Table 8) and their mean ± sd."""
    out = [["model", "strategy", "r", *(f"{s.label} (n)" for s in sets), "mean ± sd over sets"]]
    for r in rows:
        spread = "-" if r.mean is None else f"{_pct(r.mean)} ± {'-' if r.sd is None else f'{100 * r.sd:.1f}'}"
        out.append([r.model, r.strategy, str(r.budget),
                    *(f"{_pct(x)} ({n})" for x, n in zip(r.rates, r.n)), spread])
    return out


def intention_cells(rows: list[IntentionRow]) -> list[list[str]]:
    """Recovery intention (results.intention, the paper's Figure 6): the TF-IDF cosine of each model's recovery
    rationales with the recovery prompt, per strategy."""
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    out = [["model", "strategy", "compared with", "tests", "silent", "mean", "sd", "median", "q1–q3"]]
    for r in rows:
        out.append([r.model, r.strategy, " + ".join(r.reference), str(r.tests), str(r.silent), f(r.mean), f(r.sd),
                    f(r.median), f"{f(r.q1)}–{f(r.q3)}"])
    return out
