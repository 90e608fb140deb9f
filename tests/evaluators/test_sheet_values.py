"""compare_cells sees the values the spreadsheet application computes: files made by the real apps."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.envs import CommandResult
from pytest_retrace.evaluators import EvaluatorError, evaluate
from pytest_retrace.evaluators import ssconvert as converter
from pytest_retrace.evaluators.sheet_readers import read_ods
from pytest_retrace.evaluators.sheets import resolve_format

needs_ssconvert = pytest.mark.skipif(shutil.which("ssconvert") is None, reason="needs Gnumeric's ssconvert")
needs_soffice = pytest.mark.skipif(shutil.which("soffice") is None, reason="needs LibreOffice")

CSV = 'Item,Qty\napple,3\npear,5\ntotal,=SUM(B2:B3)\nflag,=B2>1\ntext,"=""a""&""b"""\nerr,=B2/0\n'


class FilesEnv:
    """An EvalEnv over a directory: ``~`` is the directory."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def read_file(self, path: str) -> bytes | None:
        target = self.home / path.removeprefix("~/")
        return target.read_bytes() if target.is_file() else None

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        raise AssertionError("compare_cells must not run commands in the environment")


def check(path: str, expected: dict[str, Any], **options: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "func": "compare_cells",
        "result": {"type": "vm_file", "path": path},
        "expected": {"type": "rule", "rules": {"cells": expected}},
    }
    if options:
        block["options"] = options
    return block


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def ssconvert(src: Path, dst: Path) -> None:
    subprocess.run(["ssconvert", str(src), str(dst)], check=True, capture_output=True, timeout=60)


def soffice(src: Path, fmt: str) -> Path:
    profile = src.parent / "lo-profile"  # private: never meets another LibreOffice of this machine
    subprocess.run(
        ["soffice", f"-env:UserInstallation=file://{profile}", "--headless", "--convert-to", fmt,
         "--outdir", str(src.parent / "out"), str(src)],
        check=True, capture_output=True, timeout=120,
    )
    out = src.parent / "out" / f"{src.stem}.{fmt}"
    assert out.is_file(), f"soffice wrote no {out}"
    return out


# --- Gnumeric: values computed by Gnumeric itself ------------------------------------------------


@pytest.fixture
def gnumeric_book(home: Path) -> str:
    (home / "in.csv").write_text(CSV)
    ssconvert(home / "in.csv", home / "book.gnumeric")
    assert b">=sum(B2:B3)<" in gzip.decompress((home / "book.gnumeric").read_bytes())  # the formula, no value
    return "~/book.gnumeric"


@needs_ssconvert
def test_gnumeric_formula_cells_read_as_their_values(home: Path, gnumeric_book: str) -> None:
    expected = {"A2": "apple", "B2": 3, "B4": 8, "B5": True, "B6": "ab", "B7": "#DIV/0!", "A9": None}
    result = evaluate(check(gnumeric_book, expected), FilesEnv(home))
    assert result.passed, result.details


@needs_ssconvert
def test_gnumeric_wrong_value_fails_with_the_computed_value(home: Path, gnumeric_book: str) -> None:
    result = evaluate(check(gnumeric_book, {"B4": 9, "B2": 3}), FilesEnv(home))
    assert result.score == 0.0
    assert result.details == ["compare_cells(~/book.gnumeric): B4: 8 != 9"]


@needs_ssconvert
def test_gnumeric_formula_text_is_not_the_value(home: Path, gnumeric_book: str) -> None:
    # the bug this guards against: the formula's text used to be the cell's value
    result = evaluate(check(gnumeric_book, {"B4": "SUM(B2:B3)"}), FilesEnv(home))
    assert result.details == ["compare_cells(~/book.gnumeric): B4: 8 != 'SUM(B2:B3)'"]


@needs_ssconvert
def test_gnumeric_expected_formula_is_compared_as_a_formula(home: Path, gnumeric_book: str) -> None:
    env = FilesEnv(home)
    assert evaluate(check(gnumeric_book, {"B4": "=sum(B2:B3)", "B2": 3}), env).passed  # case and spaces ignored
    wrong = evaluate(check(gnumeric_book, {"B4": "=SUM(B2:B4)", "B2": "=3"}), env)
    assert wrong.details == [
        "compare_cells(~/book.gnumeric): B4: formula '=sum(B2:B3)' != '=SUM(B2:B4)'; B2: 3.0 (no formula) != '=3'"
    ]


@needs_ssconvert
def test_gnumeric_edited_by_gnumeric_recomputes(home: Path, gnumeric_book: str) -> None:
    """A value changed after the formula was written: the formula's value follows, as in the app."""
    (home / "in2.csv").write_text(CSV.replace("pear,5", "pear,50"))
    ssconvert(home / "in2.csv", home / "book2.gnumeric")
    assert evaluate(check("~/book2.gnumeric", {"B4": 53}), FilesEnv(home)).passed


