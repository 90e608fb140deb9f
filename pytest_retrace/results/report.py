"""Reports for people, rendered: a run's summary.md, and the merged report of several runs (``retrace report``)
in markdown (report.md) and as plain text for the terminal. What they show is computed elsewhere: the summary by
:mod:`.stats`, the merged runs by :mod:`.merge`, the paired comparisons by :mod:`.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from pytest_retrace.results.best import best_explicit_rows
from pytest_retrace.results.merge import MergedReport
from pytest_retrace.results.stats import BREAKDOWNS, Row
from pytest_retrace.results.summary import FailedTest, RunInfo, Summary
from pytest_retrace.results.tables import (
    best_cells,
    end_to_end_cells,
    forward_cells,
    intention_cells,
    pad_table,
    set_cells,
    success_cells,
    table_rows,
)

_TITLES = {"domain": "By domain", "kind": "By kind of mistake", "horizon": "By horizon"}
# columns holding text, left-aligned in markdown; the numbers are right-aligned
_TEXT_COLUMNS = {"model", "strategy", "domain", "kind", "horizon", "A", "B", "pairing", "success@k", "per run",
                 "runs: mean ± sd", "95% CI", "shared (n)", "before", "after", "test", "verdict", "artifacts",
                 "what", "best explicit", "basis", "compared with", "q1–q3", ""}
_BEST = ("the explicit strategy with the highest rate per model (the paper's Figure 7; its figure is the long "
         "horizon), over the strategies that finished a test (of); basis shared: on the cases every compared "
         "model (under --retrace-protocol=paper: every model and strategy) finished, else all; implicit: the same "
         "model's implicit rate on that basis. A maximum over several rates is biased upwards")

# -- summary.md of one run ---------------------------------------------------------------------------
def render_markdown(summary: Summary, title: str, plots: Sequence[str] = ()) -> str:
    """summary.md: the headline table per model × strategy × budget, the per-domain, per-kind and per-horizon
    tables, infrastructure errors, the gate's verdict if there was one, and ``plots`` (paths relative to the
    markdown file) as images."""
    out = [f"# {title}", ""]
    run = summary.run
    if summary.end_to_end:  # --retrace-experiment=end-to-end: success with and without recovery
        rows = summary.end_to_end
        errors = sum(r.errors for r in rows)
        out += [f"End-to-end recovery: each task solved from its initial state with the error detector asked after "
                f"every forward step and a recovery on each detection; {errors} infrastructure error(s), excluded "
                f"from every rate.", ""]
        out += _md_provenance(run)
        out += ["## Success rate with and without recovery", "", md_table(end_to_end_cells(rows)), "",
                "rate = the task's evaluator passed; 95% CI: Wilson score interval; Δ vs none: the rate difference "
                "with the same model's `none` episodes on the same (task, run) pairs (how many); rescued / "
                "derailed: pairs solved only with / only without recovery; reached s_R: restores whose screen "
                "matched the recorded one of step R (R_O).", ""]
        return "\n".join(out).rstrip() + "\n"
    if summary.ideal_recovery:  # --retrace-experiment=ideal-recovery: Success@K per condition
        rows = summary.ideal_recovery
        errors = sum(r.errors for r in rows if r.domain is None)
        out += [f"Ideal recovery: {rows[0].samples} continuation(s) of the forward agent from each annotated "
                f"episode's state after R steps, per condition; {errors} continuation(s) excluded (their prefix "
                f"did not reproduce, or another infrastructure error).", ""]
        out += _md_provenance(run)
        out += ["## Success@K per condition", "", md_table(success_cells(rows)), "",
                "S@K: the unbiased estimate of at least one of K continuations solving the task (1 - C(n-c, K) / "
                "C(n, K) per instance), averaged over instances; 95% CI: percentile bootstrap over instances; "
                "excluded: instances none of whose continuations reached the state of step R.", "",
                "## Success@K per domain", "", md_table(success_cells(rows, domains=True)), ""]
        for plot in plots:
            out += [f"![{Path(plot).stem}]({plot})", ""]
        return "\n".join(out).rstrip() + "\n"
    if summary.forward:  # a forward run (--retrace-experiment=forward): its own table, no recovery rates
        errors = sum(r.errors for r in summary.forward)
        out += [f"Forward run: each task solved from its initial state in at most {summary.forward[0].max_steps} "
                f"step(s); {errors} infrastructure error(s), excluded from every rate.", ""]
        out += _md_provenance(run)
        out += ["## Success rate per model", "", md_table(forward_cells(summary.forward)), "",
                "rate = the task's evaluator passed; 95% CI: Wilson score interval; the episodes are in "
                "trajectories/ (OSWorld's results layout).", ""]
        return "\n".join(out).rstrip() + "\n"
    facts = [f"{summary.n_records} test(s)", f"{summary.n_errors} infrastructure error(s), excluded from every rate"]
    if run.env:
        facts.append(f"env {run.env}")
    facts.append(f"R_O at SSIM ≥ {run.ssim_threshold}")
    out += ["; ".join(facts) + ".", ""]
    if summary.n_ignored_reruns:
        out += [(f"{summary.n_ignored_reruns} rerun(s) of tests that already had a verdict were ignored: a "
                 f"finished verdict is final within a run."), ""]
    if summary.n_verified_by_determinism:
        out += [(f"{summary.n_verified_by_determinism} finished test(s) of hidden-state cases declared "
                 f"`verified_by: determinism`: their error state is confirmed by its recording only "
                 f"(docs/cases.md)."), ""]
    out += _md_provenance(run)
    out += ["## Recovery rate per model × strategy × budget", "", md_table(table_rows(summary)), "",
            "rate = R_O ∧ R_TC on the finished tests; 95% CI: Wilson score interval, clustered by case where a "
            "case ran more than once (intervals.cluster_wilson_interval); R_O, R_TC: each criterion "
            "alone" + ("; runs: mean ± sample sd of the per-run rates, success@k: at least one of k runs "
                       "recovers" if any(g.runs for g in summary.groups) else "")
            + ("; shared: the rate on the cases no compared model errored on"
               if any(g.common_n is not None for g in summary.groups) else "") + ".", ""]
    for by in BREAKDOWNS:
        if summary.rows(by):
            out += [f"## {_TITLES[by]}", "", md_table(table_rows(summary, by=by)), ""]
    best = best_explicit_rows(summary)
    if best:
        out += ["## Best explicit strategy per model", "", md_table(best_cells(best)), "", _BEST[0].upper() + _BEST[1:] + ".", ""]
    if summary.intention:
        out += ["## Recovery intention", "", md_table(intention_cells(summary.intention)), "",
                "The TF-IDF cosine (scikit-learn, English stop words removed, sublinear tf) of each test's recovery "
                "rationales with the recovery prompt its model config reads (implicit: explicit-0E's), one "
                "vocabulary for the run; silent: tests whose agent explained nothing, not scored (the paper's "
                "Figure 6; docs/validation.md).", ""]
    if summary.error_kinds:
        out += ["## Infrastructure errors", "", *(f"- {kind}: {n}" for kind, n in summary.error_kinds.items()), ""]
    out += _md_failed(summary.failed)
    gate = summary.gate
    if gate is not None:
        out += ["## Gate", "", "passed" if gate.passed else "**FAILED**", "",
                *(f"- {p}" for p in gate.problems), *(f"- note: {n}" for n in gate.notes), ""]
    out += _md_plots(plots)
    return "\n".join(out).rstrip() + "\n"


def _md_provenance(run: RunInfo) -> list[str]:
    """The run's provenance (provenance.run_metadata) as a list; nothing for a summary without it."""
    meta = run.provenance
    if not meta.get("started_at"):
        return []
    git = meta.get("git")
    commit = "not a git checkout" if not git else git["commit"] + (" (with uncommitted changes)" if git.get("dirty")
                                                                   else "")
    versions = meta.get("versions") or {}
    models = [f"{m['name']} ({m['provider']}" + (f", model {m['model']}" if m.get("model") else "")
              + (f", config {m['config_digest'][:19]}" if m.get("config_digest") else "") + ")"
              for m in meta.get("model_configs") or []]
    cases = meta.get("cases") or {}
    out = ["## Run", "",
           f"- date: {meta['started_at']} to {meta.get('finished_at', '-')} (UTC)",
           f"- commit: {commit}",
           f"- command: `{' '.join(meta.get('command') or [])}`",
           f"- exit status: {run.exitstatus}",
           "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
           f"- models: {'; '.join(models) or '-'}",
           f"- cases: {len(cases)}, their digests in summary.json's `run.cases`", ""]
    return out


