"""A suite's full calibration, recorded: every case under the three baselines at -n 16, reduced to what the
calibration checks, and written to its ``calibration.json`` with a digest of each case's files. Two suites:
``builtin`` (``cases/``, the default) and ``osworld`` (``cases-osworld/``: this project's OSWorld-format tasks,
judged by OSWorld's own code; their apps need ``RETRACE_OSWORLD_APPS=1 scripts/bootstrap``).

    .venv/bin/python -m tests.suite_calibration          # about 30 minutes on the 2-core machine; commit the file
    .venv/bin/python -m tests.suite_calibration --check  # run it again: the flips against the recorded file
    .venv/bin/python -m tests.suite_calibration --restamp REV  # new digests for cases unchanged since REV
    .venv/bin/python -m tests.suite_calibration --suite osworld [--check [--env docker]]

A check's summary (when, where, how many tests, errors and flips) is added to the record's ``checks``: the record
then says how often it was reproduced, and where.

CI does not run the whole suite (docs in tests/test_suite.py): it checks the recorded run (its properties, and
that it covers exactly the cases of this checkout, byte for byte) and re-runs a fixed sample against it. So a
change to a case fails CI until the suite is calibrated again, the way a snapshot test fails until updated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_retrace.results import provenance

REPO = Path(__file__).resolve().parent.parent
MODELS = ("noop", "oracle", "undo")
SCHEMA = 1


@dataclass(frozen=True)
class Suite:
    name: str
    cases_dir: Path
    env_options: tuple[str, ...] = ()  # --retrace-env-option values a docker run of the suite needs

    @property
    def snapshot(self) -> Path:
        return self.cases_dir / "calibration.json"


SUITES = {"builtin": Suite("builtin", REPO / "cases"),
          "osworld": Suite("osworld", REPO / "cases-osworld", ("variant=osworld",))}
BUILTIN = SUITES["builtin"]
CASES_DIR, SNAPSHOT = BUILTIN.cases_dir, BUILTIN.snapshot


def case_files(suite: Suite = BUILTIN) -> list[Path]:
    return sorted(suite.cases_dir.glob("*/*.yaml"))


def case_digest(path: Path, suite: Suite = BUILTIN) -> str:
    """The case file, every file it references (also in the suite's shared/) and its own directory, by path
    relative to the suite's directory: the package's one case digest, which every run's summary.json records too."""
    return provenance.case_digest(path, suite.cases_dir)


def run_suite(reports: Path, name: str, *, files: list[Path] | None = None, env: str = "xvfb",
              workers: int = 16, timeout: float = 3000, suite: Suite = BUILTIN,
              restore: str = "replay") -> tuple[list[dict], float]:
    """The baselines on `files` (default: the whole suite) as a user runs them; the records and the wall time."""
    start = time.monotonic()
    options = [f"--retrace-env-option={o}" for o in suite.env_options] if env == "docker" else []
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *(map(str, files) if files else []), f"--retrace-model={','.join(MODELS)}",
         f"--retrace-run={name}", f"--retrace-report-dir={reports}", f"--retrace-env={env}", *options,
         *([] if suite is BUILTIN else [f"--retrace-cases={suite.cases_dir}"]), "-n", str(workers),
         f"--retrace-restore={restore}",
         "-p", "no:cacheprovider", "-q"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=timeout, check=False,
    )
    seconds = time.monotonic() - start
    print(f"{name} ({suite.name}, {env}, -n {workers}, --retrace-restore={restore}, "
          f"{len(files or case_files(suite))} cases): "
          f"exit {proc.returncode} in {seconds:.0f} s")
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"pytest exited with {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    lines = (reports / name / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], seconds


def outcome(record: dict) -> dict:
    """What the calibration checks of one test: the verdict, both criteria, the probes, an error's kind."""
    return {"verdict": record["verdict"], "r_o": record["r_o"], "r_tc": record["r_tc"],
            "probes_restored": [p["restored"] for p in record.get("probes") or []],
            "error": (record.get("error") or {}).get("kind")}


