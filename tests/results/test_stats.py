from __future__ import annotations

import json
import math
import random
import re
from typing import Any

import pytest
from pydantic import ValidationError

from pytest_retrace.results.intervals import wilson_interval
from pytest_retrace.results.records import SCHEMA_VERSION, Record
from pytest_retrace.results.stats import Row, Statistics
from pytest_retrace.results.stats import summarize as _summarize
from pytest_retrace.results.tables import format_table

_REQUIRED = {"schema_version": SCHEMA_VERSION, "case": None, "task": None, "domain": None, "horizon": None,
             "kind": None, "budget": 10, "finished_at": "2026-11-30T00:00:00+00:00"}


def summarize(records: Any) -> Statistics:
    """The tests write records as results.jsonl holds them (JSON objects); summarize reads typed records."""
    return _summarize(Record.from_dict({**_REQUIRED, **r}) for r in records)


def rec(
    nodeid: str,
    verdict: str = "recovered",
    *,
    model: str = "oracle",
    strategy: str = "implicit",
    budget: int = 10,
    domain: str = "files",
    r_o: bool | None = True,
    r_tc: bool | None = True,
    ssim: float | None = 0.9,
    kind: str = "timeout",
) -> dict[str, Any]:
    error = None
    if verdict == "error":
        r_o = r_tc = ssim = None
        error = {"stage": "setup", "kind": kind, "message": "boom"}
    return {
        "nodeid": nodeid,
        "case": nodeid,
        "domain": domain,
        "model": model,
        "strategy": strategy,
        "budget": budget,
        "verdict": verdict,
        "r_o": r_o,
        "r_tc": r_tc,
        "ssim": ssim,
        "evaluator_score": None,
        "error": error,
        "timings": {"total": 1.0},
    }


def group(summary: Statistics, model: str, strategy: str) -> Row:
    [g] = [g for g in summary.groups if (g.model, g.strategy) == (model, strategy)]
    return g


# --- Wilson interval ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        # Newcombe (1998), Statistics in Medicine 17:857-872, Table II, method 3 (Wilson score)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_reference_values(successes: int, n: int, low: float, high: float) -> None:
    got_low, got_high = wilson_interval(successes, n)
    assert got_low == pytest.approx(low, abs=1e-3)
    assert got_high == pytest.approx(high, abs=1e-3)


def test_wilson_matches_closed_form_and_stays_in_unit_interval() -> None:
    z = 1.959963984540054
    for n in range(1, 40):
        for k in range(n + 1):
            p = k / n
            centre = (k + z * z / 2) / (n + z * z)
            half = z * math.sqrt(n) / (n + z * z) * math.sqrt(p * (1 - p) + z * z / (4 * n))
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= p <= high <= 1.0
            assert low == pytest.approx(max(0.0, centre - half), abs=1e-12)
            assert high == pytest.approx(min(1.0, centre + half), abs=1e-12)


