"""Reports for people: a run's summary.md, and the merged report of several runs (``retrace report``).

A run is one results.jsonl. Runs are merged without letting one run's tests stand in for another's: a test's
first finished verdict is final *within* its run (stats._dedupe), while the same test in another run is a
new measurement. So every record is re-labelled with its run before the pooled summary is computed, and each
run — or each run index of a run made with ``--retrace-runs K`` — is one of the runs whose rates the report
averages: mean ± sample sd (n - 1) of the per-run rates, as the paper reports three-run results.

Models are compared in pairs that share a strategy and a budget, on matched trials where both finished (no
infrastructure error on either side). A trial is a case in a run at a run index, matched with the same trial
of the other model when the two models ran in the same run(s) ("same run"), or else, when they were run in
separate run directories, with the trial of the i-th run holding the other model, in the order the runs were
given ("run order"). The rate difference is over the matched trials. Significance is McNemar's exact test
(baseline.mcnemar_p) on *cases*: b counts the cases A recovered more often than B over their matched trials,
c the reverse, ties are dropped. With one run that is exactly McNemar's test on the discordant pairs; with
several runs it is the sign test on per-case differences, because the runs of one case are not independent
(a deterministic agent repeats itself) and counting each as a pair would overstate the evidence.

The same model × strategy × budget in two run directories is a before / after comparison (a changed prompt,
a new model version under the same config): the runs are paired the same way, on the cases and run indices
both finished, with the same per-case McNemar test. The report warns when runs cover different case sets,
and when a case's files changed between runs (the digests in their summary.json differ): rates across such
runs measure different things.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from dataclasses import field as _field
from pathlib import Path
from typing import Any

from pytest_retrace.results.baseline import mcnemar_p
from pytest_retrace.results.records import Record, RecordError
from pytest_retrace.results.session import read_records
from pytest_retrace.results.stats import BREAKDOWNS, _dedupe, pad_table, summarize, table_rows

_TITLES = {"domain": "By domain", "kind": "By kind of mistake", "horizon": "By horizon"}
# columns holding text, left-aligned in markdown; the numbers are right-aligned
_TEXT_COLUMNS = {"model", "strategy", "domain", "kind", "horizon", "A", "B", "pairing", "success@k", "per run",
                 "runs: mean ± sd", "95% CI", "shared (n)", "before", "after", "test", "verdict", "artifacts",
                 "what", ""}


class ReportError(ValueError):
    """A run that cannot be read; the message starts with the file."""


# -- summary.md of one run ---------------------------------------------------------------------------
def render_markdown(summary: dict[str, Any], title: str, plots: Sequence[str] = ()) -> str:
    """summary.md: the headline table per model × strategy × budget, the per-domain, per-kind and per-horizon
    tables, infrastructure errors, the gate's verdict if there was one, and ``plots`` (paths relative to the
    markdown file) as images."""
    out = [f"# {title}", ""]
    meta = summary.get("run") or {}
    facts = [f"{summary['n_records']} test(s)",
             f"{summary['n_errors']} infrastructure error(s), excluded from every rate"]
    if meta.get("env"):
        facts.append(f"env {meta['env']}")
    if meta.get("ssim_threshold") is not None:
        facts.append(f"R_O at SSIM ≥ {meta['ssim_threshold']}")
    out += ["; ".join(facts) + ".", ""]
    if summary.get("n_ignored_reruns"):
        out += [(f"{summary['n_ignored_reruns']} rerun(s) of tests that already had a verdict were ignored: a "
                 f"finished verdict is final within a run."), ""]
    if summary.get("n_verified_by_determinism"):
        out += [(f"{summary['n_verified_by_determinism']} finished test(s) of hidden-state cases declared "
                 f"`verified_by: determinism`: their error state is confirmed by its recording only "
                 f"(docs/cases.md)."), ""]
    out += _md_provenance(meta)
    out += ["## Recovery rate per model × strategy × budget", "", _md_table(table_rows(summary)), "",
            "rate = R_O ∧ R_TC on the finished tests; 95% CI: Wilson score interval, clustered by case where a "
            "case ran more than once (stats.cluster_wilson_interval); R_O, R_TC: each criterion "
            "alone" + ("; runs: mean ± sample sd of the per-run rates, success@k: at least one of k runs "
                       "recovers" if any(g.get("runs") for g in summary["groups"]) else "")
            + ("; shared: the rate on the cases no compared model errored on"
               if any(g.get("common_n") is not None for g in summary["groups"]) else "") + ".", ""]
    for by, key in BREAKDOWNS.items():
        if summary.get(key):
            out += [f"## {_TITLES[by]}", "", _md_table(table_rows(summary, by=by)), ""]
    if summary.get("error_kinds"):
        out += ["## Infrastructure errors", "", *(f"- {kind}: {n}" for kind, n in summary["error_kinds"].items()),
                ""]
    out += _md_failed(summary.get("failed") or [])
    gate = summary.get("gate")
    if gate:
        out += ["## Gate", "", "passed" if gate.get("passed") else "**FAILED**", "",
                *(f"- {p}" for p in gate.get("problems", [])),
                *(f"- note: {n}" for n in gate.get("notes", [])), ""]
    out += _md_plots(plots)
    return "\n".join(out).rstrip() + "\n"


def _md_provenance(meta: dict[str, Any]) -> list[str]:
    """The run's provenance (provenance.run_metadata) as a list; nothing for a summary without it."""
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
           f"- exit status: {meta.get('exitstatus', '-')}",
           "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
           f"- models: {'; '.join(models) or '-'}",
           f"- cases: {len(cases)}, their digests in summary.json's `run.cases`", ""]
    return out


