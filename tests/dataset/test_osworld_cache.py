"""The files an OSWorld task takes from OSWorld's cache (under SetupController's and get_cloud_file's names) and
`retrace osworld cache --placeholders`, the measuring aid that writes empty stand-ins for them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from pytest_retrace.cli import main
from pytest_retrace.dataset.osworld_cache import CacheFile, cache_files

URL = "https://example.invalid/files/Sales%20Q1.xlsx"
GOLD = "https://example.invalid/files/gold.xlsx"
TASK = {
    "id": "t-1", "instruction": "x",
    "config": [{"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Desktop/q1.xlsx"},
                                                             {"url": "", "path": "/home/user/bad"}]}},
               {"type": "launch", "parameters": {"command": ["localc"]}}],
    "evaluator": {
        "func": ["compare_table", "compare_table"],
        "result": [{"type": "vm_file", "path": "/home/user/Desktop/q1.xlsx", "dest": "q1.xlsx"}] * 2,
        "expected": [{"type": "cloud_file", "path": GOLD, "dest": "gold.xlsx"},
                     {"type": "cloud_file", "multi": True, "path": [GOLD, URL], "dest": ["gold.xlsx", "two.xlsx"]}],
        "postconfig": [{"type": "download", "parameters": {"files": [{"url": GOLD, "path": "/tmp/g.xlsx"}]}}],
    },
}


def test_cache_files_are_named_as_desktop_env_names_them() -> None:
    # SetupController._download_setup: <uuid5(NAMESPACE_URL, url)>_<basename of the VM path>
    first = f"{uuid.uuid5(uuid.NAMESPACE_URL, URL)}_q1.xlsx"
    post = f"{uuid.uuid5(uuid.NAMESPACE_URL, GOLD)}_g.xlsx"
    assert cache_files(TASK) == [
        CacheFile(first, URL, "config[0].files[0]"),
        CacheFile(post, GOLD, "evaluator.postconfig[0].files[0]"),
        CacheFile("gold.xlsx", GOLD, "evaluator.expected[0]"),  # once, though two getters read it
        CacheFile("two.xlsx", URL, "evaluator.expected[1]"),
    ]


def test_placeholders_make_the_check_see_past_the_missing_cache(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    examples, cache = tmp_path / "examples", tmp_path / "cache"
    task = examples / "libreoffice_calc" / "t-1.json"
    task.parent.mkdir(parents=True)
    # without the malformed entry, which the check would report
    task.write_text(json.dumps({**TASK, "config": [
        {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Desktop/q1.xlsx"}]}}]}))
    (examples / "notes.json").write_text('{"not": "a task"}')
    assert main(["osworld", "check", str(examples), "--osworld-cache", str(cache)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "0 supported, 1 not supported (of 1)"
    (cache / "t-1").mkdir(parents=True)
    (cache / "t-1" / "gold.xlsx").write_bytes(b"the real file")
    assert main(["osworld", "cache", "--placeholders", str(cache), str(examples)]) == 0
    assert "wrote 3 empty placeholder file(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (cache / "t-1").iterdir()) == sorted(f.name for f in cache_files(json.loads(
        task.read_text())))
    assert (cache / "t-1" / "gold.xlsx").read_bytes() == b"the real file"  # a real file is never replaced
    assert all((cache / "t-1" / n).stat().st_size == 0 for n in ("two.xlsx",))
    assert main(["osworld", "check", str(examples), "--osworld-cache", str(cache)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 supported, 0 not supported (of 1)"
    assert main(["osworld", "cache", "--placeholders", str(cache), str(tmp_path / "none")]) == 2
