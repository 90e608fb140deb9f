"""Calibration of the built-in suite on real runs: the baselines over every case in cases/, three times.

- composition: >= 40 cases, >= 5 domains, both horizons, >= 5 hidden-state and >= 5 visual-only cases;
- noop recovers 0 %, oracle 100 %, undo lies strictly in between;
- every hidden-state case: R_O true, R_TC false under noop; every visual-only case: the reverse;
- determinism: each baseline's verdict (and R_O, R_TC) on each case is identical over 3 runs;
- the docker environment (a fresh container of the desktop image per case) gives every baseline the same
  verdict, R_O and R_TC on every case as xvfb's first run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from pytest_retrace.cases import load_case

from .conftest import REPO

RUNS = 3
MODELS = ("noop", "oracle", "undo")
CASES = [load_case(p) for p in sorted((REPO / "cases").rglob("*.yaml"))]


def run_suite(reports: Path, env: str = "xvfb", runs: int = RUNS, workers: int = 2) -> list[list[dict]]:
    out = []
    for i in range(runs):
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", f"--retrace-model={','.join(MODELS)}", f"--retrace-run={env}{i}",
             f"--retrace-report-dir={reports}", f"--retrace-env={env}", "-n", str(workers), "-p", "no:cacheprovider",
             "-q"],
            cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=3000,
        )
        print(f"{env} run {i}: exit {proc.returncode} in {time.monotonic() - start:.0f} s")
        assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
        lines = (reports / f"{env}{i}" / "results.jsonl").read_text().splitlines()
        out.append([json.loads(line) for line in lines])
    return out


def by_model(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["model"]].append(r)
    return out


def test_suite_composition() -> None:
    assert len(CASES) >= 40
    domains = {c.task.domain for c in CASES}
    assert len(domains) >= 5, domains
    assert {c.horizon for c in CASES} == {"short", "long"}
    assert {c.d for c in CASES} == {1, 5}
    kinds = [c.metadata["kind"] for c in CASES]
    assert kinds.count("hidden-state") >= 5 and kinds.count("visual-only") >= 5
    assert all(c.metadata.get("ground_truth") and c.metadata.get("mistake") for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES)


def check_every_run_is_complete_and_error_free(runs: list[list[dict]]) -> None:
    for records in runs:
        assert len(records) == len(CASES) * len(MODELS)
        errors = [(r["case"], r["model"], r["error"]) for r in records if r["verdict"] == "error"]
        assert errors == []


def check_noop_recovers_nothing_and_oracle_everything(runs: list[list[dict]]) -> None:
    for records in runs:
        models = by_model(records)
        assert [r["case"] for r in models["noop"] if r["recovered"]] == []
        assert [r["case"] for r in models["oracle"] if not r["recovered"]] == []


def check_undo_lies_strictly_between(runs: list[list[dict]]) -> None:
    undo = by_model(runs[0])["undo"]
    recovered = sum(r["recovered"] for r in undo)
    assert 0 < recovered < len(undo), f"undo recovered {recovered}/{len(undo)}"


def check_hidden_state_and_visual_only_cases_need_both_halves_of_the_oracle(runs: list[list[dict]]) -> None:
    kind = {c.id: c.metadata["kind"] for c in CASES}
    noop = by_model(runs[0])["noop"]
    hidden = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] in ("hidden-state", "subtle")]
    visual = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] == "visual-only"]
    assert sum(kind[c] == "hidden-state" for c, _, _ in hidden) >= 5 and len(visual) >= 5
    assert all(ro and not rtc for _, ro, rtc in hidden), hidden  # only R_TC catches them
    assert all(rtc and not ro for _, ro, rtc in visual), visual  # only R_O catches them


def check_verdicts_are_deterministic_over_three_runs(runs: list[list[dict]]) -> None:
    seen: dict[tuple[str, str], set[tuple]] = defaultdict(set)
    for records in runs:
        for r in records:
            seen[(r["case"], r["model"])].add((r["verdict"], r["r_o"], r["r_tc"]))
    flips = {k: v for k, v in seen.items() if len(v) > 1}
    print(f"flip count over {RUNS} runs: {len(flips)}")
    assert flips == {}


def check_docker_gives_the_xvfb_verdicts(runs: list[list[dict]], docker: list[dict]) -> None:
    def verdicts(records: list[dict]) -> dict[tuple[str, str], tuple]:
        return {(r["case"], r["model"]): (r["verdict"], r["r_o"], r["r_tc"]) for r in records}

    xvfb, dock = verdicts(runs[0]), verdicts(docker)
    assert len(dock) == len(CASES) * len(MODELS)
    differ = {k: (xvfb.get(k), v) for k, v in dock.items() if xvfb.get(k) != v}
    errors = {k: r["error"] for r in docker if r["verdict"] == "error" for k in [(r["case"], r["model"])]}
    print(f"docker vs xvfb: {len(differ)} of {len(dock)} differ")
    assert differ == {}, f"(xvfb, docker) verdict, R_O, R_TC: {differ}; docker errors: {errors}"


def docker_engine() -> bool:
    try:
        import docker

        docker.from_env(timeout=10).ping()
        return True
    except Exception:  # noqa: BLE001 - no SDK, no engine, no permission
        if os.environ.get("RETRACE_REQUIRE_DOCKER") == "1":
            raise
        return False


CHECKS = [check_every_run_is_complete_and_error_free, check_noop_recovers_nothing_and_oracle_everything,
          check_undo_lies_strictly_between, check_hidden_state_and_visual_only_cases_need_both_halves_of_the_oracle,
          check_verdicts_are_deterministic_over_three_runs]


def test_builtin_suite_calibration_and_determinism(tmp_path: Path) -> None:
    # One test, not one per property: the three suite runs (~15 min) must happen once per session,
    # on one xdist worker. Every property is checked and all failures are reported together.
    runs = run_suite(tmp_path, workers=4)  # cases mostly wait: 4 workers on 2 cores (measured: no flips at -n 8)
    failures = []
    for check in CHECKS:
        try:
            check(runs)
        except AssertionError as exc:
            failures.append(f"{check.__name__}: {exc}")
    if docker_engine():  # required under CI (RETRACE_REQUIRE_DOCKER=1): there a missing engine raises
        try:
            # -n 8: containers mostly wait (settling, app starts); measured 7 min for the 159 tests here, alone
            docker = run_suite(tmp_path, env="docker", runs=1, workers=8)[0]
            check_docker_gives_the_xvfb_verdicts(runs, docker)
        except AssertionError as exc:
            failures.append(f"check_docker_gives_the_xvfb_verdicts: {exc}")
    else:
        import warnings

        warnings.warn("no docker engine: the docker half of the calibration did not run", stacklevel=1)
    assert not failures, "\n".join(failures)
