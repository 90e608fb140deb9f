"""The CI gate's regression test against a saved baseline: McNemar's exact test on the shared cases, and
the gate end to end (real runs on real desktops): what it compared, what it could not, unloadable case files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_retrace.results.baseline import (
    ALPHA,
    compare,
    errored,
    load,
    mcnemar_p,
    min_shared,
    save,
    smallest_p,
    verdicts,
)
from pytest_retrace.results.records import Failure, Record
from tests.helpers import records, summary

pytest_plugins = ["pytester"]


def rec(case: str, recovered: bool | None, model: str = "m", run_index: int = 0) -> Record:
    base = Record(nodeid=f"{case}-{model}-{run_index}", case=None, task=None, domain=None, horizon=None, kind=None,
                  model=model, strategy="implicit", budget=10, run_index=run_index,
                  finished_at="2026-01-01T00:00:00+00:00", verdict="error",
                  error=Failure(stage="x", kind="env", message="-"))
    if recovered is None:
        return base.model_copy(update={"case": case})
    verdict = "recovered" if recovered else "not_recovered"
    return base.model_copy(update={"case": case, "verdict": verdict, "error": None, "recovered": recovered})


@pytest.mark.parametrize(("b", "c", "p"), [
    (0, 0, 1.0), (1, 0, 1.0), (5, 0, 0.0625), (6, 0, 0.03125), (6, 1, 0.125), (10, 2, 0.0385742),
])
def test_mcnemar_exact_p_values_by_hand(b: int, c: int, p: float) -> None:
    """2 * P(X <= min(b, c)), X ~ Bin(b + c, 1/2): e.g. 6 vs 1 -> 2 * (1 + 7) / 128 = 0.125;
    10 vs 2 -> 2 * (1 + 12 + 66) / 4096 = 0.0385742."""
    assert mcnemar_p(b, c) == pytest.approx(p, abs=1e-6)
    assert mcnemar_p(c, b) == pytest.approx(p, abs=1e-6)


def test_a_supported_drop_regresses_and_noise_does_not(tmp_path: Path) -> None:
    cases = [f"c{i}" for i in range(10)]
    path = tmp_path / "base.json"
    save(path, "before", [rec(c, True) for c in cases] + [rec("gone", True), rec("err", None)])
    old = load(path)
    # 7 of 10 shared cases lost: p = 2 / 128 < 0.05
    [planted] = compare(old, verdicts([rec(c, i >= 7) for i, c in enumerate(cases)]))
    assert (planted.shared, planted.lost, planted.gained) == (10, 7, 0)
    assert planted.p_value < ALPHA and planted.regressed(max_drop=0) and not planted.regressed(max_drop=80)
    assert "m implicit r=10: 100.0% -> 30.0% on 10 shared case(s) (lost 7, gained 0; McNemar exact p = 0.0156)" \
        == planted.describe()
    # one case lost: a 10-point drop that chance explains (p = 1)
    [noise] = compare(old, verdicts([rec(c, i > 0) for i, c in enumerate(cases)]))
    assert noise.drop_points == pytest.approx(10.0) and noise.p_value == 1.0 and not noise.regressed(0)


def test_a_broken_baseline_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 7}')
    with pytest.raises(ValueError, match=r"bad\.json: schema_version 7, expected 1"):
        load(path)


def test_the_smallest_p_on_n_shared_cases_and_the_fewest_that_can_fail() -> None:
    """Every shared case lost: 2 * 2^-n. 5 pairs cannot reach p < 0.05 (0.0625), 6 can (0.03125)."""
    assert [smallest_p(n) for n in (0, 1, 5, 6)] == pytest.approx([1.0, 1.0, 0.0625, 0.03125])
    assert min_shared() == 6 and min_shared(0.01) == 8  # 2^-7 = 0.0078 < 0.01 <= 2^-6


def test_groups_of_either_side_are_compared_and_missing_cases_counted() -> None:
    old = verdicts([rec(c, True) for c in ("a", "b", "c")] + [rec("a", True, model="gone")])
    run = [rec("a", False), rec("b", None), rec("a", True, model="new")]  # c not run, b an infra error
    by_model = {c.group[0]: c for c in compare(old, verdicts(run), errored(run))}
    m = by_model["m"]
    assert (m.shared, m.baseline_n, m.run_n, m.missing, m.missing_errors) == (1, 3, 1, 2, 1)
    assert m.describe_missing() == \
        "2 of 3 baseline case(s) missing from the run (1 infrastructure error(s), 1 not run)"
    assert m.underpowered and m.smallest_p == 1.0
    assert (by_model["gone"].run_n, by_model["gone"].shared) == (0, 0)
    assert (by_model["new"].baseline_n, by_model["new"].shared, by_model["new"].old_rate) == (0, 0, None)


# --- the gate end to end: real runs of the plugin on real desktops (pytester, in a subprocess) ------------

_FIVE = "not wander-long"  # 5 of the 6 test cases: one short of what a 100 % -> 0 % drop needs for p < 0.05


def _gate(project: pytest.Pytester, run: str) -> dict:
    return summary(project, run)["gate"]


@pytest.mark.desktop
def test_the_gate_reports_every_comparison_and_fails_when_it_could_not_have(project: pytest.Pytester) -> None:
    """The baseline's save path is printed; 100 % -> 0 % on 5 shared cases passes (p = 0.0625 cannot reach
    0.05) but says so, with the comparison; strict mode (here its ini twin) fails then, and names baseline
    cases missing from the run; a baseline of a renamed model compares nothing and fails, naming both
    sides."""
    cand = project.path / "agents" / "cand.yaml"
    cand.write_text("provider: oracle\n")
    res = project.runpytest_subprocess("--retrace-model=cand", "-k", _FIVE, "--retrace-run=base",
                                       "--retrace-save-baseline=v1", "-n", "2", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=5)
    saved = project.path / "reports" / "baselines" / "v1.json"
    res.stdout.fnmatch_lines([f"baseline saved: {saved} (5 verdict(s) of run base)"])

    cand.write_text("provider: noop\n")  # every case lost
    res = project.runpytest_subprocess("--retrace-model=cand", "-k", _FIVE, "--retrace-run=worse",
                                       "--retrace-baseline=v1", "-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines([
        "*retrace gate: passed*",
        f"  against baseline {saved} (McNemar exact, alpha 0.05, max drop 0 points):",
        "    cand implicit r=10: 100.0% -> 0.0% on 5 shared case(s) (lost 5, gained 0; McNemar exact p = 0.0625)"
        "  (underpowered)",
        "  note: cand implicit r=10: 5 shared case(s) cannot show a regression: McNemar's exact p is at least "
        "0.0625 on 5 pair(s), not below alpha 0.05 (that takes 6 shared cases); --retrace-gate-strict fails the "
        "gate on this",
    ])
    [group] = _gate(project, "worse")["baseline"]["groups"]
    assert (group["shared"], group["lost"], group["p_value"], group["smallest_p"], group["underpowered"],
            group["regressed"]) == (5, 5, 0.0625, 0.0625, True, False)

    # strict, from the ini file; 2 of the 5 baseline cases, one of them an infrastructure error (its recorded
    # target replaced by another case's: the replay cannot reproduce it)
    project.makeini("[pytest]\ntestpaths = cases\nretrace_gate_strict = true\n")
    cases = project.path / "cases" / "mousepad"
    shutil.copy(cases / "select-all-short" / "target.png", cases / "typo-short" / "target.png")
    res = project.runpytest_subprocess("--retrace-model=cand", "-k", "typo-short or select-all",
                                       "--retrace-run=strict", "--retrace-baseline=v1", "--retrace-attempts=1",
                                       "--retrace-progress", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines([
        "*retrace gate: FAILED*",
        "  underpowered (--retrace-gate-strict): cand implicit r=10: 1 shared case(s) cannot show a regression: "
        "McNemar's exact p is at least 1.0000 on 1 pair(s), not below alpha 0.05 (that takes 6 shared cases)",
        "*against baseline * max drop 0 points, strict):",
        "    cand implicit r=10: 100.0% -> 0.0% on 1 shared case(s) (lost 1, gained 0; McNemar exact p = 1.0000)*",
        "  note: cand implicit r=10: 4 of 5 baseline case(s) missing from the run (1 infrastructure error(s), "
        "3 not run)",
    ])
    gate = _gate(project, "strict")
    assert gate["passed"] is False and gate["strict"] is True
    # the per-test line of a CI log carries the error's whole text, never a cut-off word
    [error] = [r["error"] for r in records(project, "strict") if r["verdict"] == "error"]
    message = " ".join(error["message"].split())
    assert len(message) > 100 and f"desync at reconstruct: {message}" in res.stdout.str()

    renamed = project.path / "agents" / "renamed.yaml"
    renamed.write_text("provider: noop\n")
    project.makeini("[pytest]\ntestpaths = cases\n")
    res = project.runpytest_subprocess("--retrace-model=renamed", "-k", "select-all", "--retrace-run=renamed",
                                       "--retrace-baseline=v1", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines([
        "*retrace gate: FAILED*",
        f"  nothing compared: baseline {saved} shares no test with this run (a renamed model, strategy or "
        "budget, or other cases?); baseline groups: cand implicit r=10 (5 verdict(s)); run groups: renamed "
        "implicit r=10 (1 verdict(s))",
    ])
    assert _gate(project, "renamed")["passed"] is False


@pytest.mark.desktop
def test_a_case_file_that_does_not_load_is_named_with_its_error(project: pytest.Pytester) -> None:
    """`retrace run` (exit 4) and the gate name the file and say why, also where --tb=no hides pytest's own
    report of collection errors."""
    from tests.helpers import VALID, write_case

    broken = dict(VALID, t_seed=9)  # past the end of its 4-step trajectory
    write_case(project.path / "cases" / "mousepad", "broken", broken)
    why = "cases/mousepad/broken.yaml: t_seed: 9 is out of range 0..3 (len(trajectory))"
    retrace = Path(sys.executable).with_name("retrace")
    run = subprocess.run([str(retrace), "run", "--model", "oracle", "-k", "typo-short", "--retrace-run=m",
                          "-p", "no:cacheprovider"],
                         cwd=project.path, capture_output=True, text=True, timeout=600)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"retrace run: 1 case file(s) could not be loaded:\n  {why}\n" in run.stderr, run.stderr
    listed = f"1 case file(s) could not be loaded (not in any rate):\n  {why}\n"
    assert listed in run.stdout, run.stdout[-3000:]
    assert summary(project, "m")["run"]["case_file_errors"] == [
        {"file": "cases/mousepad/broken.yaml", "error": why.split(": ", 1)[1]}]
    res = project.runpytest_subprocess("--retrace-model=oracle", "-k", "typo-short", "--retrace-run=g",
                                       "--retrace-max-errors=0", "-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*retrace gate: FAILED*", f"  1 case file(s) could not be loaded: {why}"])
    assert _gate(project, "g")["problems"] == [f"1 case file(s) could not be loaded: {why}"]


def test_an_error_is_cut_between_words_on_a_terminal_only() -> None:
    from pytest_retrace.results.progress import _why

    message = ("could not reproduce the recorded states (tolerance 0 px): attempt 3: error state off: "
               "1024000 px differ within x=0..1279, y=0..799 (SSIM 0.1234)")
    failure = Failure(stage="reconstruct", kind="desync", message=message)
    record = rec("c", None).model_copy(update={"error": failure})
    assert _why(record) == f"desync at reconstruct: {message}"  # a log: every word
    cut = _why(record, 60).removeprefix("desync at reconstruct: ")
    assert cut == "could not reproduce the recorded states (tolerance 0 px): …" and len(cut) <= 60
    assert _why(record, 200) == _why(record)
