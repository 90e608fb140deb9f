"""``retrace osworld check``: every problem of a task as (reason, detail), as OSWorld's own code (desktop-env)
finds them, short lines, the summary by reason, task lists, --json, the exit status, the apps a provider lacks and
the placeholder cache. Task files are small ones of our own in OSWorld's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.cli import main
from pytest_retrace.dataset.osworld_check import Problem, check_task
from pytest_retrace.osworld.setup import cached

EVALUATOR = {
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat ~/a.txt"},
    "expected": {"type": "rule", "rules": {"expected": "x"}},
}
CONFIG = [{"type": "launch", "parameters": {"command": ["mousepad"]}}]
CLOUD = "https://example.invalid/cache/gold.xlsx"
DOWNLOAD = "https://example.invalid/cache/start.xlsx"
# A problem of every sort desktop-env's checks find, several of some: the old check named only the first.
MANY = {
    "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.invalid"]}},
               {"type": "download", "parameters": {"files": [{"url": DOWNLOAD, "path": "/home/user/a.xlsx"}]}},
               {"type": "googledrive", "parameters": {}},
               {"type": "execute", "parameters": {"command": ["ls"], "bogus": 1}}],
    "evaluator": {
        "func": ["compare_table", "a_metric_desktop_env_does_not_have_with_a_long_name_that_is_not_cut",
                 "compare_image_text"],
        "result": [{"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"}, {"type": "no_such_getter"},
                   {"type": "vm_file", "path": "/home/user/a.png", "dest": "a.png"}],
        "expected": [{"type": "cloud_file", "path": CLOUD, "dest": "gold.xlsx"}, {"type": "rule", "rules": {}},
                     {"type": "googledrive_file", "path": "x"}],
        "postconfig": [{"type": "activate_window", "parameters": {"window_name": "a"}},
                       {"type": "tidy_desktop", "parameters": {}}],
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
        Problem("cloud file not in cache", DOWNLOAD),
        Problem("needs a Google account", "googledrive"),
        Problem("bad config step", "config[3] (execute): got an unexpected keyword argument 'bogus'"),
        Problem("cloud file not in cache", "gold.xlsx"),  # no cache given: as good as an empty one
        Problem("unknown metric", "a_metric_desktop_env_does_not_have_with_a_long_name_that_is_not_cut"),
        Problem("unknown getter", "no_such_getter"),
        Problem("missing package", "easyocr (needs torch)"),  # compare_image_text's, not installed by design
        Problem("needs a Google account", "googledrive_file"),
        Problem("unsupported config step", "tidy_desktop"),  # desktop-env's raises NotImplementedError
    ]
    assert write_task(tmp_path, "os", "good").is_file() and check_task(tmp_path / "os" / "good.json").supported


def test_the_cache_is_looked_in_per_task_under_setupcontrollers_names(tmp_path: Path) -> None:
    evaluator = {"func": "compare_table", "result": {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"},
                 "expected": {"type": "cloud_file", "path": CLOUD, "dest": "gold.xlsx"}}
    config = MANY["config"][1:2]
    path = write_task(tmp_path / "examples", "calc", "t1", config=config, evaluator=evaluator)
    cache = tmp_path / "cache"
    assert [p.reason for p in check_task(path, cache_dir=cache).problems] == ["cloud file not in cache"] * 2
    (cache / "t1").mkdir(parents=True)
    (cache / "t1" / "gold.xlsx").write_bytes(b"gold")
    assert check_task(path, cache_dir=cache).problems == [Problem("cloud file not in cache", DOWNLOAD)]
    (cache / "other" / cached(Path(), DOWNLOAD, "/home/user/a.xlsx").name).parent.mkdir()
    (cache / "other" / cached(Path(), DOWNLOAD, "/home/user/a.xlsx").name).write_bytes(b"x")  # another task's
    assert not check_task(path, cache_dir=cache).supported
    cached(cache / "t1", DOWNLOAD, "/home/user/a.xlsx").write_bytes(b"start")
    assert check_task(path, cache_dir=cache).supported


def test_windows_paths_bom_and_unreadable_files(tmp_path: Path) -> None:
    windows = write_task(tmp_path, "word", "win", encoding="utf-8-sig", config=[
        {"type": "open", "parameters": {"path": "C:\\Users\\User\\Desktop\\Doc1.docx"}}],
        evaluator={**EVALUATOR, "result": {"type": "vm_file", "path": "c:/users/user/a.txt", "dest": "a.txt"}})
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
    write_task(examples, "os", "calc", evaluator={**EVALUATOR, "func": "compare_tables"})
    write_task(examples, "os", "upload", config=[{"type": "upload_file", "parameters": {"files": [
        {"local_path": str(tmp_path / "gone.txt"), "path": "/home/user/gone.txt"}]}}])
    (examples / "os" / "notes.json").write_text('{"about": "not a task"}')
    (examples / "os" / "broken.json").write_text("{not json")
    assert main(["osworld", "check", str(examples)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "ok  os/good" in out
    assert "NO  os/calc: unknown metric compare_tables" in out
    [many] = [line for line in out if line.startswith("NO  chrome/many: ")]
    # one part per reason, its values after it, a cloud file by its file name (the URL is in --json)
    assert many == ("NO  chrome/many: cloud file not in cache start.xlsx, gold.xlsx; needs a Google account "
                    "googledrive, googledrive_file; bad config step config[3] (execute): got an unexpected keyword "
                    "argument 'bogus'; unknown metric a_metric_desktop_env_does_not_have_with_a_long_name_that_is_"
                    "not_cut; unknown getter no_such_getter; missing package easyocr (needs torch); unsupported config step "
                    "tidy_desktop")
    assert len(many) < 400
    assert f"NO  os/upload: local file not found {tmp_path / 'gone.txt'}" in out
    assert "skipped 2 JSON file(s) that are not task definitions (no id and instruction)" in out
    assert "unknown metric (2 tasks): a_metric_desktop_env_does_not_have_with_a_long_name_that_is_not_cut 1, " \
        "compare_tables 1" in out
    assert "needs a Google account (1 task): googledrive 1, googledrive_file 1" in out
    [known] = [line for line in out if line.startswith("desktop-env's metrics: ")]
    assert "compare_table, " in known and "compare_tables" not in known
    assert out[-2:] == ["of the 1 supported, 1 runnable on xvfb here", "1 supported, 3 not supported (of 4)"]
    assert main(["osworld", "check", str(examples / "os" / "good.json")]) == 0
    assert main(["osworld", "check", str(tmp_path / "empty")]) == 2
    assert main(["osworld", "check", str(examples / "os" / "notes.json")]) == 1  # named: checked, and it is not


def test_a_task_list_and_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples"
    write_task(examples, "os", "good")
    write_task(examples, "os", "calc", evaluator={**EVALUATOR, "func": "compare_tables"})
    listing = tmp_path / "test_all.json"
    listing.write_text(json.dumps({"os": ["good", "calc", "gone"]}))
    assert main(["osworld", "check", str(listing), "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["domain"], r["id"], r["supported"]) for r in rows] == [
        ("os", "good", True), ("os", "calc", False), ("os", "gone", False)]
    assert rows[1]["reasons"] == [{"reason": "unknown metric", "detail": "compare_tables"}]
    assert rows[0]["provider"] == "xvfb" and rows[0]["runnable"] is True and rows[0]["needs"] == ["mousepad"]
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
        write_task(tmp_path, "os", f"t{i:04d}", evaluator={**EVALUATOR, "func": "compare_tables"})
    cmd = [sys.executable, "-m", "pytest_retrace.cli", "osworld", "check", str(tmp_path), "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["supported"] is False
        proc.stdout.close()
        err = proc.stderr.read().decode()
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_line_names_four_values_of_a_reason_and_counts_the_rest(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    files = [{"url": f"https://example.invalid/f/file-{i}.pdf", "path": f"/home/user/file-{i}.pdf"} for i in range(7)]
    write_task(tmp_path, "multi_apps", "seven", config=[{"type": "download", "parameters": {"files": files}}])
    assert main(["osworld", "check", str(tmp_path)]) == 1
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("NO  ")]
    assert line == ("NO  multi_apps/seven: cloud file not in cache file-0.pdf, file-1.pdf, file-2.pdf, file-3.pdf "
                    "and 3 more")
    assert main(["osworld", "check", str(tmp_path), "--verbose"]) == 1
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("NO  ")]
    assert line.endswith("file-3.pdf, file-4.pdf, file-5.pdf, file-6.pdf")
