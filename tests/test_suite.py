"""Calibration of the built-in suite (issue 11's bar), within CI's time:

- composition: >= 150 cases over >= 6 apps and >= 8 domains; every kind (visible, subtle, hidden-state,
  visual-only) >= 20 cases; short (d = 1, one action) and long horizon (d = 5, 3..5 actions); kinds measured
  (hidden-state iff the error PNG equals the target PNG), every such case carries a probe;
- the FULL suite, every baseline, at -n 16 on this 2-core machine, recorded in ``cases/calibration.json``
  (``python -m tests.suite_calibration``): it must cover exactly the cases of this checkout, byte for byte, and
  show 0 infrastructure errors, noop 0 %, oracle 100 %, undo strictly in between; every hidden-state (and
  subtle) case R_O true / R_TC false under noop, every visual-only case the reverse; every probe not restored
  under noop and restored under the oracle;
- in every CI run, a fixed SAMPLE (the first case, by id, of every app x kind: 26 cases) three times at -n 16:
  0 infrastructure errors, and every (case, baseline) verdict, R_O and R_TC the recorded one each time, so 0
  flips over 4 runs;
- the docker environment (a fresh container per case) on one case per app: the recorded verdicts.

Why the full suite is recorded rather than run in every CI run: it takes 25 to 30 minutes of this machine's two
cores with nothing else running, and CI's other tests take about 20 more, so CI would pass 45 minutes (it
did: 53 and 66 minutes, and next to the other tests' desktops the 16 workers' runs came out with
infrastructure errors the quiet machine never shows). What a code change can break shows on the sample (every
app, every kind, every kind of check); what a case change can break is caught by the digests: the recorded run
no longer covers the suite until it is run again. A flip comes from an app's timing, which the sample covers
per app and kind, three times.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_retrace.replay.cases import KINDS, load_case
from pytest_retrace.replay.sample import app, pick
from tests import suite_calibration as calibration
from tests.helpers import docker_client
from tests.suite_calibration import MODELS, run_suite

FILES = calibration.case_files()
CASES = {p: load_case(p) for p in FILES}


def sample() -> list[Path]:
    """CI's fixed sample: the first case, by id, of every app x kind (26 of 251 cases), which is what
    ``--retrace-sample 1`` runs (the README's first command)."""
    chosen = pick(CASES.values(), 1)
    return sorted(path for path, case in CASES.items() if case.id in chosen)


def one_per_app() -> list[Path]:
    """The docker half's cases: the first case, by id, of each app. What the docker provider can change is per
    app (the image's packages, fonts and profiles, how an app starts in a container), not per kind."""
    first: dict[str, Path] = {}
    for path, case in sorted(CASES.items(), key=lambda item: item[1].id):
        first.setdefault(app(case), path)
    return sorted(first.values())


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


def recorded() -> list[dict]:
    """The recorded full run as records (the fields the checks read)."""
    return [{"case": case_id, "model": model, "recovered": o["verdict"] == "recovered", "verdict": o["verdict"],
             "r_o": o["r_o"], "r_tc": o["r_tc"], "error": o["error"],
             "probes": [{"restored": x} for x in o["probes_restored"]]}
            for case_id, entry in calibration.load()["cases"].items() for model, o in entry["runs"].items()]


def test_the_recorded_full_calibration_is_of_this_suite_and_meets_the_bar() -> None:
    data = calibration.load()
    assert data["schema"] == calibration.SCHEMA and data["workers"] == 16
    now = {case.id: path for path, case in CASES.items()}
    stale = sorted(c for c in now.keys() & data["cases"].keys()
                   if calibration.case_digest(now[c]) != data["cases"][c]["digest"])
    assert (sorted(now.keys() - data["cases"].keys()), sorted(data["cases"].keys() - now.keys()), stale) == \
        ([], [], []), "cases (added, removed, changed) since the recorded calibration: run python -m tests.suite_calibration"
    records = recorded()
    failures = []
    for check, args in ((check_complete_and_error_free, (records, len(FILES))), (check_calibration, (records,)),
                        (check_each_kind_needs_its_half_of_the_oracle, (records,)),
                        (check_probes_fail_under_noop_and_pass_under_the_oracle, (records,))):
        try:
            check(*args)
        except AssertionError as exc:
            failures.append(f"{check.__name__}: {exc}")
    assert not failures, "\n".join(failures)


def test_sample_covers_every_app_and_kind() -> None:
    picked = [CASES[p] for p in sample()]
    assert {(app(c), c.metadata["kind"]) for c in picked} == {(app(c), c.metadata["kind"]) for c in CASES.values()}
    assert {app(c) for c in picked} == {app(CASES[p]) for p in one_per_app()}


@pytest.mark.calibration
def test_a_fixed_sample_reproduces_the_recorded_calibration_three_times(tmp_path: Path) -> None:
    # One test, not one per property: the runs must happen once per session, on one xdist worker. Every
    # property is checked and all failures are reported together.
    expected = verdicts(recorded())
    picked = sample()
    failures = []
    seen: dict[tuple[str, str], set[tuple]] = defaultdict(set)
    for i in (1, 2, 3):
        records, _ = run_suite(tmp_path, f"sample{i}", files=picked, workers=16)
        try:
            check_complete_and_error_free(records, len(picked))
        except AssertionError as exc:
            failures.append(f"run {i}: {exc}")
        for key, value in verdicts(records).items():
            seen[key].add(value)
    differ = {k: (expected.get(k), sorted(v, key=str)) for k, v in seen.items() if v != {expected.get(k)}}
    print(f"sample of {len(picked)} cases, 3 runs: {len(differ)} (case, baseline) pairs not always the recorded verdict")
    if differ:
        failures.append(f"(recorded, seen in 3 runs) verdict, R_O, R_TC: {differ}")
    if docker_client() is not None:  # required under CI (RETRACE_REQUIRE_DOCKER=1): there a missing engine raises
        apps = one_per_app()
        docker, _ = run_suite(tmp_path, "docker", files=apps, env="docker", workers=8)
        differ = {k: (expected.get(k), v) for k, v in verdicts(docker).items() if expected.get(k) != v}
        print(f"docker vs the recorded xvfb run: {len(differ)} of {len(docker)} differ")
        if differ or len(docker) != len(apps) * len(MODELS):
            errors = {(r["case"], r["model"]): r["error"] for r in docker if r["verdict"] == "error"}
            failures.append(f"docker: (recorded, docker) verdict, R_O, R_TC: {differ}; docker errors: {errors}")
    else:
        import warnings

        warnings.warn("no docker engine: the docker half of the calibration did not run", stacklevel=1)
    assert not failures, "\n".join(failures)