def snapshot(records: list[dict], seconds: float, workers: int, suite: Suite = BUILTIN) -> dict:
    from pytest_retrace.replay.cases import load_case

    files = case_files(suite)
    ids = {load_case(p).id: p for p in files}
    by_case: dict[str, dict] = {}
    for r in records:
        by_case.setdefault(r["case"], {})[r["model"]] = outcome(r)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "pytest_retrace"], check=False, cwd=REPO,
                                capture_output=True, text=True).stdout.strip())
    return {
        "schema": SCHEMA,
        "what": "every case under noop, oracle and undo, xvfb, one run (python -m tests.suite_calibration"
                + ("" if suite is BUILTIN else f" --suite {suite.name}") + ")",
        "commit": commit + ("+uncommitted" if dirty else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "workers": workers,
        "seconds": round(seconds),
        "cases": {case_id: {"file": str(path.relative_to(suite.cases_dir)), "digest": case_digest(path, suite),
                            "runs": {m: by_case[case_id][m] for m in MODELS if m in by_case.get(case_id, {})}}
                  for case_id, path in sorted(ids.items())},
    }


def dumps(data: dict) -> str:
    """One line per case: a diff of two calibrations reads case by case."""
    head = json.dumps({k: v for k, v in data.items() if k != "cases"}, indent=1)[:-2]
    cases = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["cases"].items())
    return f'{head},\n "cases": {{\n{cases}\n }}\n}}\n'


def load(suite: Suite = BUILTIN) -> dict:
    return json.loads(suite.snapshot.read_text())


def flips(recorded: dict, run: dict) -> list[str]:
    """Every (case, baseline) whose outcome differs between two calibrations, with both outcomes."""
    out = []
    for case_id in sorted(recorded["cases"].keys() | run["cases"].keys()):
        old, new = (c.get(case_id, {}).get("runs", {}) for c in (recorded["cases"], run["cases"]))
        out += [f"{case_id} {m}: recorded {old.get(m)}, now {new.get(m)}" for m in MODELS if old.get(m) != new.get(m)]
    return out


def restamp(rev: str, repo: Path = REPO) -> list[str]:
    """Give the recorded cases the digests of their files as they are now, keeping their runs, where a case
    is provably the one that was calibrated: its recorded digest is that of its files at git revision ``rev``,
    and the case loaded there and now is the same once every file it references is replaced by its content's
    hash (so every referenced file's bytes are equal too). For a change that only moves case data (files kept
    once in cases/shared/), which a 30-minute calibration would only confirm. Returns the refused cases, with
    why; the record is rewritten only when there are none."""
    from pytest_retrace.replay.casefiles import by_content
    from pytest_retrace.replay.cases import CaseError, load_case

    cases_dir, snapshot_file = repo / "cases", repo / "cases" / "calibration.json"
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True,
                         text=True, check=True).stdout.strip()
    data = json.loads(snapshot_file.read_text())
    refused = []
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", sha, "cases"], cwd=repo, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        then_dir = Path(tmp) / "cases"
        for case_id, entry in data["cases"].items():
            then_file, now_file = then_dir / entry["file"], cases_dir / entry["file"]
            try:
                then, now = load_case(then_file), load_case(now_file)
            except CaseError as exc:
                refused.append(f"{case_id}: does not load: {exc}")
                continue
            if provenance.case_digest(then_file, then_dir) != entry["digest"]:
                refused.append(f"{case_id}: at {sha[:12]} its files do not have the recorded digest")
            elif by_content(then) != by_content(now):
                refused.append(f"{case_id}: {entry['file']} at {sha[:12]} and now are not the same case")
            else:
                entry["digest"] = provenance.case_digest(now_file, cases_dir)
    if not refused:
        data.setdefault("restamps", []).append(
            {"from": sha, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "what": "digests renewed for the same cases (python -m tests.suite_calibration --restamp); "
                     "the runs are those of the calibration at 'commit'"})
        snapshot_file.write_text(dumps(data))
    return refused