def _md_failed(failed: list[FailedTest]) -> list[str]:
    """The tests that did not recover or broke, with links to their artifacts (relative to the run directory,
    where summary.md lies)."""
    if not failed:
        return []
    rows = [["test", "verdict", "what", "artifacts"]]
    for f in failed:
        if f.error is not None:
            what = f"infrastructure error at {f.error.stage} ({f.error.kind})"
        else:
            ssim = "" if f.ssim is None else f" (SSIM {f.ssim:.4f})"
            what = f"R_O {_check(f.r_o)}{ssim}, R_TC {_check(f.r_tc)}"
        links = " · ".join(f"[{name}]({path})" for name, path in sorted(f.artifacts.items()))
        rows.append([f"`{f.nodeid.split('::')[-1]}`", f.verdict.replace("_", " "), what, links or "-"])
    return [f"## Failed tests ({len(failed)})", "", md_table(rows), ""]


def _check(value: bool | None) -> str:
    return "not run" if value is None else "ok" if value else "failed"


def _md_plots(plots: Sequence[str]) -> list[str]:
    if not plots:
        return []
    out = ["## Plots", "", "Each figure also as PDF and SVG beside its PNG.", ""]
    for path in plots:
        out += [f"![{Path(path).stem}]({path})", ""]
    return out