def test_wilson_edge_cases() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(6, 6)[0] == pytest.approx(0.6097, abs=1e-3)
    narrow, wide = wilson_interval(5, 10, z=1.0), wilson_interval(5, 10, z=3.0)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]
    for bad in [(-1, 10), (11, 10), (0, -1)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


# --- summarize ------------------------------------------------------------------------------------


def test_errors_excluded_from_rates_but_counted() -> None:
    records = [
        rec("a"),
        rec("b", "not_recovered", r_o=False, r_tc=True, ssim=0.5),
        rec("c", "error", kind="timeout"),
        rec("d", "error", kind="vm_crash"),
        rec("e", "error"),
    ]
    s = summarize(records)
    g = group(s, "oracle", "implicit")
    assert (g.n, g.recovered, g.errors, g.total) == (2, 1, 3, 5)
    assert g.rate == 0.5
    assert (g.ci_low, g.ci_high) == tuple(round(x, 6) for x in wilson_interval(1, 2))
    assert (g.r_o_rate, g.r_tc_rate) == (0.5, 1.0)
    assert g.mean_ssim == pytest.approx(0.7)
    assert g.domain is None
    assert (s.n_records, s.n_errors) == (5, 3)
    assert s.error_kinds == {"timeout": 2, "vm_crash": 1}
    assert list(s.error_kinds) == sorted(s.error_kinds)


def test_only_errors_gives_none_rates() -> None:
    s = summarize([rec("a", "error"), rec("b", "error", kind="")])
    g = group(s, "oracle", "implicit")
    assert (g.n, g.errors, g.total) == (0, 2, 2)
    assert g.rate is g.r_o_rate is g.r_tc_rate is g.mean_ssim is None
    assert (g.ci_low, g.ci_high) == (0.0, 1.0)
    assert s.error_kinds == {"timeout": 1, "unknown": 1}


def test_none_fields_handled() -> None:
    records = [
        rec("a", r_o=None, r_tc=None, ssim=None),
        rec("b", "not_recovered", r_o=True, r_tc=None, ssim=None),
    ]
    records.append({"nodeid": "c", "model": "m", "strategy": "s", "verdict": "recovered"})  # sparse record
    records.append({"nodeid": "d", "model": "m", "strategy": "s", "verdict": "error", "error": None})
    s = summarize(records)
    g = group(s, "oracle", "implicit")
    assert (g.r_o_rate, g.r_tc_rate, g.mean_ssim) == (0.5, 0.0, None)
    sparse = group(s, "m", "s")
    assert (sparse.n, sparse.recovered, sparse.errors, sparse.r_o_rate) == (1, 1, 1, 0.0)
    assert s.error_kinds == {"unknown": 1}
    assert [d.domain for d in s.domains if d.model == "m"] == [""]
    json.dumps(s.to_dict())


def test_order_independent() -> None:
    rng = random.Random(1234)
    records = [
        rec(
            f"t{i}",
            rng.choice(["recovered", "not_recovered", "error"]),
            model=rng.choice(["gpt", "claude", "oracle"]),
            strategy=rng.choice(["implicit", "explicit"]),
            domain=rng.choice(["files", "sheets", "web"]),
            r_o=rng.random() < 0.5,
            r_tc=rng.random() < 0.5,
            ssim=rng.random(),
            kind=rng.choice(["timeout", "vm_crash"]),
        )
        for i in range(200)
    ]
    expected = summarize(records)
    for _ in range(10):
        rng.shuffle(records)
        shuffled = summarize(iter(records))
        assert shuffled == expected
        assert json.dumps(shuffled.to_dict()) == json.dumps(expected.to_dict())
    keys = [(g.model, g.strategy) for g in expected.groups]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    cells = [(d.model, d.strategy, d.domain) for d in expected.domains]
    assert cells == sorted(cells)


def test_floats_rounded_to_six_decimals() -> None:
    s = summarize([rec("a"), rec("b", "not_recovered"), rec("c", "not_recovered", ssim=0.1234567891)])
    g = group(s, "oracle", "implicit")
    for key in ("rate", "ci_low", "ci_high", "r_o_rate", "r_tc_rate", "mean_ssim"):
        assert getattr(g, key) == round(getattr(g, key), 6)
    assert g.rate == 0.333333


def test_a_finished_verdict_is_final_and_only_an_error_is_replaced() -> None:
    first_run = [rec("a", "error"), rec("b", "not_recovered")]
    resumed = [rec("a", "recovered")]
    s = summarize(first_run + resumed)
    g = group(s, "oracle", "implicit")
    assert (g.n, g.recovered, g.errors, g.total) == (2, 1, 0, 2)
    assert (s.n_records, s.n_errors, s.error_kinds, s.n_ignored_reruns) == (2, 0, {}, 0)
    # rerunning a failure under the same run cannot make it best-of-k, and a later error cannot erase it
    s = summarize([rec("b", "not_recovered"), rec("b", "recovered"), rec("c", "recovered"), rec("c", "error")])
    g = group(s, "oracle", "implicit")
    assert (g.n, g.recovered, g.errors, s.n_ignored_reruns) == (2, 1, 0, 2)


def test_per_domain_grouping() -> None:
    records = [
        rec("f1", domain="files"),
        rec("f2", "not_recovered", domain="files"),
        rec("s1", domain="sheets"),
        rec("s2", "error", domain="sheets"),
        rec("x1", domain="files", model="gpt"),
    ]
    s = summarize(records)
    cells = {(d.model, d.strategy, d.domain): d for d in s.domains}
    assert list(cells) == [
        ("gpt", "implicit", "files"),
        ("oracle", "implicit", "files"),
        ("oracle", "implicit", "sheets"),
    ]
    files, sheets = cells["oracle", "implicit", "files"], cells["oracle", "implicit", "sheets"]
    assert (files.n, files.recovered, files.rate, files.errors) == (2, 1, 0.5, 0)
    assert (sheets.n, sheets.recovered, sheets.rate, sheets.errors) == (1, 1, 1.0, 1)
    overall = group(s, "oracle", "implicit")
    assert (overall.n, overall.recovered, overall.errors) == (3, 2, 1)


def test_a_row_dumps_the_keys_summary_json_always_had() -> None:
    g = Row(model="m", strategy="s", budget=3, domain=None, n=3, recovered=1, rate=0.333333, ci_low=0.0615,
            ci_high=0.7923, r_o_rate=None, r_tc_rate=0.666667, errors=1, total=4, mean_ssim=None, calls=0,
            input_tokens=0, output_tokens=0, cost=None)
    d = g.model_dump(mode="json")
    assert d["rate"] == 0.333333 and d["r_o_rate"] is None
    # kind / horizon only in their own breakdown's rows, per_run only in a merged report
    assert list(d) == [
        "model",
        "strategy",
        "budget",
        "domain",
        "n",
        "recovered",
        "rate",
        "ci_low",
        "ci_high",
        "r_o_rate",
        "r_tc_rate",
        "errors",
        "total",
        "mean_ssim",
        "calls",
        "input_tokens",
        "output_tokens",
        "cost",
        "common_n",
        "common_recovered",
        "common_rate",
        "runs",
        "rate_mean",
        "rate_sd",
        "success_at",
        "clusters",
        "effective_n",
        "r_o_only",
        "r_tc_only",
    ]
    assert list(g.model_copy(update={"kind": "", "per_run": [0.5]}).model_dump())[-3:] == [
        "r_o_only", "r_tc_only", "per_run"]
    assert "kind" in g.model_copy(update={"kind": ""}).model_dump()
    with pytest.raises(ValidationError):
        g.n = 4  # type: ignore[misc]


def test_empty() -> None:
    s = summarize([])
    assert s == Statistics(groups=[], n_records=0, n_errors=0)
    assert s.to_dict() == {"groups": [], "domains": [], "kinds": [], "horizons": [], "n_records": 0, "n_errors": 0,
                           "error_kinds": {}, "n_ignored_reruns": 0, "n_verified_by_determinism": 0}
    assert format_table(s).split() == [
        "model",
        "strategy",
        "r",
        "n",
        "recovered",
        "rate",
        "95%",
        "CI",
        "R_O",
        "R_TC",
        "errors",
    ]


# --- format_table ---------------------------------------------------------------------------------


def column_starts(header: str, names: list[str]) -> list[int]:
    """Offsets of the header names, matched in order as whole space-delimited words."""
    starts, pos = [], 0
    for name in names:
        match = re.compile(rf"(?<!\S){re.escape(name)}(?!\S)").search(header, pos)
        assert match, (header, name)
        starts.append(match.start())
        pos = match.end()
    return starts


def assert_aligned(lines: list[str], names: list[str]) -> None:
    starts = column_starts(lines[0], names)
    for line in lines[1:]:
        for start in starts[1:]:
            assert line[start - 1] == " " and line[start] != " ", (line, start)


def test_format_table_numbers_and_alignment() -> None:
    records = [rec(f"o{i}") for i in range(6)]
    records += [
        rec("g1", "not_recovered", model="gpt-4o-long-name", strategy="explicit", r_o=False),
        rec("g2", "error", model="gpt-4o-long-name", strategy="explicit"),
    ]
    table = format_table(summarize(records))
    lines = table.splitlines()
    assert len(lines) == 3
    names = ["model", "strategy", "r", "n", "recovered", "rate", "95% CI", "R_O", "R_TC", "errors"]
    assert_aligned(lines, names)
    assert lines[1].split() == [
        "gpt-4o-long-name",
        "explicit",
        "10",
        "1",
        "0",
        "0.0%",
        "[0.0,",
        "79.3]",
        "0.0%",
        "100.0%",
        "1",
    ]
    assert lines[2].split() == [
        "oracle",
        "implicit",
        "10",
        "6",
        "6",
        "100.0%",
        "[61.0,",
        "100.0]",
        "100.0%",
        "100.0%",
        "0",
    ]
    assert all(line == line.rstrip() for line in lines)


def test_format_table_columns_sized_to_content() -> None:
    table = format_table(summarize([rec("a", model="m", strategy="s")]))
    header = table.splitlines()[0]
    # 'model' is wider than 'm', so the next column starts two spaces after the header word
    assert header.startswith("model  strategy  r   n  recovered  rate  ")


def test_format_table_dashes_for_none() -> None:
    records = [rec("a", "error"), rec("b", model="m", r_o=None, r_tc=None, ssim=None)]
    lines = format_table(summarize(records)).splitlines()
    row_m, row_oracle = lines[1].split(), lines[2].split()
    # two models share the cell, so the shared-cases column appears: they share no error-free case
    assert row_m == ["m", "implicit", "10", "1", "1", "100.0%", "[20.7,", "100.0]", "0.0%", "0.0%", "0", "-", "(0)"]
    assert row_oracle == ["oracle", "implicit", "10", "0", "0", "-", "-", "-", "-", "1", "-", "(0)"]


def test_format_table_by_domain() -> None:
    records = [
        rec("f1", domain="files"),
        rec("f2", "not_recovered", domain="files"),
        rec("w1", domain="web-browser"),
        rec("w2", "error", domain="web-browser"),
    ]
    summary = summarize(records)
    lines = format_table(summary, by_domain=True).splitlines()
    names = ["model", "strategy", "r", "domain", "n", "recovered", "rate", "95% CI", "R_O", "R_TC", "errors"]
    assert_aligned(lines, names)
    assert len(lines) == 3
    assert lines[1].split()[:7] == ["oracle", "implicit", "10", "files", "2", "1", "50.0%"]
    assert lines[2].split()[:7] == ["oracle", "implicit", "10", "web-browser", "1", "1", "100.0%"]
    assert lines[2].split()[-1] == "1"
    assert "domain" not in format_table(summary)
    assert len(format_table(summary).splitlines()) == 2


# --- budgets, shared cases, usage -------------------------------------------------------------------


def test_each_budget_is_its_own_group() -> None:
    records = [rec("a-r1", "not_recovered", budget=1), rec("a-r3", budget=3), rec("a-r10", budget=10)]
    for r in records:
        r["case"] = "a"
    s = summarize(records)
    assert [(g.budget, g.recovered) for g in s.groups] == [(1, 0), (3, 1), (10, 1)]
    assert [(d.budget, d.domain) for d in s.domains] == [(1, "files"), (3, "files"), (10, "files")]


def test_shared_cases_rate_leaves_out_cases_any_compared_model_errored_on() -> None:
    """A flaky API must not raise a model's rate: B errors on the two hard cases A fails, so both show 50 %,
    while on the cases both finished (c3, c4) A recovers 2 of 2 and B 1 of 2."""
    records = []
    for case, a, b in [("c1", "not_recovered", "error"), ("c2", "not_recovered", "error"),
                       ("c3", "recovered", "recovered"), ("c4", "recovered", "not_recovered")]:
        records += [dict(rec(f"{case}-A", a, model="A"), case=case), dict(rec(f"{case}-B", b, model="B"), case=case)]
    s = summarize(records)
    a, b = group(s, "A", "implicit"), group(s, "B", "implicit")
    assert (a.rate, b.rate) == (0.5, 0.5)
    assert (b.n, b.recovered) == (2, 1)
    assert (a.common_n, a.common_recovered, a.common_rate) == (2, 2, 1.0)
    assert (b.common_n, b.common_recovered, b.common_rate) == (2, 1, 0.5)
    records[0]["verdict"] = "error"  # an error of A's own on c1 changes nothing shared: B had errored there
    a = group(summarize(records), "A", "implicit")
    assert (a.rate, a.common_rate, a.common_n) == (0.666667, 1.0, 2)
    assert "shared (n)" in format_table(summarize(records))


def test_a_single_model_has_no_shared_cases_column() -> None:
    s = summarize([rec("a"), rec("b", "error")])
    assert group(s, "oracle", "implicit").common_n is None
    assert "shared" not in format_table(s)


def test_usage_and_cost_are_summed_per_group() -> None:
    r1 = dict(rec("a"), usage={"calls": 3, "input_tokens": 100, "output_tokens": 10, "cost": 0.25},
              context_usage={"calls": 1, "input_tokens": 50, "output_tokens": 5, "cost": 0.05})
    r2 = dict(rec("b"), usage={"calls": 2, "input_tokens": 40, "output_tokens": 4})
    g = group(summarize([r1, r2]), "oracle", "implicit")
    assert (g.calls, g.input_tokens, g.output_tokens, g.cost) == (6, 190, 19, 0.3)
    assert "$0.30" in format_table(summarize([r1, r2]))


def test_three_runs_give_mean_sd_and_success_at_k_as_computed_by_hand() -> None:
    """Cases a, b, c, d over runs 0, 1, 2 (R = recovered, F = failed, E = infrastructure error):
    a: R R R   b: R F F   c: F F F   d: R E F
    per-run rates: run 0 {a R, b R, c F, d R} 3/4; run 1 {a R, b F, c F} 1/3; run 2 {a R, b F, c F, d F} 1/4
    mean = (0.75 + 1/3 + 0.25) / 3 = 0.444444; sample sd: deviations 0.305556, -0.111111, -0.194444,
    squares sum 0.143519, / (3 - 1) = 0.071759, sqrt = 0.267879
    success@k per case, 1 - C(n-c, k)/C(n, k): a n3 c3; b n3 c1; c n3 c0; d n2 c1
    @1: a 1, b 1/3, c 0, d 1/2 -> 0.458333;  @2: a 1, b 1 - C(2,2)/C(3,2) = 2/3, c 0, d 1 -> 0.666667
    @3: a 1, b 1, c 0 (d has 2 finished runs only) -> 0.666667"""
    plan = {"a": "RRR", "b": "RFF", "c": "FFF", "d": "REF"}
    verdicts = {"R": "recovered", "F": "not_recovered", "E": "error"}
    records = [dict(rec(f"{case}-run{i}", verdicts[v]), case=case, run_index=i)
               for case, runs in plan.items() for i, v in enumerate(runs)]
    g = group(summarize(records), "oracle", "implicit")
    assert (g.runs, g.n, g.errors) == (3, 11, 1)
    assert g.rate_mean == pytest.approx(0.444444, abs=1e-6)
    assert g.rate_sd == pytest.approx(0.267879, abs=1e-6)
    assert g.success_at == {"1": pytest.approx(0.458333, abs=1e-6), "2": pytest.approx(0.666667, abs=1e-6),
                               "3": pytest.approx(0.666667, abs=1e-6)}
    table = format_table(summarize(records))
    assert "44.4 ± 26.8 (3)" in table and "@1 45.8% @2 66.7% @3 66.7%" in table
    single = group(summarize([rec("a"), rec("b")]), "oracle", "implicit")
    assert single.runs is single.rate_mean is single.success_at is None  # one run: no such columns


# --- repeated runs: the interval is clustered by case -----------------------------------------------


def runs_of(plan: dict[str, str]) -> list[dict[str, Any]]:
    """``{"case": "RRF"}``: the case's verdict in run 0, 1, 2 ... (R recovered, F not)."""
    return [dict(rec(f"{case}-run{i}", "recovered" if v == "R" else "not_recovered"), case=case, run_index=i)
            for case, runs in plan.items() for i, v in enumerate(runs)]


def test_k_runs_of_one_case_are_one_cluster_not_k_trials() -> None:
    """4 of 10 cases recovered in all 3 runs, 6 in none: 12/30 trials, but the evidence is 4 of 10 cases."""
    plan = {f"c{i}": "RRR" if i < 4 else "FFF" for i in range(10)}
    g = group(summarize(runs_of(plan)), "oracle", "implicit")
    assert (g.n, g.recovered, g.clusters, g.effective_n) == (30, 12, 10, 10.0)
    assert (g.ci_low, g.ci_high) == tuple(round(x, 6) for x in wilson_interval(4, 10))
    pooled_low, pooled_high = wilson_interval(12, 30)  # what counting the 30 trials as independent would claim
    assert g.ci_high - g.ci_low > pooled_high - pooled_low + 0.1


def test_cluster_interval_by_hand_and_one_run_is_plain_wilson() -> None:
    """a: 2 of 2 runs, b: 1 of 2, c: 0 of 2. p = 3/6; V = ((2 - 1)² + (1 - 1)² + (0 - 1)²) / 6² = 1/18;
    n_eff = p(1 - p) / V = 0.25 * 18 = 4.5; Wilson at p = 0.5, n = 4.5, z = 1.96: centre 0.5,
    half = z / (1 + z²/4.5) * sqrt(0.25/4.5 + z²/(4 * 4.5²)) = 0.339310."""
    g = group(summarize(runs_of({"a": "RR", "b": "RF", "c": "FF"})), "oracle", "implicit")
    assert g.effective_n == pytest.approx(4.5) and g.clusters == 3
    z = 1.959963984540054
    half = z / (1 + z * z / 4.5) * math.sqrt(0.25 / 4.5 + z * z / (4 * 4.5**2))
    assert half == pytest.approx(0.339310, abs=1e-6)
    assert (g.ci_low, g.ci_high) == (round(0.5 - half, 6), round(0.5 + half, 6))
    single = group(summarize(runs_of({"a": "R", "b": "F", "c": "F", "d": "R", "e": "R"})), "oracle", "implicit")
    assert (single.ci_low, single.ci_high) == tuple(round(x, 6) for x in wilson_interval(3, 5))
    assert single.clusters is single.effective_n is None  # one trial per case: not clustered
