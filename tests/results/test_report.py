"""Reports: the kind / horizon breakdowns, summary.md, merged runs (mean ± sd, paired comparisons), the plots,
the writers and ``retrace report``. No desktop: records are written by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from pytest_retrace import cli
from pytest_retrace.results.merge import merge_runs
from pytest_retrace.results.plotkit import FORMATS, PlotError
from pytest_retrace.results.plots import PLOTS, write_plots
from pytest_retrace.results.records import Failure, Record
from pytest_retrace.results.report import format_report, render_markdown, render_report
from pytest_retrace.results.stats import Row, summarize
from pytest_retrace.results.summary import GateVerdict, RunInfo, Summary, build_summary
from pytest_retrace.results.tables import format_table
from pytest_retrace.results.writers import Plots, SummaryJson, SummaryMarkdown
from tests.helpers import REPO

pytest_plugins = ["pytester"]  # the real run at the end

VERDICTS = {"R": "recovered", "F": "not_recovered", "E": "error"}


def rec(case: str, v: str, *, model: str = "m", strategy: str = "implicit", budget: int = 10, run_index: int = 0,
        domain: str = "files", kind: str | None = "visible", horizon: str | None = "short",
        nodeid: str | None = None, task: str | None = None) -> Record:
    """A record as the plugin writes it; ``v`` is R (recovered), F (not recovered) or E (infrastructure error)."""
    verdict = VERDICTS[v]
    return Record(
        nodeid=nodeid or f"cases/{domain}/{case}.yaml::test_recovery[{case}-{model}-{strategy}-r{budget}-run{run_index}]",
        case=case, task=task or f"task-{case}", domain=domain, horizon=horizon, kind=kind, model=model,
        strategy=strategy, budget=budget, run_index=run_index, finished_at="2026-12-01T00:00:00+00:00",
        verdict=verdict, recovered=None if v == "E" else v == "R", r_o=None if v == "E" else True,
        r_tc=None if v == "E" else v == "R", error=Failure(stage="reset", kind="env", message="-") if v == "E" else None,
    )


def write_run(run_dir: Path, records: list[Record]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    return run_dir


def row(rows: list[Row], **match: Any) -> Row:
    [found] = [r for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    return found


def run_summary(records: list[Record]) -> Summary:
    """The typed summary the plugin hands its summary writers, for a run of these records."""
    run = RunInfo(models=sorted({r.model for r in records}), env="xvfb", budgets=[10], ssim_threshold=0.99,
                  exitstatus=0)
    return build_summary(records, run)


class _Config:
    """What the writers use of pytest.Config: the plugin manager, here without a terminal reporter."""

    class pluginmanager:  # mirrors config.pluginmanager
        @staticmethod
        def get_plugin(name: str) -> None:
            return None


# --- breakdowns by kind and horizon -----------------------------------------------------------------


def test_summary_breaks_rates_down_by_kind_and_horizon() -> None:
    records = [
        rec("a", "R", kind="visible", horizon="short"), rec("b", "F", kind="visible", horizon="long"),
        rec("c", "R", kind="subtle", horizon="long"), rec("d", "E", kind="subtle", horizon="long"),
        rec("e", "F", kind="visual-only", horizon="short"), rec("f", "R", kind=None, horizon=None),
        rec("a", "F", model="n", kind="visible", horizon="short"),
    ]
    s = summarize(records)
    # listed from the most to the least visible mistake, a case without a kind last; one model after the other
    assert [(k.model, k.kind) for k in s.kinds] == [
        ("m", "visible"), ("m", "subtle"), ("m", "visual-only"), ("m", ""), ("n", "visible")]
    visible, subtle = row(s.kinds, model="m", kind="visible"), row(s.kinds, model="m", kind="subtle")
    assert (visible.n, visible.recovered, visible.rate, visible.errors) == (2, 1, 0.5, 0)
    assert (subtle.n, subtle.recovered, subtle.rate, subtle.errors) == (1, 1, 1.0, 1)
    assert subtle.ci_low == pytest.approx(0.206549, abs=1e-6)  # Wilson 1/1
    short, long = row(s.horizons, model="m", horizon="short"), row(s.horizons, model="m", horizon="long")
    assert [h.horizon for h in s.horizons if h.model == "m"] == ["short", "long", ""]
    assert (short.n, short.recovered, long.n, long.recovered, long.errors) == (2, 1, 2, 1, 1)
    # the kind / horizon keys exist only in their own breakdown: groups and domains rows keep their keys
    assert "kind" not in s.groups[0].model_dump() and "horizon" not in s.domains[0].model_dump()
    assert "horizon" not in visible.model_dump()
    assert visible.domain is None and visible.common_n == 1  # compared with n, which ran a only
    table = format_table(s, by="kind").splitlines()
    assert table[0].split()[:4] == ["model", "strategy", "r", "kind"]
    assert table[1].split()[:8] == ["m", "implicit", "10", "visible", "2", "1", "50.0%", "[9.5,"]
    assert format_table(s, by="domain") == format_table(s, by_domain=True)
    with pytest.raises(ValueError, match="no breakdown by 'task'"):
        format_table(s, by="task")


# --- summary.md -------------------------------------------------------------------------------------


def markdown_tables(text: str) -> list[list[str]]:
    tables: list[list[str]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    return tables


def test_summary_md_holds_every_table_errors_and_plots() -> None:
    records = [rec("a", "R"), rec("b", "F", kind="hidden-state", horizon="long", domain="sheets"), rec("c", "E")]
    text = render_markdown(run_summary(records), "run 42", plots=["plots/rates.png", "plots/kinds.png"])
    assert text.startswith("# run 42\n\n3 test(s); 1 infrastructure error(s), excluded from every rate; env xvfb; "
                           "R_O at SSIM ≥ 0.99.\n")
    for heading in ("## Recovery rate per model × strategy × budget", "## By domain", "## By kind of mistake",
                    "## By horizon", "## Infrastructure errors", "## Failed tests (2)", "## Plots"):
        assert f"\n{heading}\n" in text
    assert "| m | implicit | 10 | 2 | 1 | 50.0% | [9.5, 90.5] | 100.0% | 50.0% | 1 |" in text
    assert "| m | implicit | 10 | hidden-state | 1 | 0 | 0.0% | [0.0, 79.3] |" in text
    assert "| m | implicit | 10 | long | 1 | 0 | 0.0% |" in text
    assert "- env: 1" in text and "![rates](plots/rates.png)" in text and "![kinds](plots/kinds.png)" in text
    tables = markdown_tables(text)
    assert len(tables) == 5  # the rates, by domain, kind and horizon, and the failed tests
    for table in tables:  # a header, its rule, rows: every line with as many cells as the header
        assert len(table) >= 3 and set(table[1]) <= set("|:-")
        assert {line.count("|") for line in table} == {table[0].count("|")}


def test_summary_md_shows_repeated_runs_and_the_gate() -> None:
    records = [rec("a", "R", run_index=0), rec("a", "F", run_index=1)]
    gate = GateVerdict(passed=False, problems=["m implicit r=10: too low"], notes=[], strict=False)
    text = render_markdown(run_summary(records).gated(gate), "t")
    assert "| runs: mean ± sd | success@k |" in text and "| 50.0 ± 70.7 (2) | @1 50.0% @2 100.0% |" in text
    assert "**FAILED**\n\n- m implicit r=10: too low" in text and "## Plots" not in text


# --- merging runs -----------------------------------------------------------------------------------


def three_runs(tmp_path: Path) -> list[Path]:
    """Cases a, b (files) and c, d (sheets), the same tests in three run directories:
    run1: a R b R c R d F -> 3/4;  run2: a R b F c E d E -> 1/2;  run3: a R b R c F d F -> 2/4."""
    plan = ["RRRF", "RFEE", "RRFF"]
    return [write_run(tmp_path / f"run{i + 1}", [rec(case, v, domain="files" if case in "ab" else "sheets")
                                                 for case, v in zip("abcd", verdicts)])
            for i, verdicts in enumerate(plan)]


def test_three_runs_mean_and_sample_sd_by_hand(tmp_path: Path) -> None:
    """rates 0.75, 0.5, 0.5: mean 0.583333; deviations 1/6, -1/12, -1/12, squares 0.041667, / 2 -> sd 0.144338.
    files (a, b): 1, 0.5, 1 -> mean 0.833333, sd sqrt((1/36 + 1/9 + 1/36) / 2) = 0.288675.
    sheets (c, d): 0.5, - (both errors), 0 -> two runs, mean 0.25, sd sqrt(2 * 0.0625 / 1) = 0.353553."""
    merged = merge_runs(three_runs(tmp_path))
    assert merged.units == ["run1", "run2", "run3"] and merged.warnings == []
    # the same test ids in three runs are three measurements, not one test rerun
    assert merged.summary.n_records == 12 and [r.summary.n_records for r in merged.runs] == [4, 4, 4]
    g = row(merged.summary.groups, model="m")
    assert (g.n, g.recovered, g.errors, g.per_run) == (10, 6, 2, [0.75, 0.5, 0.5])
    assert (g.runs, g.rate_mean, g.rate_sd) == (3, pytest.approx(0.583333, abs=1e-6),
                                                         pytest.approx(0.144338, abs=1e-6))
    files, sheets = row(merged.summary.domains, domain="files"), row(merged.summary.domains, domain="sheets")
    assert files.per_run == [1.0, 0.5, 1.0] and sheets.per_run == [0.5, None, 0.0]
    assert files.rate_mean == pytest.approx(0.833333, abs=1e-6)
    assert files.rate_sd == pytest.approx(0.288675, abs=1e-6)
    assert sheets.rate_mean == pytest.approx(0.25) and sheets.rate_sd == pytest.approx(0.353553, abs=1e-6)
    text = format_report(merged)
    assert "58.3 ± 14.4" in text and "75.0 / 50.0 / 50.0" in text
    [sheets_line] = [line for line in text.splitlines() if line.startswith("m ") and "sheets" in line]
    assert sheets_line.split()[4:] == ["2", "4", "1", "25.0", "±", "35.4", "50.0", "/", "-", "/", "0.0", "2"]
    assert "| m | implicit | 10 | visible | 3 | 10 | 6 | 58.3 ± 14.4 | 75.0 / 50.0 / 50.0 | 2 |" in render_report(merged)


def test_a_run_with_repeated_indices_counts_each_index_and_reruns_dedupe_within_a_run(tmp_path: Path) -> None:
    one = write_run(tmp_path / "k2", [rec("a", "R", run_index=0), rec("a", "F", run_index=1),
                                      rec("a", "R", run_index=1)])  # a rerun of a finished test: ignored
    merged = merge_runs([one])
    assert merged.units == ["k2:run0", "k2:run1"]
    g = merged.summary.groups[0]
    assert (g.n, g.per_run, g.rate_sd) == (2, [1.0, 0.0], pytest.approx(math.sqrt(0.5)))
    assert merged.runs[0].summary.n_ignored_reruns == 1


def test_paired_comparison_with_mcnemar_p_by_hand(tmp_path: Path) -> None:
    """One run, 10 cases both finished: A recovers c0..c7, B c0, c1 and c8. Discordant: A only c2..c7 (b = 6),
    B only c8 (c = 1): p = 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * (1 + 7) / 128 = 0.125; rates 80% vs 30%.
    c10, which B did not finish, is left out; model C runs another strategy and is compared with nobody."""
    a = [rec(f"c{i}", "R" if i < 8 else "F", model="A") for i in range(11)]
    b = [rec(f"c{i}", "R" if i in (0, 1, 8) else "F", model="B") for i in range(10)] + [rec("c10", "E", model="B")]
    c = [rec("c0", "R", model="C", strategy="explicit-0E")]
    merged = merge_runs([write_run(tmp_path / "run", a + b + c)])
    [d] = merged.comparisons
    assert (d.model_a, d.model_b, d.strategy, d.budget, d.pairing) == ("A", "B", "implicit", 10, "same run")
    assert (d.pairs, d.cases, d.b, d.c) == (10, 10, 6, 1)
    assert (d.rate_a, d.rate_b, d.diff_points) == (0.8, 0.3, pytest.approx(50.0))
    assert d.p_value == pytest.approx(0.125)
    text = format_report(merged)
    [line] = [x for x in text.splitlines() if x.startswith("implicit")]
    assert line.split() == ["implicit", "10", "A", "B", "10", "10", "80.0", "30.0", "+50.0", "6", "1", "0.1250",
                            "same", "run"]


def test_models_run_apart_pair_by_run_order_and_count_cases_not_trials(tmp_path: Path) -> None:
    """A in run1 and run2, B in run3 and run4: run1 pairs with run3, run2 with run4.
    x: A R R, B F F -> A better;  y: A R F, B F R -> a tie, dropped;  z: A F F, B R F -> B better.
    b = c = 1, p = 1 (per trial it would be 3 against 2: the runs of one case are not independent pairs);
    rates over the 6 matched trials: A 3/6, B 2/6."""
    a_runs, b_runs = ["RRF", "RFF"], ["FFR", "FRF"]
    dirs = [write_run(tmp_path / f"run{i}", [rec(case, v, model=model) for case, v in zip("xyz", plan)])
            for i, (model, plan) in enumerate([("A", a_runs[0]), ("A", a_runs[1]), ("B", b_runs[0]),
                                               ("B", b_runs[1])], 1)]
    [d] = merge_runs(dirs).comparisons
    assert (d.pairing, d.pairs, d.cases, d.b, d.c, d.p_value) == ("run order", 6, 3, 1, 1, 1.0)
    assert d.diff_points == pytest.approx(100 * (3 / 6 - 2 / 6))


def test_collisions_and_repeated_run_dirs_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clash = "cases/files/a.yaml::test_recovery[a-m-implicit-r10]"
    run = write_run(tmp_path / "run", [
        rec("a", "R", nodeid=clash, kind="visible"),
        rec("a", "F", nodeid=clash, kind="subtle", task="other-task"),  # another case file behind the same id
        rec("b", "R", nodeid="cases/files/b.yaml::test_recovery[b-m-implicit-r10]"),
        rec("b", "F", nodeid="cases/sheets/b.yaml::test_recovery[b-m-implicit-r10]"),  # one case id, two files
    ])
    merged = merge_runs([run, run / "results.jsonl"])
    assert len(merged.runs) == 1
    assert merged.warnings == [
        f"{run / 'results.jsonl'} was given twice; it is counted once",
        (f"run: test id {clash} belongs to two different case files (task 'task-a' vs 'other-task'; kind "
         f"'visible' vs 'subtle'); only its first finished verdict is counted"),
        ("run: case id b (m implicit r=10) ran as 2 tests (cases/files/b.yaml::test_recovery[b-m-implicit-r10], "
         "cases/sheets/b.yaml::test_recovery[b-m-implicit-r10]): two case files with the same id? Comparisons use "
         "the first"),
    ]
    assert merged.summary.n_records == 3  # the summary folds the clash: hence the warning
    assert cli.main(["report", str(run)]) == 0
    assert f"warning: run: test id {clash} belongs to two different case files" in capsys.readouterr().out


def test_two_runs_of_one_config_are_compared_before_and_after_on_cases(tmp_path: Path) -> None:
    """m in run "before" and run "after", 2 run indices each (--retrace-runs 2), cases c0..c7:
    before: c0..c1 R R, c2..c7 F F;  after: c0..c5 R R, c6 R F, c7 F F. Per case (sum over the 2 matched
    runs): after better on c2..c6 (5), worse on none -> McNemar p = 2 * 0.5^5 = 0.0625; rates 4/16 -> 13/16,
    +56.25 points. c8 ran only after: not paired, and the case sets differ (a warning)."""
    before = [rec(f"c{i}", "R" if i < 2 else "F", run_index=k) for i in range(8) for k in range(2)]
    after = [rec(f"c{i}", "R" if i < 6 or (i == 6 and k == 0) else "F", run_index=k) for i in range(8)
             for k in range(2)] + [rec("c8", "R", run_index=0)]
    merged = merge_runs([write_run(tmp_path / "before", before), write_run(tmp_path / "after", after)])
    [d] = merged.run_comparisons
    assert (d.model, d.before, d.after, d.pairs, d.cases, d.worse, d.better) == ("m", "before", "after", 16, 8, 0, 5)
    assert (d.rate_before, d.rate_after, d.p_value) == (0.25, 0.8125, pytest.approx(0.0625))
    assert d.change_points == pytest.approx(56.25)
    assert merged.comparisons == []  # one model: nothing to pair across models
    assert merged.warnings == [("runs cover different case sets: before lacks 1 of the 9 cases the runs cover "
                                "(c8); rates across these runs are over different cases")]
    [line] = [x for x in format_report(merged).splitlines() if x.startswith("m ") and "before" in x]
    assert line.split() == ["m", "implicit", "10", "before", "after", "16", "8", "25.0", "81.2", "+56.2", "0", "5",
                            "0.0625"]
    assert "## Run comparison (before / after, paired)" in render_report(merged)
    assert merged.to_dict()["run_comparisons"][0]["better"] == 5


def test_a_case_whose_files_changed_between_runs_is_warned_about(tmp_path: Path) -> None:
    """The digests come from each run's summary.json, written as the plugin writes it (RetraceSession.finish
    with the checkout root, then the SummaryJson writer); between the runs the case file is edited."""
    from pytest_retrace.results.provenance import case_digest
    from pytest_retrace.results.session import RetraceSession

    cases = tmp_path / "cases" / "mousepad"
    cases.mkdir(parents=True)
    source = REPO / "tests" / "data" / "cases" / "mousepad"
    for name in ("typo-short", "select-all-short"):
        (cases / f"{name}.yaml").write_bytes((source / f"{name}.yaml").read_bytes())
    dirs = []
    for run in ("old", "new"):
        session = RetraceSession(tmp_path / "reports" / run)
        for name in ("typo-short", "select-all-short"):
            session.add(rec(name, "F", domain="mousepad"))
        write_run(session.run_dir, session.records)
        summary = session.finish({"models": ["m"], "env": "xvfb", "budgets": [10], "ssim_threshold": 0.99,
                                  "exitstatus": 0}, root=tmp_path)
        SummaryJson().pytest_retrace_summary(summary=summary, run_dir=str(session.run_dir), config=_Config())
        assert summary["run"]["cases"]["typo-short"] == {"file": "cases/mousepad/typo-short.yaml",
                                                         "digest": case_digest(cases / "typo-short.yaml")}
        dirs.append(session.run_dir)
        with (cases / "typo-short.yaml").open("a") as fh:
            fh.write("# edited after the first run\n")
    merged = merge_runs(dirs)
    started = merged.runs[0].provenance["started_at"]
    assert format_report(merged).splitlines()[1].endswith(f"models m; {started}")  # no git checkout: no commit
    assert merged.warnings == [("1 case(s) changed between runs old and new (their files' digests differ: "
                                "typo-short): the same case id is not the same case")]


# --- plots ------------------------------------------------------------------------------------------


def varied_records() -> list[Record]:
    """Two models, two strategies, budgets 1 / 3 / 10, four kinds, two horizons, rates between 0 and 1."""
    kinds = ["visible", "subtle", "hidden-state", "visual-only"]
    out = []
    for mi, model in enumerate(["alpha", "beta"]):
        for si, strategy in enumerate(["implicit", "explicit-0E"]):
            for budget in (1, 3, 10):
                for i in range(12):
                    good = (i * 7 + mi * 3 + si * 5 + budget) % 12 < 3 + budget // 2 + 3 * mi
                    out.append(rec(f"c{i}", "R" if good else "F", model=model, strategy=strategy, budget=budget,
                                   kind=kinds[i % 4], horizon="short" if i % 3 else "long"))
    return out


def figure_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def test_plots_are_valid_non_blank_deterministic_pngs_pdfs_and_svgs(tmp_path: Path) -> None:
    written = write_plots(varied_records(), tmp_path / "a")
    assert list(PLOTS) == ["rates.png", "budget.png", "domains.png", "kinds.png", "horizons.png", "criteria.png"]
    assert [p.name for p in written] == [*PLOTS, "best_explicit.png"]  # an explicit strategy ran: Figure 7 too
    assert figure_files(tmp_path / "a") == sorted(p.with_suffix(f).name for p in written for f in FORMATS)
    for path in written:
        with Image.open(path) as im:
            assert im.format == "PNG" and im.width >= 600 and im.height >= 400
            colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 10  # bars, text and axes, not a blank canvas
        assert b"matplotlib" not in path.read_bytes()  # no Software chunk with the version
        pdf, svg = path.with_suffix(".pdf").read_bytes(), path.with_suffix(".svg").read_text()
        assert pdf.startswith(b"%PDF-") and b"matplotlib" not in pdf and len(pdf) > 5000
        assert "<svg" in svg and "<dc:date>" not in svg and svg.count("<path") > 10
    again = write_plots(summarize(varied_records()), tmp_path / "b")  # from the summary: the same pictures
    assert [p.read_bytes() for p in written] == [p.read_bytes() for p in again]
    for suffix in (".pdf", ".svg"):
        assert [p.with_suffix(suffix).read_bytes() for p in written] == \
            [p.with_suffix(suffix).read_bytes() for p in again]


def test_the_criteria_plot_stacks_r_o_against_r_tc_from_the_counts() -> None:
    records = [rec("a", "R"), rec("b", "F"), rec("c", "F"),
               rec("d", "F").model_copy(update={"r_o": False, "r_tc": True}),
               rec("e", "F").model_copy(update={"r_o": False, "r_tc": False})]
    [g] = summarize(records).groups
    assert (g.n, g.recovered, g.r_o_only, g.r_tc_only) == (5, 1, 2, 1)
    from pytest_retrace.results.plotkit import style
    from pytest_retrace.results.plots import _criteria

    with style():
        fig = _criteria(summarize(records))
    heights = [round(bar.get_height()) for bar in fig.axes[0].patches]  # bottom up: both, R_O, R_TC, neither
    assert heights == [20, 40, 20, 20]


def test_a_single_budget_has_no_budget_plot_and_nothing_still_gets_figures(tmp_path: Path) -> None:
    out = tmp_path / "one"
    write_plots(varied_records(), out)
    assert (out / "budget.svg").is_file()
    written = write_plots([rec("a", "R"), rec("b", "F")], out)  # one r: a rate against r would be one point
    assert [p.name for p in written] == [p for p in PLOTS if p != "budget.png"]
    assert not any(p.startswith("budget.") for p in figure_files(out))  # the earlier run's are gone too
    empty = write_plots(summarize([]), tmp_path / "none")
    with Image.open(empty[0]) as im:
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 1  # says "no finished tests"


def test_a_failed_plot_is_named_and_the_others_still_written(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    (out / "kinds.png").mkdir(parents=True)  # cannot be written as a file
    with pytest.raises(PlotError, match=r"plots/kinds\.png: "):
        write_plots([rec("a", "R")], out)
    errors: list[str] = []
    written = write_plots([rec("a", "R")], out, errors=errors)
    assert [p.name for p in written] == ["rates.png", "domains.png", "horizons.png", "criteria.png"]
    assert len(errors) == 1 and errors[0].startswith(f"{out / 'kinds.png'}: ")


# --- writers ----------------------------------------------------------------------------------------


def test_writers_write_summary_json_md_and_plots(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run7", varied_records())
    summary = run_summary(varied_records())
    config: Any = _Config()
    for writer in (SummaryJson(), Plots(), SummaryMarkdown()):  # the markdown writer runs last (trylast)
        writer.pytest_retrace_summary(summary=summary, run_dir=str(run_dir), config=config)
    assert json.loads((run_dir / "summary.json").read_text())["n_records"] == len(varied_records())
    assert figure_files(run_dir / "plots") == sorted(Path(p).with_suffix(f).name for p in (*PLOTS, "best_explicit.png")
                                                     for f in FORMATS)
    text = (run_dir / "summary.md").read_text()
    assert text.startswith("# pytest-retrace run run7\n") and "![budget](plots/budget.png)" in text
    assert SummaryMarkdown.pytest_retrace_summary.pytest_impl["trylast"] is True  # type: ignore[attr-defined]


def test_a_plot_writer_failure_never_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", [rec("a", "R")])
    (run_dir / "plots").write_text("a file where the plots directory belongs")
    config: Any = _Config()
    Plots().pytest_retrace_summary(summary=run_summary([rec("a", "R")]), run_dir=str(run_dir), config=config)
    err = capsys.readouterr().err
    assert f"retrace: plot not written: {run_dir / 'plots'}: FileExistsError" in err
    SummaryMarkdown().pytest_retrace_summary(summary=run_summary([rec("a", "R")]), run_dir=str(run_dir),
                                             config=config)
    assert "## Plots" not in (run_dir / "summary.md").read_text()  # links only plots that exist


# --- retrace report ---------------------------------------------------------------------------------


def test_retrace_report_merges_two_runs_by_name_and_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    one = write_run(reports / "one", [rec("a", "R", model="A"), rec("b", "F", model="A"), rec("a", "F", model="B"),
                                      rec("b", "F", model="B")])
    two = write_run(tmp_path / "elsewhere" / "two", [rec("a", "R", model="A"), rec("b", "R", model="A"),
                                                     rec("a", "R", model="B"), rec("b", "E", model="B")])
    out = tmp_path / "out"
    code = cli.main(["report", "one", str(two / "results.jsonl"), "--report-dir", str(reports), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.splitlines()
    assert lines[:3] == ["runs:", f"  one: {one / 'results.jsonl'} — 4 test(s), 0 error(s); models A, B",
                         f"  two: {two / 'results.jsonl'} — 4 test(s), 1 error(s); models A, B"]
    a_line = next(x for x in lines if x.startswith("A "))  # the first table: across runs
    assert a_line.split()[3:10] == ["2", "4", "3", "75.0", "±", "35.4", "50.0"]  # runs n recovered mean ± sd
    # pairs: one/a R-F, one/b F-F, two/a R-R (two/b: B errored) -> A 2/3, B 1/3, b = 1 (a: 2 vs 1), c = 0
    [pair] = [x for x in lines if x.startswith("implicit")]
    assert pair.split()[:12] == ["implicit", "10", "A", "B", "3", "2", "66.7", "33.3", "+33.3", "1", "0", "1.0000"]
    report = (out / "report.md").read_text()
    assert report.startswith("# pytest-retrace report\n") and "![rates](plots/rates.png)" in report
    assert figure_files(out / "plots") == sorted(Path(p).with_suffix(f).name for p in PLOTS for f in FORMATS
                                                 if p != "budget.png")  # a single r
    assert cli.main(["report", "one", "--report-dir", str(reports), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["units"] == ["one"] and data["comparisons"][0]["b"] == 1 and data["merged"]["n_records"] == 4


def test_retrace_report_names_a_bad_or_missing_results_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    good = write_run(tmp_path / "good", [rec("a", "R")])
    bad = write_run(tmp_path / "bad", [rec("a", "R")])
    with (bad / "results.jsonl").open("a") as fh:
        fh.write('{"schema_version": 1}\n' + rec("b", "R").to_json() + "\n")
    assert cli.main(["report", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"retrace report: {bad / 'results.jsonl'}:2: ") and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == f"retrace report: {tmp_path / 'empty' / 'results.jsonl'}: no such file " \
                                      f"(not a run directory?)\n"
    assert cli.main(["report", "no-such-run", "--report-dir", str(tmp_path)]) == 2
    # where it looked, and which runs there are (newest first)
    assert capsys.readouterr().err == (f"retrace report: no-such-run: no such run: looked for no-such-run and "
                                       f"{tmp_path / 'no-such-run'}; runs in {tmp_path}: bad, good\n")
    assert cli.main(["report", "x", "--report-dir", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.endswith(f"{tmp_path / 'nowhere'} does not exist (--report-dir)\n")


def test_the_command_line_in_a_report_masks_secret_looking_values() -> None:
    from pytest_retrace.results.provenance import redact

    argv = ["pytest", "--retrace-env=remote", "--retrace-env-option", "urls=http://a:5000,token=s3cret",
            "--retrace-env-option=API_KEY=sk-123", "-k", "typo", "--retrace-budget=1,3"]
    assert redact(argv) == ["pytest", "--retrace-env=remote", "--retrace-env-option", "urls=http://a:5000,token=***",
                            "--retrace-env-option=API_KEY=***", "-k", "typo", "--retrace-budget=1,3"]


# --- a real run: provenance, failed tests and the exit status ---------------------------------------


@pytest.mark.desktop
def test_a_real_run_records_its_provenance_failed_tests_and_the_process_exit_status(project: pytest.Pytester) -> None:
    """noop and oracle on one real case, in a git checkout of the project: summary.json names the commit, the
    command, the versions, the model configs and the case's digest (the calibration's function), lists the
    failed test with artifacts that exist, and its exitstatus is the process's: pytest's 1, `retrace run`'s 0,
    the gate's 0 when it passes under plain pytest."""
    from pytest_retrace.results.provenance import case_digest

    git = ["git", "-C", str(project.path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "cases", "agents"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "cases"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    res = project.runpytest_subprocess("--retrace-model=noop,oracle", "-k", "typo-short", "--retrace-run=plain",
                                       "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED  # noop failed its recovery
    summary = json.loads((project.path / "reports" / "plain" / "summary.json").read_text())
    meta = summary["run"]
    assert meta["exitstatus"] == res.ret
    assert meta["git"] == {"commit": head, "dirty": False}
    assert "--retrace-model=noop,oracle" in meta["command"] and "--retrace-run=plain" in meta["command"]
    assert meta["versions"]["pytest-retrace"] and meta["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {m["name"]: m["provider"] for m in meta["model_configs"]} == {"noop": "noop", "oracle": "oracle"}
    case_file = project.path / "cases" / "mousepad" / "typo-short.yaml"
    assert meta["cases"] == {"typo-short": {"file": "cases/mousepad/typo-short.yaml", "digest": case_digest(case_file)}}
    assert meta["started_at"] <= meta["finished_at"]
    [failed] = summary["failed"]
    assert (failed["model"], failed["verdict"], failed["r_tc"]) == ("noop", "not_recovered", False)
    assert set(failed["artifacts"]) == {"recovered", "diff"}
    for path in failed["artifacts"].values():
        assert (project.path / "reports" / "plain" / path).is_file()
    md = (project.path / "reports" / "plain" / "summary.md").read_text()
    assert f"- commit: {head}" in md and "## Failed tests (1)" in md and "\n- exit status: 1\n" in md
    assert f"[diff]({failed['artifacts']['diff']})" in md
    plots = project.path / "reports" / "plain" / "plots"
    assert {p.name for p in plots.iterdir()} >= {"rates.pdf", "rates.svg", "domains.png", "criteria.svg"}
    assert not (plots / "budget.png").exists()  # one r
    report = format_report(merge_runs(["plain"], report_dir=project.path / "reports"))
    assert f"models noop, oracle; {meta['started_at']}, commit {head[:12]}" in report.splitlines()[1]

    retrace = Path(sys.executable).with_name("retrace")
    run = subprocess.run([str(retrace), "run", "--model", "noop", "-k", "typo-short", "--retrace-run=measured",
                          "-p", "no:cacheprovider"], cwd=project.path, capture_output=True, text=True, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert json.loads((project.path / "reports" / "measured" / "summary.json").read_text())["run"]["exitstatus"] == 0
    assert "\n- exit status: 0\n" in (project.path / "reports" / "measured" / "summary.md").read_text()

    res = project.runpytest_subprocess("--retrace-model=noop", "-k", "typo-short", "--retrace-fail-under=0",
                                       "--retrace-run=gated", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK  # the gate passed, though noop failed
    assert json.loads((project.path / "reports" / "gated" / "summary.json").read_text())["run"]["exitstatus"] == 0


@pytest.mark.desktop
def test_a_real_repeated_run_counts_a_case_once_in_its_interval(project: pytest.Pytester) -> None:
    """oracle on two real cases with --retrace-runs 2: 4 recovered trials, but 2 cases, so the interval is
    Wilson's for 2 of 2, not for 4 of 4; noop's 0 of 4 likewise that of 0 of 2."""
    from pytest_retrace.results.intervals import wilson_interval

    res = project.runpytest_subprocess("--retrace-model=oracle,noop", "--retrace-runs=2", "-k",
                                       "typo-short or select-all-short", "--retrace-run=k2", "-n", "2",
                                       "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED, res.stdout.str()[-3000:]
    summary = Summary.read(project.path / "reports" / "k2" / "summary.json")
    oracle = row(summary.groups, model="oracle")
    noop = row(summary.groups, model="noop")
    assert (oracle.n, oracle.recovered, oracle.clusters, oracle.effective_n) == (4, 4, 2, 2.0)
    assert (oracle.ci_low, oracle.ci_high) == tuple(round(x, 6) for x in wilson_interval(2, 2))
    assert (oracle.ci_low, oracle.ci_high) != tuple(round(x, 6) for x in wilson_interval(4, 4))
    assert (noop.n, noop.recovered, noop.clusters) == (4, 0, 2)
    assert (noop.ci_low, noop.ci_high) == tuple(round(x, 6) for x in wilson_interval(0, 2))