def _md_failed(failed: list[dict[str, Any]]) -> list[str]:
    """The tests that did not recover or broke, with links to their artifacts (relative to the run directory,
    where summary.md lies)."""
    if not failed:
        return []
    rows = [["test", "verdict", "what", "artifacts"]]
    for f in failed:
        if f.get("error"):
            what = f"infrastructure error at {f['error']['stage']} ({f['error']['kind']})"
        else:
            ssim = "" if f.get("ssim") is None else f" (SSIM {f['ssim']:.4f})"
            what = f"R_O {_check(f.get('r_o'))}{ssim}, R_TC {_check(f.get('r_tc'))}"
        links = " · ".join(f"[{name}]({path})" for name, path in sorted((f.get("artifacts") or {}).items()))
        rows.append([f"`{f['nodeid'].split('::')[-1]}`", f["verdict"].replace("_", " "), what, links or "-"])
    return [f"## Failed tests ({len(failed)})", "", _md_table(rows), ""]


def _check(value: bool | None) -> str:
    return "not run" if value is None else "ok" if value else "failed"


def _md_plots(plots: Sequence[str]) -> list[str]:
    if not plots:
        return []
    out = ["## Plots", "", "Each figure also as PDF and SVG beside its PNG.", ""]
    for path in plots:
        out += [f"![{Path(path).stem}]({path})", ""]
    return out


def _md_table(rows: list[list[str]]) -> str:
    header, *body = rows
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    rule = "|" + "|".join(":---" if h in _TEXT_COLUMNS else "---:" for h in header) + "|"
    return "\n".join([line(header), rule, *map(line, body)])


# -- merging runs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunInfo:
    label: str
    path: Path  # its results.jsonl
    summary: dict[str, Any]  # summarize() of this run alone
    digests: dict[str, str | None]  # case id -> digest of its files, from the run's summary.json (if any)
    provenance: dict[str, Any] = _field(default_factory=dict)  # that summary.json's "run" (provenance.py)


@dataclass(frozen=True)
class PairedDiff:
    """Model A against model B under one strategy and budget, on their matched finished trials."""

    strategy: str
    budget: int
    model_a: str
    model_b: str
    pairing: str  # "same run" or "run order" (module docstring)
    pairs: int  # matched trials, both finished
    cases: int  # distinct cases among them
    rate_a: float | None
    rate_b: float | None
    b: int  # cases A recovered more often than B (one run: A recovered, B did not)
    c: int  # cases B recovered more often than A
    p_value: float  # McNemar's exact test on b and c

    @property
    def diff_points(self) -> float | None:
        if self.rate_a is None or self.rate_b is None:
            return None
        return 100 * (self.rate_a - self.rate_b)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["diff_points"] = self.diff_points
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}


