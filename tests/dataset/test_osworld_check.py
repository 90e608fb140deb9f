"""``retrace osworld check``: every problem of a task as (reason, detail), short lines, the summary by reason,
task lists, --json, and the exit status. Task files are small ones of our own in OSWorld's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.cli import main
from pytest_retrace.dataset.osworld_check import Problem, check_task

EVALUATOR = {
    "func": "compare_text_file",
    "result": {"type": "vm_file", "path": "~/a.txt"},
    "expected": {"type": "rule", "rules": {"text": "x"}},
}
CONFIG = [{"type": "launch", "parameters": {"command": ["mousepad"]}}]
CLOUD = "https://example.invalid/cache/gold.xlsx"
# Two unknown metrics, two unknown getters, a postconfig of two steps, two unsupported config steps and a file
# that would be downloaded: the old check named only the first of these.
MANY = {
    "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.invalid"]}},
               {"type": "download", "parameters": {"files": [{"url": CLOUD, "path": "/home/user/a.xlsx"}]}},
               {"type": "googledrive", "parameters": {}}],
    "evaluator": {
        "func": ["compare_table", "is_expected_tabs_and_a_very_long_metric_name_that_is_not_cut"],
        "result": [{"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"},
                   {"type": "open_tabs_info"}],
        "expected": [{"type": "cloud_file", "path": CLOUD, "dest": "gold.xlsx"}, {"type": "rule", "rules": {}}],
        "postconfig": [{"type": "activate_window", "parameters": {"window_name": "a"}},
                       {"type": "sleep", "parameters": {"seconds": 1}}],
    },
}


def write_task(examples: Path, domain: str, task_id: str, *, encoding: str = "utf-8", **fields: Any) -> Path:
    path = examples / domain / f"{task_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"id": task_id, "snapshot": domain, "instruction": "Write x into a.txt", "source": "test",
            "config": CONFIG, "evaluator": EVALUATOR, **fields}
    path.write_text(json.dumps(data), encoding=encoding)
    return path


def test_every_problem_of_a_task_is_named_in_full(tmp_path: Path) -> None:
    path = write_task(tmp_path, "chrome", "many", **MANY)
    assert check_task(path).problems == [
        Problem("unsupported config step", "chrome_open_tabs"),
        Problem("cloud file not in cache", CLOUD),
        Problem("unsupported config step", "googledrive"),
        Problem("unknown metric", "compare_table"),
        Problem("unknown metric", "is_expected_tabs_and_a_very_long_metric_name_that_is_not_cut"),
        Problem("unknown getter", "open_tabs_info"),
        Problem("unknown getter", "cloud_file"),
        Problem("postconfig", "activate_window"),
        Problem("postconfig", "sleep"),
    ]


def test_windows_paths_bom_and_unreadable_files(tmp_path: Path) -> None:
    windows = write_task(tmp_path, "word", "win", encoding="utf-8-sig", config=[
        {"type": "open", "parameters": {"path": "C:\\Users\\User\\Desktop\\Doc1.docx"}}],
        evaluator={**EVALUATOR, "result": {"type": "vm_file", "path": "c:/users/user/a.txt"}})
    check = check_task(windows)
    assert check.id == "win" and check.problems == [
        Problem("windows path", "C:\\Users\\User\\Desktop\\Doc1.docx"), Problem("windows path", "c:/users/user/a.txt")]
    latin = tmp_path / "os" / "latin.json"
    latin.parent.mkdir()
    latin.write_bytes(b'{"id": "latin", "instruction": "caf\xe9"}')
    assert [p.reason for p in check_task(latin).problems] == ["not UTF-8"]
    broken = tmp_path / "os" / "broken.json"
    broken.write_text("{not json")
    assert check_task(broken).problems == [Problem("not JSON", "line 1 column 2: Expecting property name enclosed "
                                                               "in double quotes")]


def test_report_lines_summary_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples"
    write_task(examples, "os", "good")
    write_task(examples, "chrome", "many", **MANY)
    write_task(examples, "os", "calc", evaluator={**EVALUATOR, "func": "compare_table"})
    write_task(examples, "os", "upload", config=[{"type": "upload_file", "parameters": {"files": []}}])
    (examples / "os" / "notes.json").write_text('{"about": "not a task"}')
    (examples / "os" / "broken.json").write_text("{not json")
    assert main(["osworld", "check", str(examples)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "ok  os/good" in out
    assert "NO  os/calc: unknown metric compare_table" in out
    [many] = [line for line in out if line.startswith("NO  chrome/many: ")]
    # one part per reason, its values after it, a cloud file by the name it needs in the cache (URL in --json)
    assert many == ("NO  chrome/many: unsupported config step chrome_open_tabs, googledrive; cloud file not in "
                    "cache gold.xlsx; unknown metric compare_table, is_expected_tabs_and_a_very_long_metric_name_"
                    "that_is_not_cut; unknown getter open_tabs_info, cloud_file; postconfig activate_window, sleep")
    assert "(known:" not in many and len(many) < 400
    [upload] = [line for line in out if line.startswith("NO  os/upload: ")]
    assert "bad config step 0 (upload_file): files must be a non-empty list" in upload
    assert "skipped 2 JSON file(s) that are not task definitions (no id and instruction)" in out
    assert "unknown metric (2 tasks): compare_table 2, is_expected_tabs_and_a_very_long_metric_name_that_is_not_cut 1" \
        in out
    assert "unsupported config step (1 task): chrome_open_tabs 1, googledrive 1" in out
    assert sum(line.startswith("known metrics: ") for line in out) == 1
    assert out[-1] == "1 supported, 3 not supported (of 4)"
    assert main(["osworld", "check", str(examples / "os" / "good.json")]) == 0
    assert main(["osworld", "check", str(tmp_path / "empty")]) == 2
    assert main(["osworld", "check", str(examples / "os" / "notes.json")]) == 1  # named: checked, and it is not


def test_a_task_list_and_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples"
    write_task(examples, "os", "good")
    write_task(examples, "os", "calc", evaluator={**EVALUATOR, "func": "compare_table"})
    listing = tmp_path / "test_all.json"
    listing.write_text(json.dumps({"os": ["good", "calc", "gone"]}))
    assert main(["osworld", "check", str(listing), "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["domain"], r["id"], r["supported"]) for r in rows] == [
        ("os", "good", True), ("os", "calc", False), ("os", "gone", False)]
    assert rows[1]["reasons"] == [{"reason": "unknown metric", "detail": "compare_table"}]
    assert rows[1]["file"] == str(examples / "os" / "calc.json")
    assert rows[2]["reasons"] == [{"reason": "task file not found", "detail": str(examples / "os" / "gone.json")}]
    elsewhere = tmp_path / "lists" / "small.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps({"os": ["good"]}))
    assert main(["osworld", "check", str(elsewhere), "--examples", str(examples)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 supported, 0 not supported (of 1)"


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`retrace osworld check ... --json | head -1`: the pipe closes under the writer, and that is not an error
    to report with a traceback (before: BrokenPipeError, twice)."""
    import subprocess
    import sys

    for i in range(2000):  # more than a pipe buffer of lines
        write_task(tmp_path, "os", f"t{i:04d}", evaluator={**EVALUATOR, "func": "compare_table"})
    cmd = [sys.executable, "-m", "pytest_retrace.cli", "osworld", "check", str(tmp_path), "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["supported"] is False
        proc.stdout.close()
        err = proc.stderr.read().decode()
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
