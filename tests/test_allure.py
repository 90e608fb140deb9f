"""Allure results of a real run under xdist (allure-pytest's --alluredir): labels, parameters, a step per stage,
screenshots, failed vs broken, categories; and the HTML the Allure generator makes of them, when it is installed
(scripts/bootstrap puts it in .tools/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.desktop

PARAMS = ("model", "strategy", "budget", "run", "domain", "kind", "horizon")
STAGES = ["reset", "prefix", "verify s_target", "perturbation", "verify s_error", "context", "recovery", "R_O",
          "suffix", "R_TC"]


def _generator() -> str | None:
    local = REPO / ".tools" / "node_modules" / ".bin" / "allure"
    return str(local) if local.is_file() else os.environ.get("RETRACE_ALLURE") or shutil.which("allure")


def _by_test(results: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in results.glob("*-result.json"):
        data = json.loads(path.read_text())
        out[data["fullName"].split(".")[-1].split("#")[0] + ":" + data["name"]] = data
    return out


def _set_up_steps(results: Path, test_uuid: str) -> list[dict[str, Any]]:
    """The steps of the retrace_result fixture that ran for this test (a container per fixture run)."""
    for path in results.glob("*-container.json"):
        data = json.loads(path.read_text())
        if test_uuid in data.get("children", []):
            for before in data.get("befores", []):
                if before["name"] == "retrace_result":
                    return before["steps"]
    raise AssertionError(f"no retrace_result set-up for {test_uuid}")


@pytest.fixture(scope="module")
def allure_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One real run under -n 2: the noop fails typo-short on R_TC only, the oracle recovers it, and a case
    whose app is not installed is an infrastructure error for both; twice each (--retrace-runs 2)."""
    root = tmp_path_factory.mktemp("allure-project")
    shutil.copytree(REPO / "tests" / "data" / "cases", root / "cases")
    shutil.copytree(REPO / "agents", root / "agents")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = cases\n")
    broken = root / "cases" / "mousepad" / "overwrite-long.yaml"
    broken.write_text(broken.read_text().replace("command: [mousepad,", "command: [no-such-editor,"))
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("envtmp"))}
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "pytest"), "--retrace-model=noop,oracle", "--retrace-runs=2", "-n", "2",
         "-k", "typo-short or overwrite-long", "--alluredir=allure-results", "-p", "no:cacheprovider",
         "--retrace-run=al"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
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
    assert len(names) == 4 and any("R_TC only" in n for n in names) and any("R_O only" in n for n in names)
    [noop] = [t for t in _by_test(results).values() if t["status"] == "failed" and label(t, "run") == "1"]
    matched = [c["name"] for c in categories if "messageRegex" in c
               and re.fullmatch(c["messageRegex"], noop["statusDetails"]["message"])]
    assert len(matched) == 1 and "R_TC only" in matched[0], noop["statusDetails"]["message"]


def test_every_stage_is_a_step_with_its_timing(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    tests = _by_test(results)
    [noop] = [t for t in tests.values() if label(t, "model") == "noop" and t["status"] == "failed"
              and label(t, "run") == "1"]
    steps = _set_up_steps(results, noop["uuid"])
    names = [s["name"] for s in steps]
    assert [next(n for n in names if n.startswith(stage)) for stage in STAGES], names
    assert [n.split(":")[0].split(" (")[0] for n in names] == [
        "reset", "prefix", "verify s_target", "perturbation", "verify s_error", "context", "recovery", "R_O",
        "suffix", "R_TC"], names
    assert all(s["stop"] >= s["start"] for s in steps)
    recovery = steps[names.index(next(n for n in names if n.startswith("recovery")))]
    assert [t["name"] for t in recovery["steps"]] == ["turn 1: done()"]
    r_o, r_tc = steps[-3], steps[-1]
    assert re.fullmatch(r"R_O: SSIM 0\.\d{4} >= 0\.99", r_o["name"]) and r_o["status"] == "passed"
    assert r_tc["name"] == "R_TC: evaluator score 0" and r_tc["status"] == "failed"
    assert "Hello xyzworld" in r_tc["statusDetails"]["message"]
    [broken] = [t for t in tests.values() if label(t, "model") == "oracle" and t["status"] == "broken"
                and label(t, "run") == "1"]
    [reset] = _set_up_steps(results, broken["uuid"])
    assert reset["status"] == "broken" and "no-such-editor" in reset["statusDetails"]["message"]


def test_screenshots_heatmap_actions_and_evaluator_are_attached(allure_run: tuple[Path, Path]) -> None:
    _, results = allure_run
    [noop] = [t for t in _by_test(results).values() if label(t, "model") == "noop" and t["status"] == "failed"
              and label(t, "run") == "1"]
    attached = {a["name"]: results / a["source"] for a in noop["attachments"]}
    for name in ("target (s_target)", "error (s_error)", "recovered", "SSIM heatmap (red: low SSIM to the target)"):
        assert attached[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    target = REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short" / "target.png"
    assert attached["target (s_target)"].read_bytes() == target.read_bytes()
    actions = attached["actions"].read_text()
    assert "recover  done()" in actions and "noop baseline" in actions and "suffix" in actions
    assert "'Hello xyzworld' != 'Hello world'" in attached["evaluator"].read_text()
    record = json.loads(attached["record"].read_text())
    assert (record["verdict"], record["r_o"], record["r_tc"]) == ("not_recovered", True, False)


def test_the_generator_turns_the_results_into_html_with_the_screenshots(allure_run: tuple[Path, Path]) -> None:
    generator = _generator()
    if generator is None:
        pytest.skip("no Allure generator installed (scripts/bootstrap installs it in .tools/ when it can)")
    root, results = allure_run
    html = root / "allure-report"
    proc = subprocess.run([generator, "generate", str(results), "-o", str(html), "--clean"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (html / "index.html").is_file()
    pngs = {p.read_bytes() for p in (html / "data" / "attachments").glob("*.png")}
    target = REPO / "tests" / "data" / "cases" / "mousepad" / "typo-short" / "target.png"
    assert target.read_bytes() in pngs
    cases = [json.loads(p.read_text()) for p in (html / "data" / "test-cases").glob("*.json")]
    failed = [c for c in cases if c["status"] == "failed"]
    assert len(failed) == 2 and len(cases) == 8
    names = {a["name"] for c in failed for stage in c["testStage"].get("attachments", []) for a in [stage]}
    assert {"recovered", "target (s_target)", "SSIM heatmap (red: low SSIM to the target)"} <= names
    categories = json.loads((html / "data" / "categories.json").read_text())
    assert any("R_TC only" in child["name"] for child in categories["children"])
