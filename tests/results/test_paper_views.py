"""The paper's Figure 7 (the best explicit strategy per model), Table 8 (independently sampled evaluation sets)
and Figure 8 (end-to-end Δ by the number of recoveries allowed) against hand computations, and their files."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from pytest_retrace.results.best import best_explicit_rows
from pytest_retrace.results.merge import merge_runs
from pytest_retrace.results.report import format_report, render_markdown
from pytest_retrace.results.sets import evaluation_sets
from pytest_retrace.results.stats import summarize
from pytest_retrace.results.summary import RunInfo, build_summary
from pytest_retrace.results.plots import write_plots
from tests.experiments.test_end_to_end import _episode
from tests.results.test_report import rec, write_run


def _cases(model: str, strategy: str, verdicts: str, *, horizon: str = "long", start: int = 0, budget: int = 10):
    return [rec(f"c{start + i}", v, model=model, strategy=strategy, horizon=horizon, budget=budget)
            for i, v in enumerate(verdicts)]


def test_the_best_explicit_strategy_is_the_highest_rate_on_the_shared_cases_beside_implicit() -> None:
    records = (_cases("a", "implicit", "RFFF") + _cases("a", "explicit-0E", "RRFF") + _cases("a", "explicit-0R", "RRRF")
               + _cases("a", "explicit-none", "RRRE")  # 3/3 on its own cases, but c3 errored
               + _cases("b", "implicit", "FFFF") + _cases("b", "explicit-0E", "RFFF") + _cases("b", "explicit-0R", "RFFF"))
    rows = best_explicit_rows(summarize(records))
    overall = {r.model: r for r in rows if r.horizon is None}
    # several models: each rate on the cases no compared model errored on (per strategy: explicit-none's c3 is out
    # only under explicit-none, and b never ran it, so its basis there is its own 3 cases)
    a, b = overall["a"], overall["b"]
    assert (a.strategy, a.recovered, a.n, a.basis) == ("explicit-none", 3, 3, "all")
    assert a.compared == ["explicit-0E", "explicit-0R", "explicit-none"] and (a.implicit_rate, a.implicit_n) == (0.25, 4)
    # b: a tie at 1/4 between 0E and 0R goes to the first by name, every time
    assert (b.strategy, b.rate, b.basis, b.implicit_rate) == ("explicit-0E", 0.25, "shared", 0.0)
    assert (round(b.ci_low, 4), round(b.ci_high, 4)) == (0.0456, 0.6994)  # Wilson 1/4
    assert {r.horizon for r in rows} == {None, "long"}


def test_under_the_paper_protocol_the_best_is_taken_on_the_one_subset_every_strategy_finished() -> None:
    records = (_cases("a", "implicit", "RFFF") + _cases("a", "explicit-0R", "RRRF")
               + _cases("a", "explicit-none", "RRRE") + _cases("b", "explicit-0R", "RFFF"))
    stats = summarize(records, shared_across_strategies=True)
    a = next(r for r in best_explicit_rows(stats) if r.model == "a" and r.horizon is None)
    assert (a.strategy, a.recovered, a.n, a.basis) == ("explicit-0R", 3, 3, "shared")  # c3 out for every strategy
    assert (a.implicit_rate, a.implicit_n) == (round(1 / 3, 6), 3)


def test_no_explicit_strategy_no_row_and_no_figure(tmp_path: Path) -> None:
    records = _cases("a", "implicit", "RF")
    assert best_explicit_rows(summarize(records)) == []
    written = write_plots(records, tmp_path)
    assert "best_explicit.png" not in [p.name for p in written]


def test_figure_7_is_drawn_per_horizon_and_summary_md_has_its_table(tmp_path: Path) -> None:
    records = (_cases("a", "implicit", "RFFF") + _cases("a", "explicit-0R", "RRFF")
               + _cases("a", "explicit-0R", "RF", horizon="short", start=4) + _cases("a", "implicit", "FF", horizon="short", start=4))
    written = write_plots(records, tmp_path)
    assert "best_explicit.png" in [p.name for p in written]
    with Image.open(tmp_path / "best_explicit.png") as im:
        assert im.width >= 600 and im.height >= 400
    summary = build_summary(records, RunInfo(models=["a"], env="xvfb", budgets=[10], ssim_threshold=0.99, exitstatus=0))
    text = render_markdown(summary, "run", [])
    assert "## Best explicit strategy per model" in text
    assert "| a | 10 | all | explicit-0R | 50.0% |" in text and "| a | 10 | long | explicit-0R | 50.0% |" in text


def test_table_8_rates_per_independent_set_and_their_mean_and_sd(tmp_path: Path) -> None:
    one = [rec(f"s1-{i}", v) for i, v in enumerate("RRFF")]  # 2/4
    one_again = [rec(f"s1-{i}", v, model="b") for i, v in enumerate("RFFF")]  # the same set, another model
    two = [rec(f"s2-{i}", v) for i, v in enumerate("RRRF")] + [rec("s2-x", "E")]  # 3/4, the error excluded
    partial = [rec("s1-0", "F")]  # part of set 1: a partial rerun, not a third set
    three = [rec(f"s3-{i}", v) for i, v in enumerate("FFFF")]  # 0/4
    sets, rows = evaluation_sets(["r1", "r1b", "r2", "part", "r3"], [one, one_again, two, partial, three])
    assert [(s.label, s.runs, s.cases) for s in sets] == [("set 1", ["r1", "r1b", "part"], 4), ("set 2", ["r2"], 5),
                                                           ("set 3", ["r3"], 4)]
    m = next(r for r in rows if r.model == "m")
    assert m.n == [5, 4, 4] and m.rates == [0.4, 0.75, 0.0]  # set 1 pools r1 (2/4) and the partial rerun (0/1)
    assert m.mean == round((0.4 + 0.75 + 0.0) / 3, 6)
    assert m.sd == 0.375278  # sample sd of 0.4, 0.75, 0 by hand: sqrt(((.0167)^2+(.3667)^2+(.3833)^2)/2)
    b = next(r for r in rows if r.model == "b")
    assert b.rates == [0.25, None, None] and b.sd is None
    assert evaluation_sets(["r1", "part"], [one, partial]) == ([], [])  # one set: no table

    runs = [write_run(tmp_path / name, records) for name, records in (("r1", one), ("r2", two), ("r3", three))]
    merged = merge_runs(runs)
    text = format_report(merged)
    assert "per evaluation set" in text and "40.0% (5)" not in text and "50.0% (4)" in text
    assert "mean ± sd over sets" in text and "41.7% ± 38.2" in text


def test_figure_8_draws_delta_by_recoveries_allowed(tmp_path: Path) -> None:
    records = [_episode("a", "none", "unsolved"), _episode("b", "none", "solved"),
               _episode("a", "ideal", "solved", most=1, reached=[True]), _episode("b", "ideal", "solved", most=1),
               _episode("a", "ideal", "solved", most=3, reached=[True]), _episode("b", "ideal", "unsolved", most=3)]
    summary = build_summary([], RunInfo(models=["m"], env="xvfb", budgets=[10], ssim_threshold=0.99, exitstatus=0),
                            forward=records)
    assert [(r.mode, r.max_recoveries, r.delta) for r in summary.end_to_end] == [
        ("none", 0, None), ("ideal", 1, 0.5), ("ideal", 3, 0.0)]
    written = write_plots(summary, tmp_path)
    assert [p.name for p in written] == ["end_to_end.png"]
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "end_to_end.png").shape[1] >= 600
