"""Calibration of the built-in suite on real runs (issue 11's bar), within CI's time:

- composition: >= 150 cases over >= 6 apps and >= 8 domains; every kind (visible, subtle, hidden-state,
  visual-only) >= 20 cases; short (d = 1, one action) and long horizon (d = 5, 3..5 actions); kinds measured
  (hidden-state iff the error PNG equals the target PNG), every such case carries a probe;
- the FULL suite once, every baseline, at -n 16 on this 2-core machine: 0 infrastructure errors, noop 0 %,
  oracle 100 %, undo strictly in between; every hidden-state (and subtle) case R_O true / R_TC false under
  noop, every visual-only case the reverse; every probe not restored under noop and restored under the oracle;
- determinism: a fixed SAMPLE (the first case of every app, by id) twice more, so each of its (case, baseline)
  verdicts, R_O and R_TC is seen 3 times: 0 flips;
- the docker environment (a fresh container per case) on one case per app: the verdicts of xvfb's full run.

Why not the full suite three times and under docker: a full run of the baselines takes over 20 minutes here,
next to the other tests, so that would take CI past its 45 (a sample of one case per domain x kind, 34 cases,
twice more did too: about 50 minutes in all). A flip comes from an app's timing, and what docker can change is
per app (the image), so the sample is one case per app; the full run at -n 16 is the harshest load, where a
timing problem of any case shows as an infrastructure error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

from pytest_retrace.cases import load_case

from .conftest import REPO, docker_client

MODELS = ("noop", "oracle", "undo")
FILES = sorted((REPO / "cases").glob("*/*.yaml"))
CASES = {p: load_case(p) for p in FILES}
KINDS = ("visible", "subtle", "hidden-state", "visual-only")


def one_per_app() -> list[Path]:
    """The docker half's cases: the first case, by id, of each app. What the docker provider can change is per
    app (the image's packages, fonts and profiles, how an app starts in a container), not per kind."""
    first: dict[str, Path] = {}
    for path, case in sorted(CASES.items(), key=lambda item: item[1].id):
        first.setdefault(app(case), path)
    return sorted(first.values())


def app(case) -> str:
    launch = next(s for s in case.task.setup if s.type == "launch")
    command = launch.command.split() if isinstance(launch.command, str) else launch.command
    program = Path(command[0]).name
    if program == "soffice":  # one binary, two apps: LibreOffice Calc and Writer
        return "soffice " + next(a for a in command[1:] if a in ("--calc", "--writer"))
    return program


def run_suite(reports: Path, name: str, *, files: list[Path] | None = None, env: str = "xvfb",
              workers: int = 16) -> list[dict]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *(map(str, files) if files else []), f"--retrace-model={','.join(MODELS)}",
         f"--retrace-run={name}", f"--retrace-report-dir={reports}", f"--retrace-env={env}", "-n", str(workers),
         "-p", "no:cacheprovider", "-q"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=3000,
    )
    print(f"{name} ({env}, -n {workers}, {len(files or FILES)} cases): exit {proc.returncode} "
          f"in {time.monotonic() - start:.0f} s")
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = (reports / name / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def by_model(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["model"]].append(r)
    return out


def verdicts(records: list[dict]) -> dict[tuple[str, str], tuple]:
    return {(r["case"], r["model"]): (r["verdict"], r["r_o"], r["r_tc"]) for r in records}


def test_suite_composition() -> None:
    cases = list(CASES.values())
    assert len(cases) >= 150, len(cases)
    assert len({app(c) for c in cases}) >= 6, {app(c) for c in cases}
    assert len({c.task.domain for c in cases}) >= 8, {c.task.domain for c in cases}
    kinds = [c.metadata["kind"] for c in cases]
    assert all(kinds.count(k) >= 20 for k in KINDS), {k: kinds.count(k) for k in KINDS}
    assert {c.horizon for c in cases} == {"short", "long"}
    for c in cases:
        n = len(c.perturbation)
        ok = (c.d, n) == (1, 1) if c.horizon == "short" else c.d == 5 and 3 <= n <= 5
        assert ok, f"{c.id}: a {c.horizon}-horizon case with d={c.d} and {n} perturbation action(s)"
        assert c.metadata.get("ground_truth") and c.metadata.get("mistake"), c.id
    assert len({c.id for c in cases}) == len(cases)


def test_kinds_are_measured_and_identical_error_screens_carry_a_probe() -> None:
    for case in CASES.values():
        same = np.array_equal(np.asarray(Image.open(case.target_png).convert("RGB")),
                              np.asarray(Image.open(case.error_png).convert("RGB")))
        assert same == (case.metadata["kind"] == "hidden-state"), (case.id, case.metadata["kind"])
        if same:
            assert case.probes, f"{case.id}: an error screen equal to its target needs a probe"


def check_complete_and_error_free(records: list[dict], n_cases: int) -> None:
    assert len(records) == n_cases * len(MODELS)
    errors = [(r["case"], r["model"], r["error"]) for r in records if r["verdict"] == "error"]
    assert errors == []


def check_calibration(records: list[dict]) -> None:
    models = by_model(records)
    assert [r["case"] for r in models["noop"] if r["recovered"]] == []
    assert [r["case"] for r in models["oracle"] if not r["recovered"]] == []
    recovered = sum(bool(r["recovered"]) for r in models["undo"])
    assert 0 < recovered < len(models["undo"]), f"undo recovered {recovered}/{len(models['undo'])}"


def check_each_kind_needs_its_half_of_the_oracle(records: list[dict]) -> None:
    kind = {c.id: c.metadata["kind"] for c in CASES.values()}
    noop = by_model(records)["noop"]
    only_tc = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] in ("hidden-state", "subtle")]
    only_o = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] == "visual-only"]
    assert all(ro and not rtc for _, ro, rtc in only_tc), [x for x in only_tc if not (x[1] and not x[2])]
    assert all(rtc and not ro for _, ro, rtc in only_o), [x for x in only_o if not (x[2] and not x[1])]