def md_table(rows: list[list[str]]) -> str:
    header, *body = rows
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    rule = "|" + "|".join(":---" if h in _TEXT_COLUMNS else "---:" for h in header) + "|"
    return "\n".join([line(header), rule, *map(line, body)])

# -- rendering the merged report ---------------------------------------------------------------------
def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _mean_sd(g: Row) -> tuple[float | None, float | None]:
    rates = [x for x in g.per_run or [] if x is not None]
    if not rates:
        return None, None
    # the same as stats._repeated's rate_mean / rate_sd, also for a single run
    mean = math.fsum(rates) / len(rates)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in rates) / (len(rates) - 1)) if len(rates) > 1 else None
    return mean, sd


def merged_rows(merged: MergedReport, by: str | None = None) -> list[list[str]]:
    """Cells (header first) of the across-runs table, overall or by "domain", "kind" or "horizon"."""
    rows_in = merged.summary.rows(by)
    repeated = len(merged.units) > 1
    header = ["model", "strategy", "r", *([by] if by else []), "runs", "n", "recovered",
              "rate % mean ± sd", *(["per run"] if repeated else []), "errors",
              *(["success@k"] if repeated and not by else [])]
    rows = [header]
    for g in rows_in:
        mean, sd = _mean_sd(g)
        per_run = g.per_run or []
        finished = sum(x is not None for x in per_run)
        rows.append([
            g.model, g.strategy, str(g.budget), *([g.category(by) or "-"] if by else []), str(finished),
            str(g.n), str(g.recovered), "-" if mean is None else f"{_pct(mean)} ± {_pct(sd)}",
            *([" / ".join(_pct(x) for x in per_run)] if repeated else []), str(g.errors),
            *([" ".join(f"@{k} {_pct(v)}%" for k, v in (g.success_at or {}).items()) or "-"]
              if repeated and not by else []),
        ])
    return rows


def run_comparison_rows(merged: MergedReport) -> list[list[str]]:
    rows = [["model", "strategy", "r", "before", "after", "pairs", "cases", "before %", "after %",
             "after − before (points)", "worse", "better", "p"]]
    for c in merged.run_comparisons:
        change = c.change_points
        rows.append([c.model, c.strategy, str(c.budget), c.before, c.after, str(c.pairs), str(c.cases),
                     _pct(c.rate_before), _pct(c.rate_after), "-" if change is None else f"{change:+.1f}",
                     str(c.worse), str(c.better), f"{c.p_value:.4f}"])
    return rows


def comparison_rows(merged: MergedReport) -> list[list[str]]:
    rows = [["strategy", "r", "A", "B", "pairs", "cases", "A %", "B %", "A − B (points)", "b", "c", "p", "pairing"]]
    for c in merged.comparisons:
        diff = c.diff_points
        rows.append([c.strategy, str(c.budget), c.model_a, c.model_b, str(c.pairs), str(c.cases), _pct(c.rate_a),
                     _pct(c.rate_b), "-" if diff is None else f"{diff:+.1f}", str(c.b), str(c.c),
                     f"{c.p_value:.4f}", c.pairing])
    return rows


