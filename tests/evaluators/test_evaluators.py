from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.evaluators import (
    GETTERS,
    METRICS,
    CommandResult,
    EvalEnv,
    Evaluation,
    EvaluatorError,
    GetterContext,
    Score,
    base,
    evaluate,
    register_getter,
    register_metric,
    validate_evaluator,
)


class LocalEnv:
    """A real EvalEnv over the local machine: `~` is a temporary home, commands run in bash."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def expand(self, path: str) -> Path:
        if path == "~" or path.startswith("~/"):
            return self.home / path[2:]
        return Path(path)

    def read_file(self, path: str) -> bytes | None:
        target = self.expand(path)
        return target.read_bytes() if target.is_file() else None

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        env = {**os.environ, "HOME": str(self.home)}
        try:
            proc = subprocess.run(
                ["bash", "-c", command],
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=self.home,
            )
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", "timed out")  # an outcome, not an infrastructure failure
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)


class BrokenEnv(LocalEnv):
    """The sandbox died: every call raises, as a real environment would on a lost VM."""

    def read_file(self, path: str) -> bytes | None:
        raise OSError("connection to the VM lost")

    def run(self, command: str, timeout: float = 30.0) -> CommandResult:
        raise RuntimeError("sandbox is gone")


@pytest.fixture
def env(tmp_path: Path) -> LocalEnv:
    home = tmp_path / "home"
    home.mkdir()
    return LocalEnv(home)


def write(env: LocalEnv, name: str, content: str | bytes) -> None:
    target = env.home / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_text(content, encoding="utf-8")
    else:
        target.write_bytes(content)


def check(func: str, result: dict[str, Any], expected: Any = None, **options: Any) -> dict[str, Any]:
    """A single-func evaluator block; `expected` given as a rule literal."""
    spec: dict[str, Any] = {"func": func, "result": result}
    if expected is not None:
        spec["expected"] = {"type": "rule", "rules": expected}
    if options:
        spec["options"] = options
    return spec


def file(path: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": path}


def score(spec: dict[str, Any], env: EvalEnv, case_dir: Path | None = None) -> float:
    return evaluate(spec, env, case_dir).score


def test_local_env_satisfies_protocol(env: LocalEnv) -> None:
    assert isinstance(env, EvalEnv)


# --- getters -------------------------------------------------------------------------------------


def test_vm_file_getter_reads_bytes_or_none(env: LocalEnv) -> None:
    write(env, "a.txt", "hi")
    ctx = GetterContext(env)
    assert GETTERS["vm_file"]({"type": "vm_file", "path": "~/a.txt"}, ctx) == b"hi"
    assert GETTERS["vm_file"]({"type": "vm_file", "path": "~/nope.txt"}, ctx) is None


def test_vm_file_exists_getter(env: LocalEnv) -> None:
    write(env, "a.txt", "")
    ctx = GetterContext(env)
    assert GETTERS["vm_file_exists"]({"type": "vm_file_exists", "path": "~/a.txt"}, ctx) is True
    assert GETTERS["vm_file_exists"]({"type": "vm_file_exists", "path": "~/b.txt"}, ctx) is False


def test_vm_command_line_returns_stdout_even_on_failure(env: LocalEnv) -> None:
    ctx = GetterContext(env)
    assert (
        GETTERS["vm_command_line"]({"type": "vm_command_line", "command": "echo $HOME"}, ctx)
        == f"{env.home}\n"
    )
    failing = {"type": "vm_command_line", "command": "echo partial; exit 3"}
    assert GETTERS["vm_command_line"](failing, ctx) == "partial\n"


def test_an_evaluator_program_the_environment_lacks_is_an_environment_error(env: LocalEnv) -> None:
    # read as "" it would fail R_TC: an image without `unzip` made the oracle "not recover" a Writer case
    from pytest_retrace.envs import EnvError

    missing = {"type": "vm_command_line", "command": "no-such-program-here -p ~/doc.docx"}
    with pytest.raises(EnvError, match=r"exited 127 \(not found\).*no-such-program-here"):
        GETTERS["vm_command_line"](missing, GetterContext(env))


def test_vm_command_result_getter(env: LocalEnv) -> None:
    got = GETTERS["vm_command_result"](
        {"type": "vm_command_result", "command": "echo out; echo err >&2; exit 2"}, GetterContext(env)
    )
    assert got == CommandResult(2, "out\n", "err\n")


def test_rule_and_none_getters(env: LocalEnv) -> None:
    ctx = GetterContext(env)
    assert GETTERS["rule"]({"type": "rule", "rules": {"a": [1, 2]}}, ctx) == {"a": [1, 2]}
    assert GETTERS["none"]({"type": "none"}, ctx) is None


def test_local_file_getter_reads_relative_to_case_dir(env: LocalEnv, tmp_path: Path) -> None:
    case_dir = tmp_path / "case"
    (case_dir / "expected").mkdir(parents=True)
    (case_dir / "expected" / "notes.txt").write_text("Hello world\n")
    write(env, "notes.txt", "Hello world\n")
    spec = {
        "func": "compare_text_file",
        "result": file("~/notes.txt"),
        "expected": {"type": "local_file", "path": "expected/notes.txt"},
    }
    assert evaluate(spec, env, case_dir).passed


def test_local_file_missing_is_a_case_error(env: LocalEnv, tmp_path: Path) -> None:
    spec = {
        "func": "exact_match",
        "result": file("~/x"),
        "expected": {"type": "local_file", "path": "gone.txt"},
    }
    with pytest.raises(EvaluatorError, match=r"^evaluator\.expected: local_file"):
        evaluate(spec, env, tmp_path)
    with pytest.raises(EvaluatorError, match="case directory"):
        evaluate(spec, env)


def test_local_file_stays_inside_the_case_dir_and_reads_regular_files_only(
    env: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case_dir = tmp_path / "case"
    (case_dir / "sub").mkdir(parents=True)
    (case_dir / "big.txt").write_text("0123456789")
    (tmp_path / "secret.txt").write_text("secret")
    (case_dir / "link").symlink_to(tmp_path, target_is_directory=True)  # passes the load-time '..' check

    def expected(path: str) -> dict[str, Any]:
        return {"func": "exact_match", "result": file("~/x"), "expected": {"type": "local_file", "path": path}}

    with pytest.raises(EvaluatorError, match=r"^evaluator\.expected: local_file: 'link/secret\.txt' resolves to .*"
                                             r"outside the case directory"):
        evaluate(expected("link/secret.txt"), env, case_dir)
    with pytest.raises(EvaluatorError, match="not a regular file"):
        evaluate(expected("sub"), env, case_dir)
    monkeypatch.setattr("pytest_retrace.evaluators.getters.MAX_LOCAL_FILE_BYTES", 5)
    with pytest.raises(EvaluatorError, match="larger than 5 bytes"):
        evaluate(expected("big.txt"), env, case_dir)


@pytest.mark.parametrize("timeout", [0, -1, 601, float("inf"), float("nan"), True])
def test_command_getter_timeout_is_positive_and_bounded(timeout: object) -> None:
    spec = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true", "timeout": timeout},
            "expected": {"type": "rule", "rules": "x"}}
    with pytest.raises(EvaluatorError, match=r"^evaluator\.result\.timeout: (must be seconds in \(0, 600\]|wrong)"):
        validate_evaluator(spec)
    validate_evaluator({**spec, "result": {**spec["result"], "timeout": 600}})


def test_absent_and_none_expected_give_none(env: LocalEnv) -> None:
    write(env, "a.txt", "x")
    assert score({"func": "file_exists", "result": file("~/a.txt")}, env) == 1.0
    assert score({"func": "file_exists", "result": file("~/a.txt"), "expected": {"type": "none"}}, env) == 1.0
    assert score({"func": "file_exists", "result": file("~/a.txt"), "expected": None}, env) == 1.0


# --- text metrics --------------------------------------------------------------------------------


def test_exact_match_decodes_bytes(env: LocalEnv) -> None:
    write(env, "a.txt", "héllo")
    assert score(check("exact_match", file("~/a.txt"), "héllo"), env) == 1.0
    assert score(check("exact_match", file("~/a.txt"), "hello"), env) == 0.0
    cmd = {"type": "vm_command_line", "command": "echo 42"}
    assert score(check("exact_match", cmd, "42"), env) == 0.0  # trailing newline counts...
    assert score(check("exact_match", cmd, "42", strip=True), env) == 1.0  # ...unless stripped


def test_file_exists_metric(env: LocalEnv) -> None:
    write(env, "a.txt", "x")
    exists = {"type": "vm_file_exists", "path": "~/a.txt"}
    assert score({"func": "file_exists", "result": exists}, env) == 1.0
    assert score(check("file_exists", exists, False), env) == 0.0
    assert score(check("file_exists", file("~/gone.txt"), False), env) == 1.0
    result = evaluate({"func": "file_exists", "result": file("~/gone.txt")}, env)
    assert not result.passed and result.details == [
        "file_exists(~/gone.txt): does not exist, expected the opposite"
    ]


def test_compare_text_file_pass_fail_and_detail_line(env: LocalEnv) -> None:
    write(env, "notes.txt", "Hello wor")
    failed = evaluate(check("compare_text_file", file("~/notes.txt"), {"text": "Hello world"}), env)
    assert failed == Evaluation(0.0, False, ["compare_text_file(~/notes.txt): 'Hello wor' != 'Hello world'"])
    write(env, "notes.txt", "Hello world\n")
    assert evaluate(check("compare_text_file", file("~/notes.txt"), {"text": "Hello world\n"}), env).passed
    assert score(check("compare_text_file", file("~/notes.txt"), "Hello world"), env) == 0.0
    assert score(check("compare_text_file", file("~/notes.txt"), "Hello world", strip=True), env) == 1.0


def test_compare_text_file_options(env: LocalEnv) -> None:
    write(env, "n.txt", "  Hello\n\n   WORLD  \n")
    spec = check("compare_text_file", file("~/n.txt"), "hello world", ignore_blanks=True, ignore_case=True)
    assert score(spec, env) == 1.0
    assert score(check("compare_text_file", file("~/n.txt"), "hello world", ignore_blanks=True), env) == 0.0


def test_compare_text_file_names_first_differing_line(env: LocalEnv) -> None:
    write(env, "n.txt", "a\nb\nc\n")
    result = evaluate(check("compare_text_file", file("~/n.txt"), "a\nB\nc\n"), env)
    assert result.details == ["compare_text_file(~/n.txt): line 2: 'b' != 'B'"]


def test_compare_text_file_missing_file(env: LocalEnv) -> None:
    result = evaluate(check("compare_text_file", file("~/n.txt"), "x"), env)
    assert result.details == ["compare_text_file(~/n.txt): file does not exist"]


def test_match_regex(env: LocalEnv) -> None:
    write(env, "log.txt", "start\nStatus: OK\nend\n")
    assert (
        score(check("match_regex", file("~/log.txt"), {"pattern": r"^Status: OK$"}, multiline=True), env)
        == 1.0
    )
    assert score(check("match_regex", file("~/log.txt"), r"^Status: OK$"), env) == 0.0
    assert score(check("match_regex", file("~/log.txt"), "status: ok", ignorecase=True), env) == 1.0
    assert score(check("match_regex", file("~/log.txt"), "FAILED"), env) == 0.0


def test_contains_text(env: LocalEnv) -> None:
    cmd = {"type": "vm_command_line", "command": "printf 'alpha beta gamma'"}
    assert score(check("contains_text", cmd, "beta"), env) == 1.0
    assert score(check("contains_text", cmd, ["alpha", "gamma"]), env) == 1.0
    assert score(check("contains_text", cmd, {"text": "BETA"}), env) == 0.0
    assert score(check("contains_text", cmd, {"text": "BETA"}, ignore_case=True), env) == 1.0
    failed = evaluate(check("contains_text", cmd, ["alpha", "delta"]), env)
    assert "missing 'delta'" in failed.details[0]


def test_command_succeeds(env: LocalEnv) -> None:
    ok = {"type": "vm_command_result", "command": "test -d ~"}
    bad = {"type": "vm_command_result", "command": "echo nope >&2; exit 1"}
    assert score({"func": "command_succeeds", "result": ok}, env) == 1.0
    failed = evaluate({"func": "command_succeeds", "result": bad}, env)
    assert failed.score == 0.0 and failed.details == [
        "command_succeeds(echo nope >&2; exit 1): exit 1, expected 0: 'nope'"
    ]
    assert score(check("command_succeeds", bad, 1), env) == 1.0


def test_undecodable_text_scores_zero_with_reason(env: LocalEnv) -> None:
    write(env, "n.txt", b"\xff\xfe bad")
    result = evaluate(check("compare_text_file", file("~/n.txt"), "x"), env)
    assert result.score == 0.0 and "UnicodeDecodeError" in result.details[0]


# --- JSON / INI ----------------------------------------------------------------------------------

SETTINGS = {"editor": {"fontSize": 14, "wordWrap": "on", "rulers": [80, 120]}, "telemetry": False}


def test_check_json_key_single_and_many(env: LocalEnv) -> None:
    write(env, "settings.json", json.dumps(SETTINGS))
    path = file("~/settings.json")
    assert score(check("check_json_key", path, {"key": "editor.fontSize", "value": 14}), env) == 1.0
    assert score(check("check_json_key", path, {"key": "editor.fontSize", "value": 12}), env) == 0.0
    many = {"keys": {"editor.wordWrap": "on", "editor.rulers.1": 120, "telemetry": False}}
    assert score(check("check_json_key", path, many), env) == 1.0


def test_check_json_key_missing_and_strict_types(env: LocalEnv) -> None:
    write(env, "settings.json", json.dumps(SETTINGS))
    missing = evaluate(
        check("check_json_key", file("~/settings.json"), {"key": "editor.tabSize", "value": 4}), env
    )
    assert missing.score == 0.0 and missing.details == [
        "check_json_key(~/settings.json): editor.tabSize: missing"
    ]
    # JSON false must not match 0.
    assert (
        score(check("check_json_key", file("~/settings.json"), {"key": "telemetry", "value": 0}), env) == 0.0
    )


def test_check_json_key_invalid_json_scores_zero(env: LocalEnv) -> None:
    write(env, "settings.json", "{not json")
    result = evaluate(check("check_json_key", file("~/settings.json"), {"key": "a", "value": 1}), env)
    assert result.score == 0.0 and "JSONDecodeError" in result.details[0]


def test_check_ini_key_plain_ini(env: LocalEnv) -> None:
    write(env, "app.ini", "[General]\nTheme = dark\nvolume=7\n; comment\n[DEFAULT]\nx=1\n")
    path = file("~/app.ini")
    assert (
        score(check("check_ini_key", path, {"section": "General", "key": "Theme", "value": "dark"}), env)
        == 1.0
    )
    assert score(check("check_ini_key", path, {"keys": {"General/volume": 7, "DEFAULT/x": "1"}}), env) == 1.0
    assert (
        score(check("check_ini_key", path, {"section": "General", "key": "theme", "value": "dark"}), env)
        == 0.0
    )
    missing = evaluate(check("check_ini_key", path, {"keys": {"Other/Theme": "dark"}}), env)
    assert missing.details == ["check_ini_key(~/app.ini): Other/Theme: missing"]


def test_check_ini_key_glib_keyfile_and_dconf_dump(env: LocalEnv) -> None:
    keyfile = (
        "# GLib keyfile\n[Desktop Entry]\nName=Editor\nName[de]=Bearbeiter\n"
        "[org/gnome/desktop/interface]\nmonospace-font-name='Monospace 12'\nenable-animations=false\n"
    )
    write(env, ".config/dump.ini", keyfile)
    path = file("~/.config/dump.ini")
    font = {"keys": {"org/gnome/desktop/interface/monospace-font-name": "Monospace 12"}}
    assert score(check("check_ini_key", path, font), env) == 0.0  # quoted in the file
    assert score(check("check_ini_key", path, font, unquote=True), env) == 1.0
    others = {
        "keys": {
            "Desktop Entry/Name[de]": "Bearbeiter",
            "org/gnome/desktop/interface/enable-animations": False,
        }
    }
    assert score(check("check_ini_key", path, others), env) == 1.0


def test_check_ini_key_from_command_output(env: LocalEnv) -> None:
    cmd = {"type": "vm_command_line", "command": "printf '[a/b]\\nk=\"v w\"\\n'"}
    assert (
        score(check("check_ini_key", cmd, {"section": "a/b", "key": "k", "value": "v w"}, unquote=True), env)
        == 1.0
    )


def test_check_ini_key_unparseable_scores_zero(env: LocalEnv) -> None:
    write(env, "bad.ini", "key=before any section\n")
    result = evaluate(
        check("check_ini_key", file("~/bad.ini"), {"section": "a", "key": "b", "value": "c"}), env
    )
    assert result.score == 0.0 and "MissingSectionHeaderError" in result.details[0]


# --- spreadsheets --------------------------------------------------------------------------------

GNUMERIC_XML = """<?xml version="1.0" encoding="UTF-8"?>
<gnm:Workbook xmlns:gnm="http://www.gnumeric.org/v10.dtd" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <gnm:Version Epoch="1" Major="12" Minor="55" Full="1.12.55"/>
  <gnm:SheetNameIndex>
    <gnm:SheetName gnm:Cols="256" gnm:Rows="65536">Budget</gnm:SheetName>
    <gnm:SheetName gnm:Cols="256" gnm:Rows="65536">Notes</gnm:SheetName>
  </gnm:SheetNameIndex>
  <gnm:Sheets>
    <gnm:Sheet DisplayFormulas="0" HideZero="0" HideGrid="0">
      <gnm:Name>Budget</gnm:Name>
      <gnm:MaxCol>2</gnm:MaxCol>
      <gnm:MaxRow>1</gnm:MaxRow>
      <gnm:Names>
        <gnm:Name><gnm:name>Print_Area</gnm:name><gnm:value>#REF!</gnm:value></gnm:Name>
      </gnm:Names>
      <gnm:Cells>
        <gnm:Cell Row="0" Col="0" ValueType="60">Item</gnm:Cell>
        <gnm:Cell Row="0" Col="1" ValueType="40">42</gnm:Cell>
        <gnm:Cell Row="1" Col="1" ValueType="40">3.5000000000000001</gnm:Cell>
        <gnm:Cell Row="1" Col="2" ValueType="20">TRUE</gnm:Cell>
        <gnm:Cell Row="2" Col="1">=B1*2</gnm:Cell>
      </gnm:Cells>
    </gnm:Sheet>
    <gnm:Sheet>
      <gnm:Name>Notes</gnm:Name>
      <gnm:Cells><gnm:Cell Row="0" Col="0" ValueType="60">todo</gnm:Cell></gnm:Cells>
    </gnm:Sheet>
  </gnm:Sheets>