def check_probes_fail_under_noop_and_pass_under_the_oracle(records: list[dict]) -> None:
    with_probes = {c.id for c in CASES.values() if c.probes}
    for r in records:
        if r["case"] in with_probes and r["model"] in ("noop", "oracle"):
            restored = {p["restored"] for p in r["probes"]}
            assert restored == {r["model"] == "oracle"}, (r["case"], r["model"], r["probes"])


def test_builtin_suite_calibration_and_determinism(tmp_path: Path) -> None:
    # One test, not one per property: the runs must happen once per session, on one xdist worker. Every
    # property is checked and all failures are reported together.
    failures = []

    def check(fn, *args) -> None:
        try:
            fn(*args)
        except AssertionError as exc:
            failures.append(f"{fn.__name__}: {exc}")

    full = run_suite(tmp_path, "full", workers=16)
    check(check_complete_and_error_free, full, len(FILES))
    check(check_calibration, full)
    check(check_each_kind_needs_its_half_of_the_oracle, full)
    check(check_probes_fail_under_noop_and_pass_under_the_oracle, full)
    picked = one_per_app()
    ids = {CASES[p].id for p in picked}
    seen: dict[tuple[str, str], set[tuple]] = defaultdict(set)
    for key, value in verdicts(full).items():
        if key[0] in ids:
            seen[key].add(value)
    for i in (1, 2):
        again = run_suite(tmp_path, f"sample{i}", files=picked, workers=16)
        check(check_complete_and_error_free, again, len(picked))
        for key, value in verdicts(again).items():
            seen[key].add(value)
    flips = {k: v for k, v in seen.items() if len(v) > 1}
    print(f"flip count over 3 runs of {len(picked)} sampled cases: {len(flips)}")
    if flips:
        failures.append(f"verdicts flipped: {flips}")
    if docker_client() is not None:  # required under CI (RETRACE_REQUIRE_DOCKER=1): there a missing engine raises
        apps = picked
        docker = run_suite(tmp_path, "docker", files=apps, env="docker", workers=8)
        xvfb = verdicts(full)
        differ = {k: (xvfb.get(k), v) for k, v in verdicts(docker).items() if xvfb.get(k) != v}
        print(f"docker vs xvfb: {len(differ)} of {len(docker)} differ")
        if differ or len(docker) != len(apps) * len(MODELS):
            errors = {(r["case"], r["model"]): r["error"] for r in docker if r["verdict"] == "error"}
            failures.append(f"docker: (xvfb, docker) verdict, R_O, R_TC: {differ}; docker errors: {errors}")
    else:
        import warnings

        warnings.warn("no docker engine: the docker half of the calibration did not run", stacklevel=1)
    assert not failures, "\n".join(failures)