_ACROSS = ("mean ± sample sd (n - 1) of the per-run rates, infrastructure errors excluded; a run is a "
           "results.jsonl, or a run index of one")
_PAIRED = ("matched finished trials of two models under the same strategy and budget; b (c): cases A (B) "
           "recovered more often; p: McNemar's exact test on b and c")


_BEFORE_AFTER = ("the same model, strategy and budget in two runs (before: the run given first), on the trials "
                 "both finished (same case and run index); worse (better): cases the after run recovered less "
                 "(more) often; p: McNemar's exact test on worse and better")


def _run_lines(merged: MergedReport) -> list[str]:
    out = []
    for run in merged.runs:
        s = run.summary
        models = sorted({g.model for g in s.groups})
        extra = f", {s.n_ignored_reruns} ignored rerun(s)" if s.n_ignored_reruns else ""
        git = run.provenance.get("git") or {}
        made = "".join([f"; {run.provenance['started_at']}" if run.provenance.get("started_at") else "",
                        f", commit {git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}"
                        if git.get("commit") else ""])
        out.append(f"{run.label}: {run.path} — {s.n_records} test(s), {s.n_errors} error(s){extra}; "
                   f"models {', '.join(models) or '-'}{made}")
    return out


def _sections(merged: MergedReport) -> list[tuple[str, list[list[str]] | None, str]]:
    """(title, table or None, note) in report order."""
    out: list[tuple[str, list[list[str]] | None, str]] = [
        (f"Across {len(merged.units)} run(s)", merged_rows(merged), _ACROSS)]
    for by in BREAKDOWNS:
        if merged.summary.rows(by):
            out.append((_TITLES[by], merged_rows(merged, by), ""))
    best = best_explicit_rows(merged.summary)
    if best:
        out.append(("Best explicit strategy per model", best_cells(best), _BEST))
    if merged.sets:
        runs = "; ".join(f"{s.label}: {s.cases} cases, {', '.join(s.runs)}" for s in merged.sets)
        out.append(("Per evaluation set", set_cells(merged.sets, merged.set_rows),
                    f"the runs cover {len(merged.sets)} different case sets ({runs}); each set's rate pools its "
                    f"runs, infrastructure errors excluded; mean ± sample sd over the sets, as the paper's Table 8"))
    out.append(("Model comparison (paired)", comparison_rows(merged) if merged.comparisons else None,
                _PAIRED if merged.comparisons else "no two models share a strategy and budget: nothing to pair"))
    if merged.run_comparisons:
        out.append(("Run comparison (before / after, paired)", run_comparison_rows(merged), _BEFORE_AFTER))
    return out


def render_report(merged: MergedReport, *, title: str = "pytest-retrace report", plots: Sequence[str] = ()) -> str:
    """The merged report in markdown (report.md of ``retrace report --out``)."""
    out = [f"# {title}", "", "## Runs", "", *(f"- {line}" for line in _run_lines(merged)), ""]
    if merged.warnings:
        out += ["## Warnings", "", *(f"- {w}" for w in merged.warnings), ""]
    for name, table, note in _sections(merged):
        out += [f"## {name}", ""]
        if table is not None:
            out += [md_table(table), ""]
        if note:
            out += [note[0].upper() + note[1:] + ".", ""]
    kinds = merged.summary.error_kinds
    if kinds:
        out += ["## Infrastructure errors", "", *(f"- {k}: {n}" for k, n in kinds.items()), ""]
    out += _md_plots(plots)
    return "\n".join(out).rstrip() + "\n"


def format_report(merged: MergedReport) -> str:
    """The merged report as plain text for the terminal."""
    out = ["runs:", *(f"  {line}" for line in _run_lines(merged))]
    for name, table, note in _sections(merged):
        out += ["", name.lower()]
        if table is not None:
            out.append(pad_table(table))
        if note:
            out.append(f"  ({note})")
    kinds = merged.summary.error_kinds
    if kinds:
        out += ["", "infrastructure errors (excluded from rates): "
                + ", ".join(f"{k}: {n}" for k, n in kinds.items())]
    if merged.warnings:
        out += ["", *(f"warning: {w}" for w in merged.warnings)]
    return "\n".join(out)
