"""A case whose Φ is OSWorld's own evaluator (task.osworld): what loading it accepts, refuses and names."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.dataset.casewrite import with_own_files
from pytest_retrace.osworld import package
from pytest_retrace.replay.caseyaml import CaseError
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.judge import evaluated_files
from tests.helpers import VALID, png, write_case

pytestmark = pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")

OSWORLD: dict[str, Any] = {
    "id": "0a1b2c3d-sum",
    "config": [{"type": "open", "parameters": {"path": "/home/user/sum.xlsx"}}],
    "evaluator": {
        "func": "compare_table",
        "result": {"type": "vm_file", "path": "/home/user/sum.xlsx", "dest": "sum.xlsx"},
        "expected": {"type": "cloud_file", "path": "https://example.org/sum_gold.xlsx", "dest": "sum_gold.xlsx"},
    },
    "cache": {"sum_gold.xlsx": "expected/sum_gold.xlsx"},
}


def _case(tmp_path: Path, **task: Any) -> Path:
    data = copy.deepcopy(VALID)
    data["task"].pop("evaluator")
    data["task"].update(task)
    (tmp_path / "expected").mkdir(exist_ok=True)
    (tmp_path / "expected" / "sum_gold.xlsx").write_bytes(b"PK placeholder")
    return write_case(tmp_path, "case", data)


def test_a_case_judged_by_osworld_loads_and_names_its_cache_files(tmp_path: Path) -> None:
    case = load_case(_case(tmp_path, osworld=OSWORLD))
    assert case.task.evaluator is None and case.task.osworld is not None
    assert case.task.osworld.evaluator["func"] == "compare_table"
    assert case.files()["task.osworld.cache.sum_gold.xlsx"] == tmp_path / "expected" / "sum_gold.xlsx"
    assert evaluated_files(case.task) == ["/home/user/sum.xlsx"]


@pytest.mark.parametrize(("task", "field", "message"), [
    ({}, "task", "exactly one of `evaluator` (the harness's) and `osworld` (OSWorld's), got neither"),
    ({"osworld": OSWORLD, "evaluator": VALID["task"]["evaluator"]}, "task", "got both"),
    ({"osworld": {**OSWORLD, "cache": {"../x": "expected/sum_gold.xlsx"}}}, "task.osworld.cache",
     "must be a file name (no directories)"),
    ({"osworld": {**OSWORLD, "evaluator": {**OSWORLD["evaluator"], "func": "compare_tabel"}}},
     "task.osworld.evaluator", "compare_tabel"),
    ({"osworld": {**OSWORLD, "config": [{"type": "googledrive", "parameters": {}}]}}, "task.osworld.config",
     "Google account"),
    ({"osworld": {**OSWORLD, "cache": {"sum_gold.xlsx": "expected/missing.xlsx"}}},
     "task.osworld.cache.sum_gold.xlsx", "file not found"),
])
def test_a_bad_osworld_part_is_one_error_naming_its_field(tmp_path: Path, task: dict[str, Any], field: str,
                                                          message: str) -> None:
    with pytest.raises(CaseError) as err:
        load_case(_case(tmp_path, **task))
    assert err.value.field.startswith(field) and message in str(err.value), str(err.value)


def test_build_copies_the_cache_files_into_the_case(tmp_path: Path) -> None:
    case = load_case(_case(tmp_path, osworld=OSWORLD))
    domain = tmp_path / "out" / "calc"
    own = with_own_files(case.task, tmp_path, domain, domain / "case-1")
    rel = own.osworld.cache["sum_gold.xlsx"]
    assert (domain / rel).read_bytes() == b"PK placeholder" and rel.startswith("case-1/")
    assert own.osworld.evaluator == case.task.osworld.evaluator


def test_cases_sharing_a_cache_file_keep_it_once_and_stay_the_same(tmp_path: Path) -> None:
    """`retrace build --osworld` copies each case's cache files (a gold workbook, a profile) into the case; a file
    several cases take is kept once in shared/, and each case loads as the same case as before (by content)."""
    from pytest_retrace.dataset.share import share_duplicates
    from pytest_retrace.replay.casefiles import by_content

    app = tmp_path / "suite" / "calc"
    paths = []
    for name in ("a", "b"):  # as the case writer lays cases out: <suite>/<app>/<id>.yaml, its files in <id>/
        data = copy.deepcopy(VALID)
        data["task"].pop("evaluator")
        data["task"]["osworld"] = {**OSWORLD, "cache": {"sum_gold.xlsx": f"{name}/expected/sum_gold.xlsx"}}
        data["screenshots"] = {"target": f"{name}/target.png", "error": f"{name}/error.png"}
        (app / name / "expected").mkdir(parents=True)
        (app / name / "expected" / "sum_gold.xlsx").write_bytes(b"PK the same gold workbook")
        for shot in ("target", "error"):
            png(app / name / f"{shot}.png")
        paths.append(write_case(app, name, data, pngs=False))
    before = [by_content(load_case(p)) for p in paths]
    assert share_duplicates(tmp_path / "suite", log=lambda line: pytest.fail(line)) == paths
    after = [load_case(p) for p in paths]
    assert [by_content(c) for c in after] == before  # the same cases, file for file
    [kept] = {c.task.osworld.cache["sum_gold.xlsx"] for c in after if c.task.osworld is not None}
    assert kept.startswith("../shared/sum_gold-") and not (app / "a" / "expected").exists()
