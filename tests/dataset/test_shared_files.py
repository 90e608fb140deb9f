"""Case data stored once: files several cases use live in the suite's shared folder (``cases/shared/``), the
YAMLs name them, the digests follow them, and the calibration's restamp renews digests only for cases that
are provably the same. No desktop needed."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from PIL import Image

from pytest_retrace.dataset.share import share_duplicates
from pytest_retrace.replay.casefiles import by_content
from pytest_retrace.replay.cases import CaseError, find_case_files, load_case
from pytest_retrace.results.provenance import case_digest
from tests import suite_calibration
from tests.helpers import REPO, VALID


def _case(app: Path, name: str, *, page: str = "<p>same page</p>", colour: tuple[int, int, int] = (255, 255, 255),
          comment: str = "") -> Path:
    """A case of its own files: a setup page, and two screenshots (the error one the same for every case)."""
    doc = copy.deepcopy(VALID)
    doc["task"]["setup"][0] = {"type": "file", "path": "~/page.html", "src": f"{name}/setup/0-page.html"}
    doc["screenshots"] = {"target": f"{name}/target.png", "error": f"{name}/error.png"}
    (app / name / "setup").mkdir(parents=True)
    (app / name / "setup" / "0-page.html").write_text(page)
    Image.new("RGB", (64, 48), (255, 255, 255)).save(app / name / "target.png")
    Image.new("RGB", (64, 48), colour).save(app / name / "error.png")
    path = app / f"{name}.yaml"
    path.write_text(comment + yaml.safe_dump(doc, sort_keys=False))
    return path


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".yaml")


def test_duplicates_are_kept_once_and_the_cases_stay_the_same(tmp_path: Path) -> None:
    root = tmp_path / "cases"
    a = _case(root / "editor", "a", comment="# hand-written: this comment stays\n")
    b = _case(root / "editor", "b", colour=(0, 0, 0))
    c = _case(root / "terminal", "c", page="<p>its own page</p>", colour=(0, 0, 0))
    before = {p: by_content(load_case(p)) for p in (a, b, c)}
    assert sorted(share_duplicates(root, log=lambda _: None)) == [a, b, c]
    hashes = Counter(hashlib.sha256(p.read_bytes()).hexdigest() for p in _files(root))
    assert set(hashes.values()) == {1}  # every content once
    for path in (a, b, c):
        assert by_content(load_case(path)) == before[path]  # the same case, file for file
    case_a, case_c = load_case(a), load_case(c)
    # the white target of all three and the page of a and b are shared; c's page is its own
    assert case_a.screenshots.target.startswith("../shared/screen-") and case_a.target_png.is_file()
    assert case_a.task.setup[0].src.startswith("../shared/page-")
    assert case_c.task.setup[0].src == "c/setup/0-page.html"
    # the black error screen of b and c, across apps
    assert load_case(b).screenshots.error == case_c.screenshots.error
    # a's target equals its error: one case naming one content twice keeps it, here in shared/
    assert case_a.screenshots.error == case_a.screenshots.target
    assert a.read_text().startswith("# hand-written: this comment stays\n")
    assert not (root / "editor" / "a").exists()  # nothing left in a's own directory
    assert share_duplicates(root, log=lambda _: None) == []  # idempotent


def test_a_file_one_case_names_twice_stays_in_its_directory(tmp_path: Path) -> None:
    root = tmp_path / "cases"
    path = _case(root / "editor", "a")
    share_duplicates(root, log=lambda _: None)
    case = load_case(path)
    assert case.screenshots.error == "a/target.png" and not (root / "shared").exists()


def test_a_changed_shared_file_changes_the_digest_of_every_case_using_it(tmp_path: Path) -> None:
    root = tmp_path / "cases"
    a, b = _case(root / "editor", "a"), _case(root / "editor", "b", colour=(0, 0, 0))
    other = _case(root / "editor", "other", page="<p>other</p>", colour=(9, 9, 9))
    share_duplicates(root, log=lambda _: None)
    page = load_case(a).files()["task.setup[0].src"]
    assert page.parent == root / "shared" and page == load_case(b).files()["task.setup[0].src"]
    digests = {p: case_digest(p) for p in (a, b, other)}
    page.write_text("<p>changed</p>")
    assert case_digest(a) != digests[a] and case_digest(b) != digests[b]
    assert case_digest(other) == digests[other]


@pytest.mark.parametrize(("rel", "message"), [
    ("../shared/missing.html", r"a\.yaml: task\.setup\[0\]\.src: file not found: .*shared/missing\.html"),
    ("../elsewhere/x.html", r"a\.yaml: task\.setup\[0\]\.src: '\.\./elsewhere/x\.html' is outside .* shared folder"),
    ("../shared/../../x.html", r"a\.yaml: task\.setup\[0\]\.src: .* is outside the case directory"),
])
def test_a_missing_or_escaping_reference_names_the_file_and_field(tmp_path: Path, rel: str, message: str) -> None:
    path = _case(tmp_path / "cases" / "editor", "a")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.html").write_text("x")
    (tmp_path / "x.html").write_text("x")
    path.write_text(path.read_text().replace("a/setup/0-page.html", rel))
    with pytest.raises(CaseError, match=message):
        load_case(path)


def test_the_evaluator_reads_local_files_from_the_case_directory_only(tmp_path: Path) -> None:
    path = _case(tmp_path / "cases" / "editor", "a")
    (tmp_path / "cases" / "shared").mkdir()
    (tmp_path / "cases" / "shared" / "want.txt").write_text("Hello world")
    doc = yaml.safe_load(path.read_text())
    doc["task"]["evaluator"]["expected"] = {"type": "local_file", "path": "../shared/want.txt"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CaseError, match=r"task\.evaluator\.expected\.path: must not leave the case directory"):
        load_case(path)


# --- the calibration's restamp --------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def calibrated(tmp_path: Path) -> Path:
    """A git repo with three cases and a calibration of them, committed."""
    repo = tmp_path / "repo"
    cases = repo / "cases"
    for app, name, colour in (("editor", "a", (0, 0, 0)), ("editor", "b", (0, 0, 0)), ("terminal", "c", (9, 9, 9))):
        _case(cases / app, name, colour=colour)
    runs = {"oracle": {"verdict": "recovered"}}
    data = {"schema": 1, "commit": "calibrated", "cases": {
        p.stem: {"file": str(p.relative_to(cases)), "digest": case_digest(p, cases), "runs": runs}
        for p in find_case_files(cases)}}
    (cases / "calibration.json").write_text(suite_calibration.dumps(data))
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "calibrated")
    return repo


def test_restamp_renews_the_digests_of_cases_that_only_moved(calibrated: Path) -> None:
    cases = calibrated / "cases"
    share_duplicates(cases, log=lambda _: None)
    assert suite_calibration.restamp("HEAD", calibrated) == []
    data = json.loads((cases / "calibration.json").read_text())
    assert data["restamps"][0]["from"] == _git(calibrated, "rev-parse", "HEAD")
    for entry in data["cases"].values():
        assert entry["digest"] == case_digest(cases / entry["file"], cases)
        assert entry["runs"] == {"oracle": {"verdict": "recovered"}}


def test_restamp_refuses_a_changed_case_and_writes_nothing(calibrated: Path) -> None:
    cases = calibrated / "cases"
    share_duplicates(cases, log=lambda _: None)
    before = (cases / "calibration.json").read_text()
    page = load_case(cases / "editor" / "a.yaml").files()["task.setup[0].src"]
    page.write_text("<p>changed</p>")  # a shared page: every case using it is refused
    c = cases / "terminal" / "c.yaml"
    c.write_text(c.read_text().replace("t_seed: 1", "t_seed: 2"))
    refused = suite_calibration.restamp("HEAD", calibrated)
    assert [r.split(":")[0] for r in refused] == ["a", "b", "c"]
    assert "are not the same case" in refused[0]
    assert (cases / "calibration.json").read_text() == before
    assert subprocess.run([sys.executable, "-m", "tests.suite_calibration", "--restamp"], cwd=REPO,
                          capture_output=True, check=False).returncode == 2  # REV is required


# --- the built-in suite -----------------------------------------------------------------------------


def test_the_built_in_suite_keeps_every_file_once() -> None:
    cases = REPO / "cases"
    hashes = Counter(hashlib.sha256(p.read_bytes()).hexdigest() for p in cases.rglob("*") if p.is_file())
    assert [h for h, n in hashes.items() if n > 1] == []
    used = {f for p in suite_calibration.case_files() for f in load_case(p).files().values()}
    shared = set((cases / "shared").iterdir())
    assert shared and shared <= {Path(p) for p in used}, "a file in cases/shared/ that no case names"