@dataclass(frozen=True)
class RunDiff:
    """One model × strategy × budget in two runs, before (the run given first) and after, on their matched
    finished trials (same case, same run index)."""

    model: str
    strategy: str
    budget: int
    before: str  # run labels
    after: str
    pairs: int
    cases: int
    rate_before: float | None
    rate_after: float | None
    worse: int  # cases the before run recovered more often
    better: int  # cases the after run recovered more often
    p_value: float  # McNemar's exact test on worse and better

    @property
    def change_points(self) -> float | None:
        if self.rate_before is None or self.rate_after is None:
            return None
        return 100 * (self.rate_after - self.rate_before)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["change_points"] = self.change_points
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}


@dataclass(frozen=True)
class MergedReport:
    runs: list[RunInfo]
    units: list[str]  # the runs averaged over: a results.jsonl, or a run index of one (label:runK)
    summary: dict[str, Any]  # summarize() of all runs' records kept apart; each row adds "per_run" rates
    comparisons: list[PairedDiff]
    warnings: list[str]
    run_comparisons: list[RunDiff] = _field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [{"label": r.label, "path": str(r.path), "summary": r.summary} for r in self.runs],
                "units": self.units, "merged": self.summary,
                "comparisons": [c.to_dict() for c in self.comparisons],
                "run_comparisons": [c.to_dict() for c in self.run_comparisons], "warnings": self.warnings}


def results_path(run: Path) -> Path:
    """A run directory's results.jsonl; a path to a file is taken as the results file itself."""
    return run / "results.jsonl" if run.is_dir() else run


def find_run(run: str | Path, report_dir: Path | None = None) -> Path:
    """RUN as given (a run directory or a results.jsonl), else the run of that name under ``report_dir``.
    Raises :class:`ReportError` saying every place it looked, and which runs ``report_dir`` holds."""
    given = Path(run)
    tried = [given]
    if report_dir is not None and not given.is_absolute():
        tried.append(report_dir / given)
    for path in tried:
        if path.exists():
            return path
    looked = " and ".join(str(p) for p in tried)
    hint = ""
    if report_dir is not None:
        runs = sorted((d for d in report_dir.glob("*/results.jsonl")), key=lambda f: f.stat().st_mtime,
                      reverse=True) if report_dir.is_dir() else []
        names = [f.parent.name for f in runs[:8]]
        hint = (f"; {report_dir} holds no run" if not runs else
                f"; runs in {report_dir}: {', '.join(names)}{', ...' if len(runs) > 8 else ''}")
        if not report_dir.is_dir():
            hint = f"; {report_dir} does not exist (--report-dir)"
    raise ReportError(f"{run}: no such run: looked for {looked}{hint}")


def merge_runs(run_dirs: Sequence[str | Path], report_dir: Path | None = None) -> MergedReport:
    """Read each run's results.jsonl, summarise each alone and all together (module docstring). A RUN that is
    not a path is looked up under ``report_dir``. Raises :class:`ReportError` naming the file for a missing or
    unreadable results.jsonl, and the places it looked for a run it did not find."""
    paths: list[Path] = []
    warnings: list[str] = []
    for run in run_dirs:
        path = results_path(find_run(run, report_dir))
        if any(path.resolve() == p.resolve() for p in paths):
            warnings.append(f"{path} was given twice; it is counted once")
            continue
        paths.append(path)
    names = [p.parent.name if p.name == "results.jsonl" else p.stem for p in paths]
    labels = [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths)]
    runs: list[RunInfo] = []
    per_run: list[list[Record]] = []
    for label, path in zip(labels, paths):
        records = _read(path)
        if not records:
            warnings.append(f"{label}: {path} holds no records")
        warnings += _collisions(label, records)
        meta = _run_meta(path)
        runs.append(RunInfo(label, path, summarize(records), _digests(meta), meta))
        per_run.append(records)
    warnings += _case_sets(runs, per_run) + _changed_cases(runs)
    units: list[str] = []
    pooled: list[Record] = []
    for i, (label, records) in enumerate(zip(labels, per_run)):
        indices = sorted({r.run_index for r in records})
        unit_of = {}
        for index in indices:
            unit_of[index] = len(units)
            units.append(label if len(indices) == 1 else f"{label}:run{index}")
        # a test of this run is not the same test as in another run: only the run's own reruns dedupe
        pooled += [r.model_copy(update={"nodeid": f"{i}|{r.nodeid}", "run_index": unit_of[r.run_index]})
                   for r in records]
    summary = summarize(pooled)
    _add_per_run(summary, pooled, len(units))
    return MergedReport(runs, units, summary, _comparisons(per_run), warnings,
                        _run_comparisons(per_run, [r.label for r in runs]))


