"""desktop-env loaded one module at a time: its exports read from source, a missing optional package named per
function, nothing heavy imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_retrace.osworld import package

pytestmark = pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")


def test_the_index_holds_what_the_packages_export() -> None:
    metrics, getters = package.index()["metric"], package.index()["getter"]
    # the functions OSWorld's Linux tasks use most (docs/osworld.md), under the names its task files give
    for name in ("compare_table", "compare_pptx_files", "check_include_exclude", "compare_docx_files", "infeasible"):
        assert name in metrics
    for kind in ("vm_file", "cloud_file", "rule", "vm_command_line", "open_tabs_info", "accessibility_tree"):
        assert kind in getters
    assert metrics["compare_table"].module == "desktop_env.evaluators.metrics.table"
    assert getters["vm_file"].function == "get_vm_file"
    assert metrics["infeasible"].module == "desktop_env.evaluators.metrics"  # defined in the package's __init__
    assert len(metrics) > 100 and len(getters) > 40


def test_needs_are_read_from_each_functions_code() -> None:
    metrics = package.index()["metric"]
    assert "easyocr" in metrics["compare_image_text"].needs
    # the same module imports easyocr, but compare_docx_files never uses it
    assert "easyocr" not in metrics["compare_docx_files"].needs and "docx" in metrics["compare_docx_files"].needs
    # followed through the module's helpers and its imports from desktop_env's own utils
    assert {"openpyxl", "pandas", "formulas"} <= metrics["compare_table"].needs


def test_a_missing_package_is_named_for_the_functions_that_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package, "_importable", lambda module: module != "pptx")
    why = package.problem("metric", "compare_pptx_files")
    assert why == "metric compare_pptx_files needs python-pptx, not installed"
    assert package.problem("metric", "compare_table") is None
    with pytest.raises(package.Unavailable, match="python-pptx"):
        package.load("metric", "compare_pptx_files")
    assert package.problem("metric", "no_such_metric") == "desktop-env 1.0.2 has no metric 'no_such_metric'"


def test_the_package_missing_or_another_version_is_one_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package, "version", lambda: "1.0.9")
    assert package.problem("metric", "compare_table") == (
        f"desktop-env 1.0.9 is installed, but retrace is measured against 1.0.2 ({package.INSTALL})")
    monkeypatch.setattr(package, "root", lambda: None)
    assert "desktop-env is not installed" in str(package.problem("getter", "vm_file"))
    with pytest.raises(package.Unavailable, match="not installed"):
        package.load_module("desktop_env.evaluators.metrics.table")


_PROBE = """
import json, sys
from pytest_retrace.osworld import package
table = package.load("metric", "compare_table")
docs = package.load_module("desktop_env.evaluators.metrics.docs")
setup = package.load_module("desktop_env.controllers.setup")
out = {"table": table.__module__, "setup": setup.SetupController.__name__,
       "init_ran": hasattr(sys.modules["desktop_env.evaluators.metrics"], "compare_table"),
       "heavy": sorted(m for m in ("torch", "easyocr", "librosa") if m in sys.modules)}
try:
    docs.easyocr.Reader(["en"])
except package.Unavailable as exc:
    out["stand_in"] = str(exc)
try:
    import easyocr  # noqa: F401 - the stand-in served only desktop-env's own import
    out["later_import"] = "imported"
except ImportError:
    out["later_import"] = "ImportError"
print(json.dumps(out))
"""


def test_one_module_is_imported_without_its_packages_init_or_heavy_dependencies() -> None:
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["table"] == "desktop_env.evaluators.metrics.table" and out["setup"] == "SetupController"
    assert out["init_ran"] is False and out["heavy"] == []
    if "easyocr" not in package.index()["metric"]["compare_image_text"].needs or package.missing({"easyocr"}):
        assert out["stand_in"] == "easyocr.Reader needs easyocr (needs torch), which is not installed"
        assert out["later_import"] == "ImportError"


def test_what_a_getter_calls_is_read_from_its_code() -> None:
    getters = package.index()["getter"]
    # get_active_tab_info finds the tab through the accessibility tree: our desktops serve none (guest: 501)
    assert package.refers_to(getters["active_tab_info"], "get_accessibility_tree")
    assert package.refers_to(getters["accessibility_tree"], "get_accessibility_tree")
    assert not package.refers_to(getters["vm_file"], "get_accessibility_tree")
    assert not package.refers_to(getters["open_tabs_info"], "get_accessibility_tree")  # DevTools only


def test_a_getter_needing_the_accessibility_tree_is_not_supported() -> None:
    from pytest_retrace.osworld.evaluate import evaluator_problems

    block = {"func": "is_expected_active_tab", "result": {"type": "active_url_from_accessTree", "goto_prefix": ""},
             "expected": {"type": "rule", "rules": {"type": "url", "url": "https://example.org"}}}
    assert [reason for reason, _ in evaluator_problems(block)] == ["needs the accessibility tree"]
