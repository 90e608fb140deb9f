"""The `verified_by: determinism` declaration and the process probe in a case file, without a desktop: what a
file may declare, the errors that name the field, and what a loaded case says about its error state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_retrace.replay.cases import CaseError, load_case
from tests.helpers import REPO

ALIAS = REPO / "tests" / "data" / "alias-case" / "alias-echo.yaml"
PROBE = {"get": {"type": "process", "name": "bash", "read": ["children"]}, "target": "sha256:" + "0" * 64}


def _variant(tmp_path: Path, **changes: Any) -> Path:
    doc = yaml.safe_load(ALIAS.read_text())
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    path = tmp_path / "alias-echo.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_alias_case_declares_determinism() -> None:
    case = load_case(ALIAS)
    assert case.verified_by == "determinism" and case.probes == []
    assert case.error_state_verified_by == "determinism"


def test_without_the_declaration_the_case_says_its_screen_verifies_it(tmp_path: Path) -> None:
    case = load_case(_variant(tmp_path, verified_by=None), check_screenshots=False)
    assert case.verified_by is None and case.error_state_verified_by == "screen"
    probed = load_case(_variant(tmp_path, verified_by=None, probes=[PROBE]), check_screenshots=False)
    assert probed.error_state_verified_by == "probes"
    assert probed.probes[0].describe() == "process bash (children)"


@pytest.mark.parametrize(("changes", "message"), [
    ({"verified_by": "pixels"}, r"alias-echo\.yaml: verified_by: Input should be 'determinism', got 'pixels'"),
    ({"verified_by": True}, r"verified_by: Input should be 'determinism', got True \(bool\)"),
    ({"probes": [PROBE]}, (r"verified_by: 'determinism' declares that nothing can observe the error state, but "
                           r"the case has 1 probe\(s\)")),
    ({"metadata": {"kind": "visible"}}, (r"verified_by: 'determinism' is for hidden-state cases .* metadata\.kind "
                                         r"is 'visible'")),
])
def test_a_declaration_that_contradicts_the_case_is_refused(tmp_path: Path, changes: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(CaseError, match=message):
        load_case(_variant(tmp_path, **changes), check_screenshots=False)


@pytest.mark.parametrize(("get", "message"), [
    ({"type": "process", "name": "bash; rm -rf ~"}, r"probes\[0\]\.get\.name: String should match pattern"),
    ({"type": "process", "name": "bash", "read": []}, r"probes\[0\]\.get\.read: List should have at least 1 item"),
    ({"type": "process", "name": "bash", "read": ["environ"]}, r"probes\[0\]\.get\.read\[0\]: Input should be 'cwd'"),
    ({"type": "process", "name": "bash", "read": ["cwd", "cwd"]}, r"probes\[0\]\.get\.read: each field at most once"),
])
def test_a_bad_process_probe_names_its_field(tmp_path: Path, get: dict[str, Any], message: str) -> None:
    path = _variant(tmp_path, verified_by=None, probes=[{"get": get, "target": PROBE["target"]}])
    with pytest.raises(CaseError, match=message):
        load_case(path, check_screenshots=False)