# --- the checks a recorded calibration and a sample run must pass (tests/test_suite.py, test_osworld_suite.py) -----

def by_model(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["model"], []).append(r)
    return out


def verdicts(records: list[dict]) -> dict[tuple[str, str], tuple]:
    return {(r["case"], r["model"]): (r["verdict"], r["r_o"], r["r_tc"]) for r in records}


def recorded(suite: Suite = BUILTIN) -> list[dict]:
    """The recorded full run as records (the fields the checks read)."""
    return [{"case": case_id, "model": model, "recovered": o["verdict"] == "recovered", "verdict": o["verdict"],
             "r_o": o["r_o"], "r_tc": o["r_tc"], "error": o["error"],
             "probes": [{"restored": x} for x in o["probes_restored"]]}
            for case_id, entry in load(suite)["cases"].items() for model, o in entry["runs"].items()]


def check_complete_and_error_free(records: list[dict], n_cases: int) -> None:
    assert len(records) == n_cases * len(MODELS)
    errors = [(r["case"], r["model"], r["error"]) for r in records if r["verdict"] == "error"]
    assert errors == []


def check_calibration(records: list[dict], undo_between: bool = True) -> None:
    """noop 0 %, oracle 100 %, and (`undo_between`) undo strictly in between."""
    models = by_model(records)
    assert [r["case"] for r in models["noop"] if r["recovered"]] == []
    assert [r["case"] for r in models["oracle"] if not r["recovered"]] == []
    if undo_between:
        recovered = sum(bool(r["recovered"]) for r in models["undo"])
        assert 0 < recovered < len(models["undo"]), f"undo recovered {recovered}/{len(models['undo'])}"


def check_each_kind_needs_its_half_of_the_oracle(records: list[dict], kind: dict[str, str]) -> None:
    """Under noop, every hidden-state and subtle case fails only R_TC and every visual-only case only R_O."""
    noop = by_model(records)["noop"]
    only_tc = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] in ("hidden-state", "subtle")]
    only_o = [(r["case"], r["r_o"], r["r_tc"]) for r in noop if kind[r["case"]] == "visual-only"]
    assert all(ro and not rtc for _, ro, rtc in only_tc), [x for x in only_tc if not (x[1] and not x[2])]
    assert all(rtc and not ro for _, ro, rtc in only_o), [x for x in only_o if not (x[2] and not x[1])]


def check_probes_fail_under_noop_and_pass_under_the_oracle(records: list[dict], with_probes: set[str]) -> None:
    for r in records:
        if r["case"] in with_probes and r["model"] in ("noop", "oracle"):
            restored = {p["restored"] for p in r["probes"]}
            assert restored == {r["model"] == "oracle"}, (r["case"], r["model"], r["probes"])


def stale(suite: Suite, now: dict[str, Path]) -> tuple[list[str], list[str], list[str]]:
    """Cases (added, removed, changed) since the recorded calibration of `suite`; `now`: case id -> file."""
    data = load(suite)
    changed = sorted(c for c in now.keys() & data["cases"].keys()
                     if case_digest(now[c], suite) != data["cases"][c]["digest"])
    return sorted(now.keys() - data["cases"].keys()), sorted(data["cases"].keys() - now.keys()), changed


def check_cases_are_well_formed(cases: list[Any]) -> None:
    """Both horizons, each with its number of perturbation actions; a ground truth and a mistake each; unique ids."""
    assert {c.horizon for c in cases} == {"short", "long"}
    for c in cases:
        n = len(c.perturbation)
        ok = (c.d, n) == (1, 1) if c.horizon == "short" else c.d == 5 and 3 <= n <= 5
        assert ok, f"{c.id}: a {c.horizon}-horizon case with d={c.d} and {n} perturbation action(s)"
        assert c.metadata.get("ground_truth") and c.metadata.get("mistake"), c.id
    assert len({c.id for c in cases}) == len(cases)