</gnm:Workbook>
"""

CELLS = {"A1": "Item", "B1": "42", "B2": 3.5}


def cells(expected: dict[str, Any]) -> dict[str, Any]:
    return {"cells": expected}


def make_xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Budget"
    sheet["A1"], sheet["B1"], sheet["B2"], sheet["C2"] = "Item", 42, 3.5, True
    book.create_sheet("Notes")["A1"] = "todo"
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


@pytest.fixture(params=["csv", "xlsx", "gnumeric"])
def sheet_path(request: pytest.FixtureRequest, env: LocalEnv) -> str:
    content = {
        "csv": b"Item,42,\n,3.5,TRUE\n",
        "xlsx": make_xlsx(),
        "gnumeric": gzip.compress(GNUMERIC_XML.encode()),
    }[request.param]
    write(env, f"budget.{request.param}", content)
    return f"~/budget.{request.param}"


def test_compare_cells_passes_in_every_format(env: LocalEnv, sheet_path: str) -> None:
    assert evaluate(
        check("compare_cells", file(sheet_path), cells({**CELLS, "C2": True, "A2": None})), env
    ).passed
    assert score(check("compare_cell", file(sheet_path), {"cell": "B1", "value": 42}), env) == 1.0


def test_compare_cells_fails_in_every_format(env: LocalEnv, sheet_path: str) -> None:
    result = evaluate(check("compare_cells", file(sheet_path), cells({"B1": 41, "A1": "item"})), env)
    assert result.score == 0.0
    assert "B1:" in result.details[0] and "A1: 'Item' != 'item'" in result.details[0]


def test_compare_cells_numeric_tolerance(env: LocalEnv, sheet_path: str) -> None:
    assert score(check("compare_cells", file(sheet_path), cells({"B2": 3.51})), env) == 0.0
    assert score(check("compare_cells", file(sheet_path), cells({"B2": 3.51}), abs_tol=0.02), env) == 1.0


def test_compare_cells_sheet_by_name(env: LocalEnv) -> None:
    for name, content in (("b.xlsx", make_xlsx()), ("b.gnumeric", gzip.compress(GNUMERIC_XML.encode()))):
        write(env, name, content)
        assert (
            score(check("compare_cells", file(f"~/{name}"), cells({"A1": "todo"}), sheet="Notes"), env) == 1.0
        )
        missing = evaluate(check("compare_cells", file(f"~/{name}"), cells({"A1": "x"}), sheet="Nope"), env)
        assert missing.score == 0.0 and "no sheet 'Nope'" in missing.details[0]


def test_xlsx_dates_and_cached_formula_values(env: LocalEnv) -> None:
    import datetime as dt

    import openpyxl

    book = openpyxl.Workbook()
    book.active["A1"] = dt.datetime(2024, 3, 1)
    book.active["A2"] = "=1+1"  # openpyxl stores no cached value: the cell reads as empty (data_only)
    buffer = io.BytesIO()
    book.save(buffer)
    write(env, "d.xlsx", buffer.getvalue())
    expected = cells({"A1": "2024-03-01", "A2": None})
    assert score(check("compare_cells", file("~/d.xlsx"), expected), env) == 1.0


def test_gnumeric_formula_cells_hold_their_formula(env: LocalEnv) -> None:
    write(env, "b.gnumeric", gzip.compress(GNUMERIC_XML.encode()))
    assert score(check("compare_cells", file("~/b.gnumeric"), cells({"B3": "=B1*2"})), env) == 1.0


def test_uncompressed_gnumeric_is_read_too(env: LocalEnv) -> None:
    write(env, "plain.gnumeric", GNUMERIC_XML)
    assert score(check("compare_cells", file("~/plain.gnumeric"), cells(CELLS)), env) == 1.0


@pytest.mark.skipif(shutil.which("ssconvert") is None, reason="needs Gnumeric's ssconvert")
def test_compare_cells_on_a_file_written_by_gnumeric(env: LocalEnv) -> None:
    write(env, "in.csv", "Item,42\nx,3.5\n")
    assert env.run("ssconvert ~/in.csv ~/real.gnumeric").returncode == 0
    assert score(check("compare_cells", file("~/real.gnumeric"), cells(CELLS)), env) == 1.0


def test_compare_cells_format_option_and_command_output(env: LocalEnv) -> None:
    write(env, "data.txt", "a,b\n1,2\n")
    assert score(check("compare_cells", file("~/data.txt"), cells({"B2": 2}), format="csv"), env) == 1.0
    cmd = {"type": "vm_command_line", "command": "printf 'x\\ty\\n'"}
    assert score(check("compare_cells", cmd, cells({"B1": "y"}), format="tsv"), env) == 1.0


def test_compare_cells_missing_file(env: LocalEnv) -> None:
    result = evaluate(check("compare_cells", file("~/gone.xlsx"), cells({"A1": 1})), env)
    assert result.score == 0.0 and result.details == ["compare_cells(~/gone.xlsx): file does not exist"]


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        ("bad.xlsx", b"this is not a zip", "BadZipFile"),
        ("bad.gnumeric", b"\x1f\x8b\x08\x00garbage", "error:"),
        (
            "bad2.gnumeric",
            b"<gnm:Workbook xmlns:gnm='http://www.gnumeric.org/v10.dtd'><unclosed>",
            "ParseError",
        ),
        ("other.gnumeric", b"<html/>", "not a Gnumeric workbook"),
    ],
)
def test_corrupt_spreadsheets_score_zero_with_reason(
    env: LocalEnv, name: str, content: bytes, error: str
) -> None:
    write(env, name, content)
    result = evaluate(check("compare_cells", file(f"~/{name}"), cells({"A1": 1})), env)
    assert result.score == 0.0 and not result.passed
    assert error in result.details[0]


# --- composition and negation --------------------------------------------------------------------


@pytest.fixture
def two_files(env: LocalEnv) -> LocalEnv:
    write(env, "a.txt", "A")
    write(env, "b.txt", "B")
    return env


def pair(conj: str, second: str) -> dict[str, Any]:
    return {
        "func": ["compare_text_file", "compare_text_file"],
        "result": [file("~/a.txt"), file("~/b.txt")],
        "expected": [{"type": "rule", "rules": "A"}, {"type": "rule", "rules": second}],
        "conj": conj,
    }


def test_func_list_and_or(two_files: LocalEnv) -> None:
    assert score(pair("and", "B"), two_files) == 1.0
    anded = evaluate(pair("and", "X"), two_files)
    assert anded.score == 0.0 and len(anded.details) == 2  # all checks run, for complete details
    assert score(pair("or", "X"), two_files) == 1.0
    assert score({**pair("or", "X"), "expected": [{"type": "rule", "rules": "Y"}] * 2}, two_files) == 0.0


def test_func_list_defaults_to_and_and_per_func_options(two_files: LocalEnv) -> None:
    spec = pair("and", " B ")
    del spec["conj"]
    assert score(spec, two_files) == 0.0
    assert score({**spec, "options": [{}, {"strip": True}]}, two_files) == 1.0
    assert score({**spec, "options": [None, {"strip": True}]}, two_files) == 1.0


def test_nested_checks(two_files: LocalEnv) -> None:
    spec = {
        "conj": "or",
        "checks": [
            pair("and", "X"),
            {"conj": "and", "checks": [check("file_exists", file("~/a.txt")), pair("or", "nope")]},
        ],
    }
    assert evaluate(spec, two_files).passed
    spec["checks"][1]["checks"][0] = check("file_exists", file("~/zzz.txt"))
    assert not evaluate(spec, two_files).passed


def test_negate_option_and_block(two_files: LocalEnv) -> None:
    absent = check("file_exists", file("~/tmp.lock"), negate=True)
    result = evaluate(absent, two_files)
    assert result.passed and result.details == [
        "not file_exists(~/tmp.lock): does not exist, expected the opposite (negated: pass)"
    ]
    write(two_files, "tmp.lock", "")
    assert score(absent, two_files) == 0.0
    assert score({"negate": True, "checks": [pair("and", "X")]}, two_files) == 1.0
    assert score({**pair("and", "B"), "negate": True}, two_files) == 0.0


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"func": "nope", "result": file("~/a")},
            r"^evaluator\.func: unknown metric 'nope' \(known: .*exact_match",
        ),
        (
            {"func": ["exact_match", "foo"], "result": [file("~/a"), file("~/b")]},
            r"^evaluator\.func\[1\]: unknown metric 'foo' \(known: ",
        ),
        (
            {"func": ["exact_match"], "result": [{"type": "vm_fiel", "path": "~/a"}]},
            r"^evaluator\.result\[0\]\.type: unknown getter type 'vm_fiel' \(known: .*vm_file",
        ),
        (
            {"func": ["exact_match", "exact_match"], "result": [file("~/a")]},
            r"^evaluator\.result: has 1 entries but func has 2",
        ),
        (
            {"func": ["exact_match"] * 2, "result": [file("~/a")] * 2, "expected": [None]},
            r"^evaluator\.expected: has 1 entries but func has 2",
        ),
        ({"func": ["exact_match"] * 2, "result": file("~/a")}, r"^evaluator\.result: must be a list"),
        (
            {"func": ["exact_match"] * 2, "result": [file("~/a")] * 2, "options": [{}]},
            r"^evaluator\.options: has 1 entries",
        ),
        (
            {"func": "exact_match", "result": file("~/a"), "conj": "xor"},
            r"^evaluator\.conj: must be 'and' or 'or'",
        ),
        ({"func": "exact_match"}, r"^evaluator\.result: missing"),
        ({"result": file("~/a")}, r"^evaluator: missing 'func'"),
        ({"func": [], "result": []}, r"^evaluator\.func: must not be an empty list"),
        ({"func": "exact_match", "result": {"type": "vm_file"}}, r"^evaluator\.result\.path: missing"),
        (
            {"func": "exact_match", "result": {"type": "vm_file", "paht": "~/a"}},
            r"evaluator\.result\.path: missing",
        ),
        (
            {"func": "exact_match", "result": {"type": "vm_file", "path": "~/a", "paht": "~/a"}},
            r"^evaluator\.result\.paht: unknown field for getter 'vm_file'",
        ),
        ({"func": "exact_match", "result": {"path": "~/a"}}, r"^evaluator\.result\.type: missing"),
        ({"func": "exact_match", "result": file("~/a"), "expect": 1}, r"^evaluator: unknown key\(s\) expect"),
        (
            {"func": "exact_match", "result": file("~/a"), "options": {"stirp": True}},
            r"^evaluator\.options\.stirp: unknown option for exact_match \(known: negate, strip\)",
        ),
        (
            {"func": "exact_match", "result": file("~/a"), "options": {"strip": "yes"}},
            r"^evaluator\.options\.strip: ",
        ),
        (
            {"func": "exact_match", "result": file("~/a"), "options": {"negate": 1}},
            r"^evaluator\.options\.negate: ",
        ),
        ({"func": "exact_match", "result": file("~/a"), "options": {"_path": "x"}}, r"unknown option"),
        (
            {
                "func": "exact_match",
                "result": file("~/a"),
                "expected": {"type": "local_file", "path": "/etc/passwd"},
            },
            r"^evaluator\.expected\.path: must be relative",
        ),
        (
            {
                "func": "exact_match",
                "result": file("~/a"),
                "expected": {"type": "local_file", "path": "../x"},
            },
            r"^evaluator\.expected\.path: must not leave",
        ),
        ({"checks": []}, r"^evaluator\.checks: must be a non-empty list"),
        (
            {
                "conj": "or",
                "checks": [check("exact_match", file("~/a"), "x"), {"func": "bad", "result": file("~/a")}],
            },
            r"^evaluator\.checks\[1\]\.func: unknown metric 'bad'",
        ),
        (
            check("match_regex", file("~/a"), "(unclosed"),
            r"^evaluator\.func \(match_regex\): invalid regular expression",
        ),
        (
            check("check_json_key", file("~/a"), {"key": "a"}),
            r"^evaluator\.func \(check_json_key\): expected must be",
        ),
        (check("check_ini_key", file("~/a"), {"keys": {"nosection": 1}}), r"is not 'section/key'"),
        (check("compare_cells", file("~/a.numbers"), cells({"A1": 1})), r"unsupported spreadsheet format .numbers."),
        (check("compare_cells", file("~/a"), cells({"A1": 1})), r"cannot tell the spreadsheet format"),
        (check("compare_cells", file("~/a.csv"), cells({"A0": 1})), r"not a cell reference: 'A0'"),
        (check("compare_text_file", file("~/a")), r"expected is required"),
        (check("file_exists", file("~/a"), "yes"), r"expected must be true, false or absent"),
        (
            {"func": "command_succeeds", "result": {"type": "vm_command_result", "command": ""}},
            r"command: must not be empty",
        ),
        ("not a mapping", r"^evaluator: must be a mapping"),
    ],
)
def test_validation_errors_name_the_field(spec: Any, message: str) -> None:
    with pytest.raises(EvaluatorError, match=message):
        validate_evaluator(spec)


def test_validation_uses_the_given_where() -> None:
    with pytest.raises(EvaluatorError, match=r"^cases/x\.yaml: evaluator\.func: unknown metric"):
        validate_evaluator({"func": "nope", "result": file("~/a")}, where="cases/x.yaml: evaluator")


def test_valid_specs_pass_validation() -> None:
    validate_evaluator(pair("or", "X"))
    validate_evaluator(
        {"checks": [pair("and", "B"), check("file_exists", file("~/a"), negate=True)], "negate": False}
    )
    validate_evaluator({**check("exact_match", file("~/a"), "x"), "postconfig": [{"type": "sleep"}]})
    validate_evaluator(
        {"func": "exact_match", "result": {"type": "vm_command_line", "command": "ls", "timeout": 5}}
    )


def test_evaluate_validates_before_touching_the_env(tmp_path: Path) -> None:
    with pytest.raises(EvaluatorError):
        evaluate({"func": ["exact_match", "nope"], "result": [file("~/a")] * 2}, BrokenEnv(tmp_path))


def test_wrong_getter_for_metric_is_a_case_error(env: LocalEnv) -> None:
    spec = {"func": "command_succeeds", "result": file("~/a")}
    with pytest.raises(EvaluatorError, match=r"^evaluator\.func \(command_succeeds\): result is a NoneType"):
        evaluate(spec, env)


# --- infrastructure failures ---------------------------------------------------------------------


def test_env_exceptions_propagate(tmp_path: Path) -> None:
    broken = BrokenEnv(tmp_path)
    with pytest.raises(RuntimeError, match="sandbox is gone"):
        evaluate(
            {"func": "command_succeeds", "result": {"type": "vm_command_result", "command": "true"}}, broken
        )
    with pytest.raises(OSError, match="connection to the VM lost"):
        evaluate(check("compare_cells", file("~/a.xlsx"), cells({"A1": 1})), broken)


def test_env_exception_propagates_even_inside_or(env: LocalEnv) -> None:
    class FlakyEnv(LocalEnv):
        def run(self, command: str, timeout: float = 30.0) -> CommandResult:
            raise RuntimeError("sandbox is gone")

    write(env, "a.txt", "x")
    spec = {
        "conj": "or",
        "checks": [
            check("file_exists", file("~/a.txt")),
            check("contains_text", {"type": "vm_command_line", "command": "cat ~/a.txt"}, "x"),
        ],
    }
    with pytest.raises(RuntimeError):
        evaluate(spec, FlakyEnv(env.home))


def test_plugin_getter_wrapping_an_env_error_still_propagates(env: LocalEnv, plugin_registry: None) -> None:
    @register_getter("wrapped_file", required={"path": str})
    def wrapped_file(config: Any, ctx: GetterContext) -> Any:
        try:
            return ctx.env.read_file(config["path"])
        except OSError as exc:
            raise ValueError("could not read") from exc

    with pytest.raises(OSError, match="lost"):
        evaluate(
            {"func": "file_exists", "result": {"type": "wrapped_file", "path": "~/a"}}, BrokenEnv(env.home)
        )


def test_command_timeout_is_an_outcome_not_a_crash(env: LocalEnv) -> None:
    spec = {
        "func": "command_succeeds",
        "result": {"type": "vm_command_result", "command": "sleep 5", "timeout": 0.2},
    }
    assert evaluate(spec, env).details == ["command_succeeds(sleep 5): exit 124, expected 0: 'timed out'"]


# --- plugins -------------------------------------------------------------------------------------


@pytest.fixture
def plugin_registry() -> Iterator[None]:
    """Registries are module-global: restore them so plugin tests cannot leak into others."""
    registries = (METRICS, GETTERS, base.METRIC_CHECKS, base.GETTER_FIELDS)
    saved = [dict(registry) for registry in registries]
    yield
    for registry, before in zip(registries, saved):
        registry.clear()
        registry.update(before)  # type: ignore[attr-defined]


def test_plugin_metric_and_getter(env: LocalEnv, plugin_registry: None) -> None:
    @register_getter("word_count", required={"path": str}, optional={})
    def word_count(config: Any, ctx: GetterContext) -> int:
        return len((ctx.env.read_file(config["path"]) or b"").split())

    @register_metric("at_least")
    def at_least(result: int, expected: int, *, partial: bool = False) -> float:
        if partial:
            return min(1.0, result / expected)
        return float(result >= expected)

    write(env, "essay.txt", "one two three")
    spec = {
        "func": "at_least",
        "result": {"type": "word_count", "path": "~/essay.txt"},
        "expected": {"type": "rule", "rules": 6},
        "options": {"partial": True},
    }
    result = evaluate(spec, env)
    assert result == Evaluation(0.5, False, ["at_least(~/essay.txt): score 0.5"])
    with pytest.raises(EvaluatorError, match=r"evaluator\.result\.words: unknown field"):
        validate_evaluator({**spec, "result": {"type": "word_count", "path": "~/e", "words": 1}})


def test_score_is_a_float_with_a_reason() -> None:
    assert Score.ok() == 1.0 and Score.fail("why").reason == "why"
    assert isinstance(METRICS["exact_match"]("a", b"a"), float)


def test_importing_evaluators_does_not_import_openpyxl() -> None:
    code = "import sys, pytest_retrace.evaluators; print('openpyxl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_failing_evaluation_is_repeated_for_the_wait_so_a_late_write_counts(tmp_path: Path) -> None:
    """An app writing its file after the screen settled (LibreOffice's export under load): a background
    writer stands in for it. Without a wait the evaluation reads the old file; with one it sees the write."""
    import threading
    import time

    spec = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out.txt"},
            "expected": {"type": "rule", "rules": {"text": "saved"}}}
    env = LocalEnv(tmp_path)
    (tmp_path / "out.txt").write_text("old")

    def save_late() -> None:
        time.sleep(0.8)
        (tmp_path / "out.txt").write_text("saved")

    assert not evaluate(spec, env).passed
    writer = threading.Thread(target=save_late)
    writer.start()
    assert not evaluate(spec, env).passed  # read before the write
    start = time.monotonic()
    assert evaluate(spec, env, wait=3.0, interval=0.1).passed
    assert time.monotonic() - start < 2.0  # a pass ends the wait
    writer.join()
    (tmp_path / "out.txt").write_text("wrong")
    start = time.monotonic()
    assert not evaluate(spec, env, wait=0.5, interval=0.1).passed  # a failure after the wait is the verdict
    assert time.monotonic() - start >= 0.5


# --- a failing evaluation ends once the task is idle and what it read stopped changing --------------------------

class TaskEnv(LocalEnv):
    """LocalEnv whose task is a set of real host processes: ``task_cpu_seconds`` is their CPU time, read from
    /proc as the xvfb environment reads its sandbox's."""

    def __init__(self, home: Path, *procs: subprocess.Popen[bytes]) -> None:
        super().__init__(home)
        self.procs = procs

    def task_cpu_seconds(self) -> float:
        from pytest_retrace.envs.procfs import cpu_seconds

        return cpu_seconds(p.pid for p in self.procs if p.poll() is None)


_SAVED = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out.txt"},
          "expected": {"type": "rule", "rules": {"text": "saved"}}}


