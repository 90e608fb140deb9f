"""Allure results of a real run under xdist (allure-pytest's --alluredir): labels, parameters, a step per stage in
the test body, a test's duration that covers the replay, screenshots in their stages, no bookkeeping fixtures in
set-up and tear-down, failed vs broken, a case file that did not load, categories; and the HTML the Allure
generator makes of them, when it is installed (scripts/bootstrap puts it in .tools/)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.desktop

PARAMS = ("model", "strategy", "budget", "run", "domain", "kind", "horizon")
STAGES = ["reset", "prefix", "verify s_target", "perturbation", "verify s_error", "context", "recovery", "R_O",
          "suffix", "R_TC"]


def _generator() -> str | None:
    local = REPO / ".tools" / "node_modules" / ".bin" / "allure"
    return str(local) if local.is_file() else os.environ.get("RETRACE_ALLURE") or shutil.which("allure")


def _results(results: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in results.glob("*-result.json")]


def _by_test(results: Path) -> dict[str, dict[str, Any]]:
    """The recovery tests' results (a case file that did not load has no model label)."""
    return {t["fullName"].split(".")[-1].split("#")[0] + ":" + t["name"]: t for t in _results(results)
            if any(lb["name"] == "model" for lb in t["labels"])}


def _containers(results: Path, test_uuid: str) -> list[dict[str, Any]]:
    """The fixture containers Allure shows as this test's Set up and Tear down."""
    containers = [json.loads(path.read_text()) for path in results.glob("*-container.json")]
    return [c for c in containers if test_uuid in c.get("children", [])]