@needs_ssconvert
def test_gnumeric_formulas_on_a_named_sheet(home: Path) -> None:
    import openpyxl

    book = openpyxl.Workbook()
    book.active.title = "First"
    second = book.create_sheet("A rather long sheet name beyond 31 chars"[:31])
    second["A1"], second["A2"], second["A3"] = 2, 40, "=A1+A2"
    book.save(home / "two.xlsx")
    ssconvert(home / "two.xlsx", home / "two.gnumeric")
    result = evaluate(check("~/two.gnumeric", {"A3": 42}, sheet=second.title), FilesEnv(home))
    assert result.passed, result.details


@needs_ssconvert
def test_gnumeric_file_only_gnumeric_rejects_is_a_failed_check(home: Path) -> None:
    (home / "odd.gnumeric").write_text(
        '<?xml version="1.0"?>\n<gnm:Workbook xmlns:gnm="http://www.gnumeric.org/v10.dtd"><gnm:Sheets>'
        "<gnm:Sheet><gnm:Name>S</gnm:Name><gnm:MaxCol>-1</gnm:MaxCol><gnm:Cells>"
        '<gnm:Cell Row="0" Col="0">=1+1</gnm:Cell></gnm:Cells></gnm:Sheet></gnm:Sheets></gnm:Workbook>'
    )
    result = evaluate(check("~/odd.gnumeric", {"A1": 2}), FilesEnv(home))
    assert result.score == 0.0 and not result.passed
    assert result.details[0].startswith("compare_cells(~/odd.gnumeric): ~/odd.gnumeric: ssconvert could not read it")