def check_kinds_are_measured(cases: list[Any]) -> None:
    """hidden-state iff the error PNG equals the target PNG, and such a case carries a probe."""
    import numpy as np
    from PIL import Image

    for case in cases:
        same = np.array_equal(np.asarray(Image.open(case.target_png).convert("RGB")),
                              np.asarray(Image.open(case.error_png).convert("RGB")))
        assert same == (case.metadata["kind"] == "hidden-state"), (case.id, case.metadata["kind"])
        if same:
            assert case.probes, f"{case.id}: an error screen equal to its target needs a probe"


def check_recorded(suite: Suite, cases: dict[Path, Any], undo_between: bool = True) -> list[str]:
    """Every check of a recorded calibration against `cases` (file -> case); the failures, each named."""
    records = recorded(suite)
    kind = {c.id: c.metadata["kind"] for c in cases.values()}
    with_probes = {c.id for c in cases.values() if c.probes}
    failures = []
    for check, args in ((check_complete_and_error_free, (records, len(cases))),
                        (check_calibration, (records, undo_between)),
                        (check_each_kind_needs_its_half_of_the_oracle, (records, kind)),
                        (check_probes_fail_under_noop_and_pass_under_the_oracle, (records, with_probes))):
        try:
            check(*args)
        except AssertionError as exc:
            failures.append(f"{check.__name__}: {exc}")
    return failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.suite_calibration")
    parser.add_argument("--suite", choices=sorted(SUITES), default="builtin")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--check", action="store_true", help="run it again: the flips against the recorded file")
    how.add_argument("--restamp", metavar="REV", help="new digests for the cases unchanged since REV")
    parser.add_argument("--env", choices=("xvfb", "docker"), default="xvfb", help="with --check: where to run")
    parser.add_argument("--restore", choices=("replay", "checkpoint"), default="replay",
                        help="with --check: how tests reach s_error (--retrace-restore; docs/checkpoints.md)")
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]
    where = suite.snapshot.relative_to(REPO)
    if args.restamp:
        if suite is not BUILTIN:
            parser.error("--restamp renews the built-in suite's digests only")
        refused = restamp(args.restamp)
        print("\n".join(f"refused: {r}" for r in refused))
        print(f"{len(refused)} case(s) refused, {where} unchanged" if refused else
              f"restamped {where} against {args.restamp}")
        return 1 if refused else 0
    if (args.env != "xvfb" or args.restore != "replay") and not args.check:
        parser.error("the record is an xvfb run that replays; --env docker and --restore checkpoint check it (--check)")
    # the whole records are kept (reports/ is not tracked): a surprising verdict needs its details to explain it
    name = time.strftime(f"calibration-{suite.name}-{args.env}-{args.restore}-%Y%m%d-%H%M%S")
    records, seconds = run_suite(REPO / "reports", name, workers=16, timeout=7200, env=args.env, suite=suite,
                                 restore=args.restore)
    data = snapshot(records, seconds, 16, suite)
    errors = sum(r["verdict"] == "error" for r in records)
    if args.check:  # the recorded runs stay; this run's own file is kept next to its records, its summary added
        (REPO / "reports" / name / "calibration.json").write_text(dumps(data))
        recorded = load(suite)
        differ = flips(recorded, data)
        print("\n".join(differ))
        print(f"{len(records)} tests, {errors} infrastructure errors, {len(differ)} flips against {where}")
        recorded.setdefault("checks", []).append(
            {"date": data["date"], "commit": data["commit"], "env": args.env, "workers": 16,
             **({"restore": args.restore} if args.restore != "replay" else {}),
             "seconds": data["seconds"], "tests": len(records), "errors": errors, "flips": len(differ)})
        suite.snapshot.write_text(dumps(recorded))
        return 1 if differ or errors else 0
    suite.snapshot.write_text(dumps(data))
    print(f"wrote {where}: {len(records)} tests, {errors} infrastructure errors; check it with: "
          f".venv/bin/pytest tests/{'test_suite.py' if suite is BUILTIN else 'test_osworld_suite.py'} -k recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
