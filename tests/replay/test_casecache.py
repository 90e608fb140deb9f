"""The cache of validated case files (replay/casecache.py): a case comes back only for the same bytes at the same
path read by the same code, what lies outside the file is checked on every load, and an untrusted or broken
cache is never read. No desktop needed."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_retrace.replay import casecache
from pytest_retrace.replay.cases import CaseError, load_case
from tests.helpers import REPO, VALID, write_case


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache directory of this test's own; the module's memo of where it is, cleared around the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("RETRACE_CACHE_DIR", str(root))
    monkeypatch.delenv("RETRACE_CASE_CACHE", raising=False)
    casecache.directory.cache_clear()
    yield root
    casecache.directory.cache_clear()


def entries(root: Path) -> list[Path]:
    return sorted((root / "cases").glob("*/*"))


def test_a_loaded_case_is_kept_and_comes_back_equal(tmp_path: Path, cache: Path) -> None:
    path = write_case(tmp_path / "cases", "typo", VALID)
    first = load_case(path)
    assert len(entries(cache)) == 1
    assert (cache / "cases").stat().st_mode & 0o777 == 0o700
    assert load_case(path) == first


def test_another_process_reads_the_kept_case_without_parsing(tmp_path: Path, cache: Path) -> None:
    path = write_case(tmp_path / "cases", "typo", VALID)
    kept = load_case(path)
    # the proof that the second process took the entry: parsing is made to fail there
    code = ("import sys; from pytest_retrace.replay import cases\n"
            "cases._validated = lambda *a: sys.exit('parsed again')\n"
            f"print(cases.load_case({str(path)!r}).task.instruction)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False,
                         env={**os.environ, "RETRACE_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == kept.task.instruction


def test_an_edit_that_keeps_size_and_time_is_read_anew(tmp_path: Path, cache: Path) -> None:
    path = write_case(tmp_path / "cases", "typo", VALID)
    before = load_case(path)
    info = path.stat()
    text = path.read_text()
    assert "Hello " in text
    path.write_text(text.replace("Hello ", "Jello "))  # same size
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))  # and the same time: only the bytes differ
    after = load_case(path)
    assert before.trajectory[0].text == "Hello " and after.trajectory[0].text == "Jello "
    assert len(entries(cache)) == 2


def test_files_outside_the_case_are_checked_on_every_load(tmp_path: Path, cache: Path) -> None:
    path = write_case(tmp_path / "cases", "typo", VALID)
    case = load_case(path)
    case.target_png.unlink()
    with pytest.raises(CaseError, match="screenshots.target.*file not found"):
        load_case(path)


def test_a_case_that_fails_is_never_kept(tmp_path: Path, cache: Path) -> None:
    data = copy.deepcopy(VALID)
    data["t_seed"] = 99
    path = write_case(tmp_path / "cases", "bad", data)
    for _ in range(2):
        with pytest.raises(CaseError, match="t_seed"):
            load_case(path)
    assert entries(cache) == []


def test_a_broken_entry_is_a_miss(tmp_path: Path, cache: Path) -> None:
    path = write_case(tmp_path / "cases", "typo", VALID)
    case = load_case(path)
    [entry] = entries(cache)
    entry.write_bytes(b"not a pickle")
    assert load_case(path) == case
    entry.write_bytes(b"\x80\x05K\x07.")  # a pickle of something else (7): parsed again, not returned
    assert load_case(path) == case


def test_a_cache_others_may_write_is_never_used(tmp_path: Path, cache: Path) -> None:
    cache.mkdir()
    cache.chmod(0o777)
    path = write_case(tmp_path / "cases", "typo", VALID)
    load_case(path)
    assert casecache.directory() is None
    assert not (cache / "cases").exists()


def test_the_cache_can_be_turned_off(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRACE_CASE_CACHE", "0")
    load_case(write_case(tmp_path / "cases", "typo", VALID))
    assert not cache.exists()


def test_entries_of_other_code_are_removed_and_a_full_stamp_emptied(tmp_path: Path, cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    old = cache / "cases" / "0ld5tamp"
    old.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    (cache / "cases").chmod(0o700)
    (old / "entry").write_bytes(b"x")
    path = write_case(tmp_path / "cases", "typo", VALID)
    load_case(path)
    assert not old.exists() and len(entries(cache)) == 1
    monkeypatch.setattr(casecache, "MAX_ENTRIES", 2)
    for name in ("a", "b"):
        (entries(cache)[0].parent / name).write_bytes(b"x")
    casecache.directory.cache_clear()
    assert casecache.directory() is not None and entries(cache) == []


def test_the_cache_directory_is_made_where_its_parents_are_missing(tmp_path: Path, cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRACE_CACHE_DIR", str(tmp_path / "no" / "such" / "dir"))
    load_case(write_case(tmp_path / "cases", "typo", VALID))
    assert len(entries(tmp_path / "no" / "such" / "dir")) == 1