@needs_ssconvert
def test_gnumeric_corrupt_file_is_a_failed_check(home: Path, gnumeric_book: str) -> None:
    data = (home / "book.gnumeric").read_bytes()
    (home / "cut.gnumeric").write_bytes(data[: len(data) // 2])
    result = evaluate(check("~/cut.gnumeric", {"B4": 8}), FilesEnv(home))
    assert result.score == 0.0 and result.details[0].startswith("compare_cells(~/cut.gnumeric): error:")


def fake_ssconvert(script: str) -> str:
    """A directory (readable by the unprivileged user the converter runs as) holding a fake ssconvert."""
    bindir = tempfile.mkdtemp(prefix="retrace-fake-ssconvert-", dir="/tmp")  # not below a 0700 TMPDIR
    os.chmod(bindir, 0o755)
    exe = Path(bindir) / "ssconvert"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return bindir


@needs_ssconvert
def test_gnumeric_hanging_conversion_is_a_failed_check_and_is_killed(
    home: Path, gnumeric_book: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = fake_ssconvert("sleep 300; exit 0\n")  # the shell stays, named by its script's path
    try:
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        monkeypatch.setattr(converter, "SSCONVERT_TIMEOUT", 1.0)
        start = time.monotonic()
        result = evaluate(check(gnumeric_book, {"B4": 8}), FilesEnv(home))
        assert time.monotonic() - start < 10
        assert result.score == 0.0
        assert result.details == [
            "compare_cells(~/book.gnumeric): ~/book.gnumeric: ssconvert did not finish within 1 s"
        ]
        time.sleep(0.2)
        left = subprocess.run(["pgrep", "-f", f"{bindir}/ssconvert"], capture_output=True, text=True, check=False)
        assert left.stdout == "", "the converter's processes must be killed"
    finally:
        shutil.rmtree(bindir)


@needs_ssconvert
def test_gnumeric_failing_conversion_is_a_failed_check(
    home: Path, gnumeric_book: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = fake_ssconvert("echo 'Loading file failed' >&2; exit 1\n")
    try:
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        result = evaluate(check(gnumeric_book, {"B4": 8}), FilesEnv(home))
        assert result.details == [
            (
                "compare_cells(~/book.gnumeric): ~/book.gnumeric: ssconvert could not read it "
                "(exit status 1: Loading file failed)"
            )
        ]
    finally:
        shutil.rmtree(bindir)


def test_gnumeric_without_formulas_needs_no_ssconvert(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    (home / "lit.gnumeric").write_text(
        '<gnm:Workbook xmlns:gnm="http://www.gnumeric.org/v10.dtd"><gnm:Sheets><gnm:Sheet><gnm:Name>S</gnm:Name>'
        '<gnm:Cells><gnm:Cell Row="0" Col="0" ValueType="40">7</gnm:Cell></gnm:Cells></gnm:Sheet></gnm:Sheets>'
        "</gnm:Workbook>"
    )
    assert evaluate(check("~/lit.gnumeric", {"A1": 7}), FilesEnv(home)).passed


def test_gnumeric_formulas_without_ssconvert_are_an_error_of_the_run(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the agent's failure: the host cannot compute the values, so no verdict is given."""
    monkeypatch.setenv("PATH", "/nonexistent")
    (home / "f.gnumeric").write_text(
        '<gnm:Workbook xmlns:gnm="http://www.gnumeric.org/v10.dtd"><gnm:Sheets><gnm:Sheet><gnm:Name>S</gnm:Name>'
        '<gnm:Cells><gnm:Cell Row="0" Col="0">=1+1</gnm:Cell></gnm:Cells></gnm:Sheet></gnm:Sheets></gnm:Workbook>'
    )
    with pytest.raises(EvaluatorError, match="needs Gnumeric's ssconvert on this host"):
        evaluate(check("~/f.gnumeric", {"A1": 2}), FilesEnv(home))


# --- LibreOffice: ODS and XLSX written by soffice ----------------------------------------------------


@pytest.fixture(scope="module")
def lo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("soffice") is None:
        pytest.skip("needs LibreOffice")
    work = tmp_path_factory.mktemp("lo")
    (work / "lo.csv").write_text(CSV)
    return {"ods": soffice(work / "lo.csv", "ods"), "xlsx": soffice(work / "lo.csv", "xlsx")}


@needs_soffice
@pytest.mark.parametrize("fmt", ["ods", "xlsx"])
@pytest.mark.desktop
def test_libreoffice_formula_cells_read_as_their_values(home: Path, lo_files: dict[str, Path], fmt: str) -> None:
    shutil.copy(lo_files[fmt], home / f"book.{fmt}")
    env = FilesEnv(home)
    expected = {"A1": "Item", "B2": 3, "B4": 8, "B5": 1, "B6": "ab", "B7": "#DIV/0!", "B9": None}
    result = evaluate(check(f"~/book.{fmt}", expected), env)
    assert result.passed, result.details
    wrong = evaluate(check(f"~/book.{fmt}", {"B4": 9}), env)
    assert re.fullmatch(rf"compare_cells\(~/book\.{fmt}\): B4: 8(\.0)? != 9", wrong.details[0]), wrong.details
    # an expected formula is compared with the formula (ODS's [.B2:.B3] notation read as B2:B3)
    assert evaluate(check(f"~/book.{fmt}", {"B4": "=sum(B2:B3)"}), env).passed
    assert not evaluate(check(f"~/book.{fmt}", {"B4": "=SUM(B2:B4)"}), env).passed


@needs_soffice
@pytest.mark.desktop
def test_ods_is_recognised_by_extension(home: Path, lo_files: dict[str, Path]) -> None:
    assert resolve_format(None, "~/x.ODS") == "ods"
    shutil.copy(lo_files["ods"], home / "data.bin")
    assert evaluate(check("~/data.bin", {"B4": 8}, format="ods"), FilesEnv(home)).passed


@needs_soffice
@pytest.mark.desktop
def test_corrupt_ods_is_a_failed_check(home: Path, lo_files: dict[str, Path]) -> None:
    data = lo_files["ods"].read_bytes()
    (home / "cut.ods").write_bytes(data[: len(data) // 2])
    result = evaluate(check("~/cut.ods", {"B4": 8}), FilesEnv(home))
    assert result.score == 0.0 and result.details[0].startswith("compare_cells(~/cut.ods): error: BadZipFile")


# --- ODS details, on hand-written content.xml -------------------------------------------------------

NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'
)


def ods(tables: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as book:
        book.writestr("mimetype", "application/vnd.oasis.opendocument.spreadsheet")
        book.writestr(
            "content.xml",
            f"<office:document-content {NS}><office:body><office:spreadsheet>{tables}"
            "</office:spreadsheet></office:body></office:document-content>",
        )
    return buffer.getvalue()


def test_ods_value_types_and_repeats() -> None:
    data = ods(
        '<table:table table:name="S1">'
        '<table:table-header-rows><table:table-row><table:table-cell office:value-type="string">'
        "<text:p>a<text:s text:c=\"2\"/>b</text:p><text:p>c</text:p></table:table-cell></table:table-row>"
        "</table:table-header-rows>"
        '<table:table-row table:number-rows-repeated="3"><table:table-cell table:number-columns-repeated="2"/>'
        '<table:table-cell office:value-type="float" office:value="1.5"/></table:table-row>'
        '<table:table-row><table:table-cell office:value-type="boolean" office:boolean-value="true"/>'
        '<table:covered-table-cell/><table:table-cell office:value-type="date" office:date-value="2024-03-01"/>'
        '<table:table-cell office:value-type="time" office:time-value="PT10H30M00S"/>'
        '<table:table-cell office:value-type="percentage" office:value="0.25"/></table:table-row>'
        "</table:table>"
        '<table:table table:name="S2"><table:table-row><table:table-cell office:value-type="currency" '
        'office:value="9.99"/></table:table-row></table:table>'
    )
    cells = [(0, 0), (1, 2), (2, 2), (3, 2), (4, 2), (1, 0), (4, 0), (4, 1), (4, 3), (4, 4), (9, 9)]
    got = read_ods(data, None, cells)
    assert got[(0, 0)] == "a  b\nc"
    assert got[(1, 2)] == got[(2, 2)] == got[(3, 2)] == 1.5
    assert got[(1, 0)] is None and got[(4, 1)] is None
    assert got[(4, 0)] is True and got[(4, 2)] == dt.datetime(2024, 3, 1)
    assert got[(4, 3)] == dt.time(10, 30) and got[(4, 4)] == 0.25
    assert (9, 9) not in got
    assert read_ods(data, "S2", [(0, 0)]) == {(0, 0): 9.99}


def test_ods_huge_repeats_cost_nothing(home: Path) -> None:
    """A hostile file repeating rows and columns ~10^18 times: walked arithmetically, nothing expanded."""
    huge = "999999999999999999"
    (home / "bomb.ods").write_bytes(
        ods(
            '<table:table table:name="S">'
            f'<table:table-row table:number-rows-repeated="{huge}"><table:table-cell '
            f'table:number-columns-repeated="{huge}" office:value-type="float" office:value="4"/></table:table-row>'
            '<table:table-row><table:table-cell office:value-type="float" office:value="5"/></table:table-row>'
            "</table:table>"
        )
    )
    start = time.monotonic()
    env = FilesEnv(home)
    assert evaluate(check("~/bomb.ods", {"A1": 4, "XFD1048576": 4}), env).passed  # LibreOffice's last cell
    assert time.monotonic() - start < 2
    # the row after the repeats lies beyond the 2^20 rows a sheet has: it is not read
    assert evaluate(check("~/bomb.ods", {"A1": 4}), env).passed


def test_ods_wrong_content_is_a_failed_check(home: Path) -> None:
    env = FilesEnv(home)
    empty = io.BytesIO()
    with zipfile.ZipFile(empty, "w") as book:
        book.writestr("mimetype", "application/vnd.oasis.opendocument.spreadsheet")
    (home / "noxml.ods").write_bytes(empty.getvalue())
    assert evaluate(check("~/noxml.ods", {"A1": 1}), env).details == [
        "compare_cells(~/noxml.ods): not an OpenDocument spreadsheet (no content.xml)"
    ]
    (home / "nosheet.ods").write_bytes(ods('<table:table table:name="S"/>'))
    assert evaluate(check("~/nosheet.ods", {"A1": 1}, sheet="T"), env).details == [
        "compare_cells(~/nosheet.ods): no sheet 'T' (sheets: S)"
    ]
    (home / "neg.ods").write_bytes(
        ods('<table:table><table:table-row table:number-rows-repeated="-1"/></table:table>')
    )
    assert evaluate(check("~/neg.ods", {"A1": 1}), env).score == 0.0
