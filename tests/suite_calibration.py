"""The built-in suite's full calibration, recorded: every case under the three baselines at -n 16, reduced to
what the calibration checks, and written to ``cases/calibration.json`` with a digest of each case's files.

    .venv/bin/python -m tests.suite_calibration          # about 30 minutes on the 2-core machine; commit the file
    .venv/bin/python -m tests.suite_calibration --check  # run it again: the flips against the recorded file
    .venv/bin/python -m tests.suite_calibration --restamp REV  # new digests for cases unchanged since REV

CI does not run the whole suite (docs in tests/test_suite.py): it checks the recorded run (its properties, and
that it covers exactly the cases of this checkout, byte for byte) and re-runs a fixed sample against it. So a
change to a case fails CI until the suite is calibrated again, the way a snapshot test fails until updated.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_retrace.results import provenance

REPO = Path(__file__).resolve().parent.parent
CASES_DIR = REPO / "cases"
SNAPSHOT = CASES_DIR / "calibration.json"
MODELS = ("noop", "oracle", "undo")
SCHEMA = 1


def case_files() -> list[Path]:
    return sorted(CASES_DIR.glob("*/*.yaml"))


def case_digest(path: Path) -> str:
    """The case file, every file it references (also in cases/shared/) and its own directory, by path relative
    to cases/: the package's one case digest, which every run's summary.json records too."""
    return provenance.case_digest(path, CASES_DIR)


def run_suite(reports: Path, name: str, *, files: list[Path] | None = None, env: str = "xvfb",
              workers: int = 16, timeout: float = 3000) -> tuple[list[dict], float]:
    """The baselines on `files` (default: the whole suite) as a user runs them; the records and the wall time."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *(map(str, files) if files else []), f"--retrace-model={','.join(MODELS)}",
         f"--retrace-run={name}", f"--retrace-report-dir={reports}", f"--retrace-env={env}", "-n", str(workers),
         "-p", "no:cacheprovider", "-q"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=timeout, check=False,
    )
    seconds = time.monotonic() - start
    print(f"{name} ({env}, -n {workers}, {len(files or case_files())} cases): exit {proc.returncode} in {seconds:.0f} s")
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"pytest exited with {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    lines = (reports / name / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], seconds


def outcome(record: dict) -> dict:
    """What the calibration checks of one test: the verdict, both criteria, the probes, an error's kind."""
    return {"verdict": record["verdict"], "r_o": record["r_o"], "r_tc": record["r_tc"],
            "probes_restored": [p["restored"] for p in record.get("probes") or []],
            "error": (record.get("error") or {}).get("kind")}


def snapshot(records: list[dict], seconds: float, workers: int) -> dict:
    from pytest_retrace.replay.cases import load_case

    files = case_files()
    ids = {load_case(p).id: p for p in files}
    by_case: dict[str, dict] = {}
    for r in records:
        by_case.setdefault(r["case"], {})[r["model"]] = outcome(r)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "pytest_retrace"], check=False, cwd=REPO,
                                capture_output=True, text=True).stdout.strip())
    return {
        "schema": SCHEMA,
        "what": "every case under noop, oracle and undo, xvfb, one run (python -m tests.suite_calibration)",
        "commit": commit + ("+uncommitted" if dirty else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "workers": workers,
        "seconds": round(seconds),
        "cases": {case_id: {"file": str(path.relative_to(CASES_DIR)), "digest": case_digest(path),
                            "runs": {m: by_case[case_id][m] for m in MODELS if m in by_case.get(case_id, {})}}
                  for case_id, path in sorted(ids.items())},
    }


def dumps(data: dict) -> str:
    """One line per case: a diff of two calibrations reads case by case."""
    head = json.dumps({k: v for k, v in data.items() if k != "cases"}, indent=1)[:-2]
    cases = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["cases"].items())
    return f'{head},\n "cases": {{\n{cases}\n }}\n}}\n'


def load() -> dict:
    return json.loads(SNAPSHOT.read_text())


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


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--restamp":
        refused = restamp(argv[1])
        print("\n".join(f"refused: {r}" for r in refused))
        print(f"{len(refused)} case(s) refused, {SNAPSHOT.relative_to(REPO)} unchanged" if refused else
              f"restamped {SNAPSHOT.relative_to(REPO)} against {argv[1]}")
        return 1 if refused else 0
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python -m tests.suite_calibration [--check | --restamp REV]", file=sys.stderr)
        return 2
    # the whole records are kept (reports/ is not tracked): a surprising verdict needs its details to explain it
    name = time.strftime("calibration-%Y%m%d-%H%M%S")
    records, seconds = run_suite(REPO / "reports", name, workers=16, timeout=7200)
    data = snapshot(records, seconds, 16)
    errors = sum(r["verdict"] == "error" for r in records)
    if check:  # the recorded file stays; this run's own is kept next to its records
        (REPO / "reports" / name / "calibration.json").write_text(dumps(data))
        differ = flips(load(), data)
        print("\n".join(differ))
        print(f"{len(records)} tests, {errors} infrastructure errors, {len(differ)} flips against "
              f"{SNAPSHOT.relative_to(REPO)}")
        return 1 if differ or errors else 0
    SNAPSHOT.write_text(dumps(data))
    print(f"wrote {SNAPSHOT.relative_to(REPO)}: {len(records)} tests, {errors} infrastructure errors; "
          f"check it with: .venv/bin/pytest tests/test_suite.py -k recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