def _run_meta(results: Path) -> dict[str, Any]:
    """The ``run`` of the summary.json beside a results.jsonl; empty for a run without one (a bare results
    file, an interrupted run)."""
    try:
        meta = json.loads((results.parent / "summary.json").read_text(encoding="utf-8"))["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _digests(meta: dict[str, Any]) -> dict[str, str | None]:
    """Case digests of a run's provenance (provenance.case_digests); none from a version that did not record
    them."""
    try:
        return {case: entry.get("digest") for case, entry in meta.get("cases", {}).items()}
    except AttributeError:
        return {}


def _examples(cases: set[str], limit: int = 5) -> str:
    names = sorted(cases)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _case_sets(runs: list[RunInfo], per_run: list[list[Record]]) -> list[str]:
    """A warning for every run that lacks some of the cases the runs cover together: their rates are over
    different cases, and the mean across runs mixes them."""
    sets = [{r.case for r in records if r.case is not None} for records in per_run]
    if len(sets) < 2 or all(s == sets[0] for s in sets):
        return []
    union = set().union(*sets)
    return [f"runs cover different case sets: {run.label} lacks {len(union - cases)} of the {len(union)} cases "
            f"the runs cover ({_examples(union - cases)}); rates across these runs are over different cases"
            for run, cases in zip(runs, sets) if union - cases]


def _changed_cases(runs: list[RunInfo]) -> list[str]:
    """A warning per pair of runs whose shared case ids have different file digests."""
    out = []
    for a, b in itertools.combinations(runs, 2):
        changed = {c for c, d in a.digests.items() if d and b.digests.get(c) and b.digests[c] != d}
        if changed:
            out.append(f"{len(changed)} case(s) changed between runs {a.label} and {b.label} (their files' "
                       f"digests differ: {_examples(changed)}): the same case id is not the same case")
    return out


def _run_comparisons(per_run: list[list[Record]], labels: list[str]) -> list[RunDiff]:
    """Before / after: every model × strategy × budget that two runs both hold, paired on (run index, case)."""
    cells: dict[tuple[str, str, int], dict[int, Trials]] = {}
    for run, records in enumerate(per_run):
        for r in _dedupe(records)[0]:
            if not r.is_error:
                trials = cells.setdefault((r.model, r.strategy, r.budget), {}).setdefault(run, {})
                trials.setdefault((0, r.run_index, r.case), r.verdict == "recovered")
    out = []
    for (model, strategy, budget), by_run in sorted(cells.items()):
        for i, j in itertools.combinations(sorted(by_run), 2):
            pairs, cases, before, after, worse, better, p = _matched(by_run[i], by_run[j])
            out.append(RunDiff(model, strategy, budget, labels[i], labels[j], pairs, cases, before, after, worse,
                               better, p))
    return out


def _read(path: Path) -> list[Record]:
    try:
        return read_records(path)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (not a run directory?)") from None
    except OSError as exc:
        raise ReportError(f"{path}: {exc.strerror or exc}") from None
    except RecordError as exc:  # names the file and the line already
        raise ReportError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not a text file ({exc.reason})") from None


_IDENTITY = ("case", "task", "domain", "kind", "horizon")


def _collisions(label: str, records: list[Record]) -> list[str]:
    """Two case files behind one test id, or one case id under two test ids, within a run. The summary would
    fold the first into one test (the first finished verdict wins) and the comparison keys trials by case id,
    so either would merge two different measurements without a word."""
    out = []
    first: dict[str, Record] = {}
    ids: dict[tuple[Any, ...], list[str]] = {}
    warned: set[tuple[Any, ...]] = set()
    for r in records:
        seen = first.setdefault(r.nodeid, r)
        differ = [f"{f} {getattr(seen, f)!r} vs {getattr(r, f)!r}" for f in _IDENTITY
                  if getattr(seen, f) != getattr(r, f)]
        if differ and (r.nodeid, *(getattr(r, f) for f in _IDENTITY)) not in warned:
            warned.add((r.nodeid, *(getattr(r, f) for f in _IDENTITY)))
            out.append(f"{label}: test id {r.nodeid} belongs to two different case files ({'; '.join(differ)}); "
                       f"only its first finished verdict is counted")
        if r.case is not None:
            names = ids.setdefault((r.case, r.model, r.strategy, r.budget, r.run_index), [])
            if r.nodeid not in names:
                names.append(r.nodeid)
    for (case, model, strategy, budget, _), names in ids.items():
        if len(names) > 1:
            out.append(f"{label}: case id {case} ({model} {strategy} r={budget}) ran as {len(names)} tests "
                       f"({', '.join(names)}): two case files with the same id? Comparisons use the first")
    return out


def _add_per_run(summary: dict[str, Any], pooled: list[Record], units: int) -> None:
    """Each row's rate in each run (None where the run has no finished test of it), in ``units`` order."""
    unique, _ = _dedupe(pooled)
    counts: dict[tuple[Any, ...], list[int]] = {}
    for r in unique:
        if r.is_error:
            continue
        base = (r.model, r.strategy, r.budget)
        for key in (base, *((field, *base, getattr(r, field) or "") for field in BREAKDOWNS)):
            cell = counts.setdefault((*key, r.run_index), [0, 0])
            cell[0] += r.verdict == "recovered"
            cell[1] += 1

    def rates(key: tuple[Any, ...]) -> list[float | None]:
        cells = [counts.get((*key, u)) for u in range(units)]
        return [None if c is None else round(c[0] / c[1], 6) for c in cells]

    for g in summary["groups"]:
        g["per_run"] = rates((g["model"], g["strategy"], g["budget"]))
    for field, key in BREAKDOWNS.items():
        for g in summary[key]:
            g["per_run"] = rates((field, g["model"], g["strategy"], g["budget"], g.get(field) or ""))


Trials = dict[tuple[int, int, str | None], bool]  # (run, run index, case) -> recovered


def _comparisons(per_run: list[list[Record]]) -> list[PairedDiff]:
    cells: dict[tuple[str, int], dict[str, Trials]] = {}
    for run, records in enumerate(per_run):
        unique, _ = _dedupe(records)
        for r in unique:
            if not r.is_error:
                trials = cells.setdefault((r.strategy, r.budget), {}).setdefault(r.model, {})
                trials.setdefault((run, r.run_index, r.case), r.verdict == "recovered")
    return [_paired(strategy, budget, a, models[a], b, models[b])
            for (strategy, budget), models in sorted(cells.items())
            for a, b in itertools.combinations(sorted(models), 2)]


def _by_order(trials: Trials) -> Trials:
    rank = {run: i for i, run in enumerate(sorted({k[0] for k in trials}))}
    return {(rank[k[0]], k[1], k[2]): v for k, v in trials.items()}


def _paired(strategy: str, budget: int, model_a: str, a: Trials, model_b: str, b: Trials) -> PairedDiff:
    same = bool({k[0] for k in a} & {k[0] for k in b})
    if not same:
        a, b = _by_order(a), _by_order(b)
    return PairedDiff(strategy, budget, model_a, model_b, "same run" if same else "run order", *_matched(a, b))


def _matched(a: Trials, b: Trials) -> tuple[int, int, float | None, float | None, int, int, float]:
    """On the trials both finished: (pairs, cases, rate of a, rate of b, cases a recovered more often, cases b
    recovered more often, McNemar's exact p on those two counts)."""
    keys = sorted(set(a) & set(b), key=lambda k: (k[0], k[1], str(k[2])))
    wins: dict[str | None, list[int]] = {}
    for key in keys:
        w = wins.setdefault(key[2], [0, 0])
        w[0] += a[key]
        w[1] += b[key]
    better_a = sum(x > y for x, y in wins.values())
    better_b = sum(y > x for x, y in wins.values())
    return (len(keys), len(wins), sum(a[k] for k in keys) / len(keys) if keys else None,
            sum(b[k] for k in keys) / len(keys) if keys else None, better_a, better_b, mcnemar_p(better_a, better_b))


# -- rendering the merged report ---------------------------------------------------------------------
def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _mean_sd(g: dict[str, Any]) -> tuple[float | None, float | None]:
    rates = [x for x in g.get("per_run", []) if x is not None]
    if not rates:
        return None, None
    # the same as stats._repeated's rate_mean / rate_sd, also for a single run
    mean = math.fsum(rates) / len(rates)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in rates) / (len(rates) - 1)) if len(rates) > 1 else None
    return mean, sd