@pytest.fixture
def task_procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _python(procs: list[subprocess.Popen[bytes]], code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    procs.append(proc)
    return proc


def test_a_failure_is_final_once_the_task_is_idle_and_the_file_unchanged(
        tmp_path: Path, task_procs: list[subprocess.Popen[bytes]]) -> None:
    """The wrong file of an idle task cannot become right: the verdict comes after one quiet window, not at
    the cap (which made every failing evaluation cost the whole LATE_WRITES)."""
    import time

    sleeper = _python(task_procs, "import time; time.sleep(120)")
    (tmp_path / "out.txt").write_text("wrong")
    time.sleep(0.5)  # past the interpreter's start-up, which is CPU time of the task
    start = time.monotonic()
    result = evaluate(_SAVED, TaskEnv(tmp_path, sleeper), wait=30.0)
    took = time.monotonic() - start
    assert not result.passed and took < 20.0  # the cap would be 30 s; one window is 1 s
    assert result.details[-1] == "final after 2 evaluations: the task idle for 1 s and everything read unchanged"


def test_a_busy_task_is_waited_for_while_its_file_has_not_changed_yet(
        tmp_path: Path, task_procs: list[subprocess.Popen[bytes]]) -> None:
    """An app exporting (CPU busy) before it writes the file, as LibreOffice's xlsx export under load: the
    unchanged old file alone must not end the wait."""
    (tmp_path / "out.txt").write_text("old")
    exporter = _python(task_procs, f"""
import time
end = time.monotonic() + 3.0
while time.monotonic() < end:
    pass
open({str(tmp_path / 'out.txt')!r}, 'w').write('saved')
time.sleep(120)
""")
    result = evaluate(_SAVED, TaskEnv(tmp_path, exporter), wait=30.0)
    assert result.passed, result.details
    assert result.details[-1].startswith("passed on evaluation ")


def test_a_file_still_changing_is_waited_for_while_the_task_idles(
        tmp_path: Path, task_procs: list[subprocess.Popen[bytes]]) -> None:
    """A writer that uses almost no CPU (it sleeps between writes) but whose file changes between two
    evaluations: an idle task alone must not end the wait while what the evaluator reads still changes."""
    (tmp_path / "out.txt").write_text("old")
    writer = _python(task_procs, f"""
import time
for i in range(40):
    open({str(tmp_path / 'out.txt')!r}, 'w').write(f'part {{i}}')
    time.sleep(0.1)
open({str(tmp_path / 'out.txt')!r}, 'w').write('saved')
time.sleep(120)
""")
    result = evaluate(_SAVED, TaskEnv(tmp_path, writer), wait=30.0)
    assert result.passed, result.details


def test_an_env_that_cannot_tell_the_task_cpu_repeats_until_the_cap(tmp_path: Path) -> None:
    """Without task_cpu_seconds (an OSWorld VM) an idle task cannot be told from a busy one: the whole wait."""
    import time

    (tmp_path / "out.txt").write_text("wrong")
    start = time.monotonic()
    result = evaluate(_SAVED, LocalEnv(tmp_path), wait=2.0, interval=0.2)
    assert not result.passed and time.monotonic() - start >= 2.0
    assert result.details[-1].endswith("still failing at the 2 s cap")


@pytest.fixture(scope="module")
def desktop() -> Iterator[Any]:
    from pytest_retrace.envs.xvfb.environment import XvfbEnvironment

    e = XvfbEnvironment()
    e.start()
    yield e
    e.close()


def _mousepad_task(content: str) -> Any:
    from pytest_retrace.replay.cases import Task

    return Task.model_validate({
        "id": "t", "instruction": "x", "domain": "test", "evaluator": _SAVED,
        "setup": [{"type": "file", "path": "~/out.txt", "content": content},
                  {"type": "launch", "command": ["mousepad", "~/out.txt"], "window": "Mousepad"}]})


@pytest.mark.desktop
def test_on_a_desktop_a_failing_evaluation_ends_once_the_app_idles(desktop: Any) -> None:
    """mousepad open on the wrong file, doing nothing: the task's sandbox idles, the verdict is final early."""
    import time

    desktop.reset(_mousepad_task("wrong"), Path("."))
    start = time.monotonic()
    result = evaluate(_SAVED, desktop, wait=30.0)
    assert not result.passed and time.monotonic() - start < 20.0, result.details
    assert "the task idle" in result.details[-1]


@pytest.mark.desktop
def test_on_a_desktop_a_task_still_working_is_waited_for(desktop: Any) -> None:
    """A process of the task's sandbox busy for 3 s before it writes the file: the evaluation waits for it."""
    desktop.reset(_mousepad_task("old"), Path("."))
    started = desktop.run("(end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done; "
                          "printf saved > ~/out.txt) >/dev/null 2>&1 &")
    assert started.returncode == 0, started.stderr
    result = evaluate(_SAVED, desktop, wait=30.0)
    assert result.passed, result.details