def _step(steps: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    [step] = [s for s in steps if s["name"].startswith(prefix)]
    return step


def _attachments(item: dict[str, Any]) -> list[str]:
    return [a["name"] for a in item.get("attachments", [])]


@pytest.fixture(scope="module")
def allure_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One real run under -n 2: the noop fails typo-short on R_TC only, the oracle recovers it, and a case
    whose app is not installed is an infrastructure error for both; twice each (--retrace-runs 2); and a case
    file that does not load."""
    root = tmp_path_factory.mktemp("allure-project")
    shutil.copytree(REPO / "tests" / "data" / "cases", root / "cases")
    shutil.copytree(REPO / "agents", root / "agents")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = cases\n")
    broken = root / "cases" / "mousepad" / "overwrite-long.yaml"
    broken.write_text(broken.read_text().replace("command: [mousepad,", "command: [no-such-editor,"))
    typo = root / "cases" / "mousepad" / "typo-short.yaml"
    (root / "cases" / "mousepad" / "bad-wait.yaml").write_text(  # does not load: every worker fails on it
        typo.read_text().replace("  - pyautogui.write('world')", "  - {action: wait, seconds: null}"))
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("envtmp"))}
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "pytest"), "--retrace-model=noop,oracle", "--retrace-runs=2", "-n", "2",
         "-k", "typo-short or overwrite-long", "--alluredir=allure-results", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", "--retrace-run=al"],
        check=False, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    return root, root / "allure-results"


def test_each_test_is_one_result_with_its_labels_and_non_excluded_parameters(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    tests = _by_test(results)
    assert len(tests) == 8, sorted(tests)
    # models and repeated runs are different tests, never retries of one: all history ids differ
    assert len({t["historyId"] for t in tests.values()}) == 8
    for t in tests.values():
        labels = {label["name"]: label["value"] for label in t["labels"]}
        params = {p["name"]: p for p in t["parameters"]}
        for name in PARAMS:
            assert name in labels, (t["name"], name)
            assert not params[name].get("excluded"), (t["name"], name)
        assert params["retrace_run"]["excluded"] is True and params["retrace_run"]["mode"] == "hidden"
        assert labels["parentSuite"] == f"{labels['model']} · {labels['strategy']} · r=10"
        assert labels["domain"] == labels["suite"] == "text-editor"
        run = f" · run {labels['run']}"
        assert t["name"].endswith(f"[{labels['model']} · {labels['strategy']} · r=10{run}]"), t["name"]
    runs = sorted((label(t, "model"), label(t, "run")) for t in tests.values() if "typo-short" in t["name"])
    assert runs == [("noop", "1"), ("noop", "2"), ("oracle", "1"), ("oracle", "2")]


def label(test: dict[str, Any], name: str) -> str:
    [value] = [lb["value"] for lb in test["labels"] if lb["name"] == name]
    return value


def test_a_failed_recovery_is_failed_an_infrastructure_error_is_broken(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    status = {(label(t, "model"), t["name"].split(" ")[0], label(t, "run")): t["status"]
              for t in _by_test(results).values()}
    for run in ("1", "2"):
        assert status["noop", "typo-short", run] == "failed"
        assert status["oracle", "typo-short", run] == "passed"
        assert status["noop", "overwrite-long", run] == status["oracle", "overwrite-long", run] == "broken"
    categories = json.loads((results / "categories.json").read_text())
    names = [c["name"] for c in categories]
    assert len(names) == 5 and any("R_TC only" in n for n in names) and any("R_O only" in n for n in names)
    [noop] = [t for t in _by_test(results).values() if t["status"] == "failed" and label(t, "run") == "1"]
    matched = [c["name"] for c in categories if "failed" in c["matchedStatuses"]
               and re.fullmatch(c["messageRegex"], noop["statusDetails"]["message"])]
    assert len(matched) == 1 and "R_TC only" in matched[0], noop["statusDetails"]["message"]


def _noop_failed(results: Path) -> dict[str, Any]:
    [noop] = [t for t in _by_test(results).values() if label(t, "model") == "noop" and t["status"] == "failed"
              and label(t, "run") == "1"]
    return noop


def test_every_stage_is_a_step_of_the_test_body_with_its_timing(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    tests = _by_test(results)
    noop = _noop_failed(results)
    steps = noop["steps"]
    names = [s["name"] for s in steps]
    assert [n.split(":")[0].split(" (")[0] for n in names] == STAGES, names
    assert all(s["stop"] >= s["start"] for s in steps)
    assert all(a["stop"] <= b["start"] for a, b in itertools.pairwise(steps)), "stages run one after another"
    recovery = _step(steps, "recovery")
    assert [t["name"] for t in recovery["steps"]] == ["turn 1: done()"]
    r_o, r_tc = steps[-3], steps[-1]
    assert re.fullmatch(r"R_O: SSIM 0\.\d{4} >= 0\.99", r_o["name"]) and r_o["status"] == "passed"
    assert r_tc["name"] == "R_TC: evaluator score 0" and r_tc["status"] == "failed"
    assert "Hello xyzworld" in r_tc["statusDetails"]["message"]
    [broken] = [t for t in tests.values() if label(t, "model") == "oracle" and t["status"] == "broken"
                and label(t, "run") == "1"]
    # a reset is retried like any reconstruction attempt (--retrace-attempts, 3 by default): each one broken
    resets = broken["steps"]
    assert [s["name"] for s in resets] == ["reset", "reset (attempt 2)", "reset (attempt 3)"]
    assert all(s["status"] == "broken" and "no-such-editor" in s["statusDetails"]["message"] for s in resets)


def test_a_tests_duration_covers_its_replay(allure_run: tuple[Path, Path]) -> None:
    """The replay runs in set-up; allure-pytest alone starts a test's clock at the call (0.2 s of a 10 s test)."""
    _, results = allure_run
    for t in _by_test(results).values():
        steps = t["steps"]
        assert steps, t["name"]
        assert t["start"] <= steps[0]["start"] and steps[-1]["stop"] <= t["stop"], t["name"]
    noop = _noop_failed(results)
    # a noop replay (reset, prefix, perturbation, two checks, suffix, evaluator) takes seconds; allure-pytest's
    # own clock gave the assertion alone (165-194 ms measured)
    assert noop["stop"] - noop["start"] >= 2000, "the replay's time belongs to the test"


def test_screenshots_and_outputs_are_in_their_stages_steps(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    noop = _noop_failed(results)
    steps = noop["steps"]
    where = {name: s["name"] for s in steps for name in _attachments(s)}
    r_o = _step(steps, "R_O")["name"]
    assert where == {"target (s_target)": "verify s_target", "error (s_error)": "verify s_error",
                     "actions": _step(steps, "recovery")["name"], "recovered": r_o,
                     "SSIM heatmap (red: low SSIM to the target)": r_o,
                     "evaluator": "R_TC: evaluator score 0"}, where
    assert _attachments(noop) == ["record"]
    files = {a["name"]: results / a["source"] for s in [noop, *steps] for a in s.get("attachments", [])}
    for name in ("target (s_target)", "error (s_error)", "recovered", "SSIM heatmap (red: low SSIM to the target)"):
        assert files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    target = REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short" / "target.png"
    assert files["target (s_target)"].read_bytes() == target.read_bytes()
    actions = files["actions"].read_text()
    assert "recover  done()" in actions and "noop baseline" in actions and "suffix" in actions
    assert "'Hello xyzworld' != 'Hello world'" in files["evaluator"].read_text()
    record = json.loads(files["record"].read_text())
    assert (record["verdict"], record["r_o"], record["r_tc"]) == ("not_recovered", True, False)
    # the oracle replays the prefix inside its turn: its own verify step does not take the case's target
    [oracle] = [t for t in _by_test(results).values() if label(t, "model") == "oracle" and t["status"] == "passed"
                and label(t, "run") == "1"]
    turn = _step(oracle["steps"], "recovery")["steps"][0]
    assert turn["steps"] and not any(_attachments(s) for s in turn["steps"]), turn
    assert "target (s_target)" in _attachments(_step(oracle["steps"], "verify s_target"))


def test_set_up_and_tear_down_show_the_desktop_not_the_harness_bookkeeping(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    for t in _by_test(results).values():
        containers = _containers(results, t["uuid"])
        befores = sorted(b["name"] for c in containers for b in c.get("befores", []))
        afters = [(a["name"], a.get("status")) for c in containers for a in c.get("afters", [])]
        assert befores == ["retrace_env"], (t["name"], befores)
        # the desktop's close, which ends: no tear-down without a status (pytest's own finalizer)
        assert afters in ([], [("retrace_env::1", "passed")]), (t["name"], afters)


def test_a_case_file_that_did_not_load_is_broken_naming_the_file_and_the_error(
        allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    [bad] = [t for t in _results(results) if "bad-wait" in t["name"]]  # once, though both workers collected it
    assert bad["status"] == "broken" and bad["name"] == "cases/mousepad/bad-wait.yaml (did not load)"
    message = bad["statusDetails"]["message"]
    assert "cases/mousepad/bad-wait.yaml" in message, message
    assert "trajectory[1]: wait: seconds must be a number, got None" in message, message
    categories = json.loads((results / "categories.json").read_text())

    def categories_of(message: str) -> list[str]:  # Allure 2 matches the whole message: fullmatch
        return [c["name"] for c in categories if "broken" in c["matchedStatuses"]
                and re.fullmatch(c["messageRegex"], message)]

    assert categories_of(message) == ["Case files that did not load"]
    infra = next(t for t in _by_test(results).values() if t["status"] == "broken")["statusDetails"]["message"]
    assert categories_of(infra) == ["Infrastructure errors (excluded from rates)"]


def test_the_generator_turns_the_results_into_html_with_the_screenshots(allure_run: tuple[Path, Path]) -> None:
    generator = _generator()
    if generator is None:
        pytest.skip("no Allure generator installed (scripts/bootstrap installs it in .tools/ when it can)")
    root, results = allure_run
    html = root / "allure-report"
    proc = subprocess.run([generator, "generate", str(results), "-o", str(html), "--clean"], check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (html / "index.html").is_file()
    pngs = {p.read_bytes() for p in (html / "data" / "attachments").glob("*.png")}
    target = REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short" / "target.png"
    assert target.read_bytes() in pngs
    cases = [json.loads(p.read_text()) for p in (html / "data" / "test-cases").glob("*.json")]
    failed = [c for c in cases if c["status"] == "failed"]
    assert len(failed) == 2 and len(cases) == 9  # 8 tests and the case file that did not load
    for case in failed:
        steps = {s["name"]: s for s in case["testStage"]["steps"]}
        r_o = next(s for name, s in steps.items() if name.startswith("R_O"))
        assert {a["name"] for a in r_o["attachments"]} == {"recovered", "SSIM heatmap (red: low SSIM to the target)"}
        assert [a["name"] for a in steps["verify s_target"]["attachments"]] == ["target (s_target)"]
        assert case["time"]["duration"] >= 2000, case["time"]  # the replay's time is the test's
    # the generator groups a category's tests by message
    categories = {c["name"]: {t["name"] for group in c["children"] for t in group["children"]}
                  for c in json.loads((html / "data" / "categories.json").read_text())["children"]}
    assert any("R_TC only" in name for name in categories)
    assert categories["Case files that did not load"] == {"cases/mousepad/bad-wait.yaml (did not load)"}
    assert len(categories["Infrastructure errors (excluded from rates)"]) == 4, categories


def test_a_case_file_that_did_not_load_without_xdist_and_nothing_when_only_listing(
        pytester: pytest.Pytester) -> None:
    """The single-process path (no xdist controller), where collection stops the run; no desktop starts."""
    typo = REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short.yaml"
    cases = pytester.path / "cases"
    cases.mkdir()
    (cases / "bad-wait.yaml").write_text(
        typo.read_text().replace("  - pyautogui.write('world')", "  - {action: wait, seconds: null}"))
    shutil.copytree(REPO / "agents", pytester.path / "agents")
    args = ["--retrace-model=noop", "--retrace-cases=cases", "--retrace-agents=agents", "-p", "no:cacheprovider",
            "--retrace-run=al", "cases"]
    res = pytester.runpytest_subprocess(*args, "--alluredir=listed", "--collect-only")
    assert res.ret == pytest.ExitCode.TESTS_FAILED, res.stdout.str()
    assert not list((pytester.path / "listed").glob("*-result.json"))
    res = pytester.runpytest_subprocess(*args, "--alluredir=results")
    assert res.ret != pytest.ExitCode.OK, res.stdout.str()
    res.stdout.fnmatch_lines(["*1 error*"])
    [bad] = _results(pytester.path / "results")
    assert (bad["status"], bad["name"]) == ("broken", "cases/bad-wait.yaml (did not load)")
    assert bad["statusDetails"]["message"] == (
        f"case file did not load: {cases / 'bad-wait.yaml'}: trajectory[1]: wait: seconds must be a number, got None")