def merged_rows(merged: MergedReport, by: str | None = None) -> list[list[str]]:
    """Cells (header first) of the across-runs table, overall or by "domain", "kind" or "horizon"."""
    rows_in = merged.summary[BREAKDOWNS[by]] if by else merged.summary["groups"]
    repeated = len(merged.units) > 1
    header = ["model", "strategy", "r", *([by] if by else []), "runs", "n", "recovered",
              "rate % mean ± sd", *(["per run"] if repeated else []), "errors",
              *(["success@k"] if repeated and not by else [])]
    rows = [header]
    for g in rows_in:
        mean, sd = _mean_sd(g)
        finished = sum(x is not None for x in g.get("per_run", []))
        rows.append([
            g["model"], g["strategy"], str(g["budget"]), *([g.get(by) or "-"] if by else []), str(finished),
            str(g["n"]), str(g["recovered"]), "-" if mean is None else f"{_pct(mean)} ± {_pct(sd)}",
            *([" / ".join(_pct(x) for x in g.get("per_run", []))] if repeated else []), str(g["errors"]),
            *([" ".join(f"@{k} {_pct(v)}%" for k, v in (g.get("success_at") or {}).items()) or "-"]
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
        models = sorted({g["model"] for g in s["groups"]})
        extra = f", {s['n_ignored_reruns']} ignored rerun(s)" if s.get("n_ignored_reruns") else ""
        git = run.provenance.get("git") or {}
        made = "".join([f"; {run.provenance['started_at']}" if run.provenance.get("started_at") else "",
                        f", commit {git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}"
                        if git.get("commit") else ""])
        out.append(f"{run.label}: {run.path} — {s['n_records']} test(s), {s['n_errors']} error(s){extra}; "
                   f"models {', '.join(models) or '-'}{made}")
    return out


def _sections(merged: MergedReport) -> list[tuple[str, list[list[str]] | None, str]]:
    """(title, table or None, note) in report order."""
    out: list[tuple[str, list[list[str]] | None, str]] = [
        (f"Across {len(merged.units)} run(s)", merged_rows(merged), _ACROSS)]
    for by, key in BREAKDOWNS.items():
        if merged.summary[key]:
            out.append((_TITLES[by], merged_rows(merged, by), ""))
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
            out += [_md_table(table), ""]
        if note:
            out += [note[0].upper() + note[1:] + ".", ""]
    kinds = merged.summary["error_kinds"]
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
    kinds = merged.summary["error_kinds"]
    if kinds:
        out += ["", "infrastructure errors (excluded from rates): "
                + ", ".join(f"{k}: {n}" for k, n in kinds.items())]
    if merged.warnings:
        out += ["", *(f"warning: {w}" for w in merged.warnings)]
    return "\n".join(out)
