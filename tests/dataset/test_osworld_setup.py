"""OSWorld's upload_file / download and activate_window setup steps: converted (or refused, naming the field),
reported by `retrace osworld check`, and run for real — on the local desktop, through the remote provider on a
loopback guest, and through a whole `retrace build` on that guest."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from pytest_retrace.dataset.osworld import import_osworld
from pytest_retrace.dataset.osworld_setup import cache_names, convert_config
from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import Task, load_case
from pytest_retrace.screen.settle import SettleConfig
from tests.guests import Display, Guest, needs_desktop

from .test_osworld_import import EVALUATOR, write_example, write_run

URL = "https://example.invalid/osworld/data.bin"
DATA = bytes(range(256)) * 4 + b"\0end"  # binary: every byte value survives the trip
TASK_ID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
FAST = SettleConfig(timeout=3.0, quiet=0.15, interval=0.02)


def osworld_cache(root: Path, url: str, dest: str, data: bytes, *, osworld_name: bool = True) -> Path:
    """A file in an OSWorld cache directory as OSWorld's `download` leaves it (or under the URL's basename)."""
    name = f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{Path(dest).name}" if osworld_name else \
        Path(urlsplit(url).path).name
    path = root / TASK_ID / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def convert(*steps: dict[str, Any], cache: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    converted, unsupported = convert_config(list(steps), task_id=TASK_ID, cache_dir=cache)
    return converted, [reason for _kind, reason in unsupported]


# -- activate_window ---------------------------------------------------------------------------------------


def test_activate_window_becomes_an_activate_step() -> None:
    steps, problems = convert(
        {"type": "activate_window", "parameters": {"window_name": "Google Chrome"}},
        {"type": "activate_window", "parameters": {"window_name": "a.xlsx - LibreOffice Calc", "strict": True}},
        {"type": "activate_window", "parameters": {"window_name": "Mail.thunderbird", "strict": True,
                                                   "by_class": True}},
    )
    assert problems == []
    assert steps == [
        {"type": "activate", "window": "Google Chrome", "exact": False, "by_class": False},
        {"type": "activate", "window": "a.xlsx - LibreOffice Calc", "exact": True, "by_class": False},
        {"type": "activate", "window": "Mail.thunderbird", "exact": True, "by_class": True},
    ]
    task = Task.model_validate({"id": "t", "instruction": "x", "domain": "os", "setup": steps, "evaluator": EVALUATOR})
    assert [(s.type, s.timeout) for s in task.setup] == [("activate", 30.0)] * 3


@pytest.mark.parametrize(("params", "reason"), [
    ({}, "window_name must be a non-empty string, got None"),
    ({"window_name": "  "}, "window_name must be a non-empty string, got '  '"),
    ({"window_name": 7}, "window_name must be a non-empty string, got 7"),
    ({"window_name": "a\nb"}, "window_name: must be one line without control characters, got 'a\\nb'"),
    ({"window_name": "Calc", "strict": "yes"}, "strict must be true or false, got 'yes'"),
    ({"window_name": "Calc", "by_class": 1}, "by_class must be true or false, got 1"),
    ({"window_name": "Calc", "exact": True},
     "unknown parameter(s) 'exact' (OSWorld's activate_window takes window_name, strict, by_class)"),
])
def test_bad_activate_window_parameters_name_the_field(params: dict[str, Any], reason: str) -> None:
    steps, problems = convert({"type": "activate_window", "parameters": params})
    assert steps == [] and problems == [f"config step 0 (activate_window): {reason}"]


# -- upload_file / download ---------------------------------------------------------------------------------


def test_uploads_become_file_steps_reading_the_file_found_here(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "in dir" / "local file.txt"
    local.parent.mkdir()
    local.write_text("local")
    cache = tmp_path / "cache"
    by_osworld = osworld_cache(cache, URL, "/home/user/Desktop/data.bin", DATA)
    by_basename = osworld_cache(cache, "https://example.invalid/other/sheet.xlsx?dl=1", "~/s.xlsx", b"x",
                                osworld_name=False)
    monkeypatch.chdir(tmp_path)  # a relative path is read from the current directory, as OSWorld does
    steps, problems = convert(
        {"type": "upload_file", "parameters": {"files": [
            {"local_path": str(local), "path": "/home/user/a.txt"},
            {"local_path": "in dir/local file.txt", "path": "~/b.txt"}]}},
        {"type": "upload_file", "parameters": {"files": [
            {"url": local.as_uri(), "path": "c.txt"},  # file:// with %20 for the spaces
            {"url": str(local), "path": "/home/user/d.txt"}]}},
        {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Desktop/data.bin"}]}},
        {"type": "upload_file", "parameters": {"files": [
            {"url": "https://example.invalid/other/sheet.xlsx?dl=1", "path": "~/s.xlsx"}]}},
        cache=cache,
    )
    assert problems == []
    assert steps == [
        {"type": "file", "path": "/home/user/a.txt", "src": str(local)},
        {"type": "file", "path": "~/b.txt", "src": str(local)},
        {"type": "file", "path": "c.txt", "src": str(local)},
        {"type": "file", "path": "/home/user/d.txt", "src": str(local)},
        {"type": "file", "path": "/home/user/Desktop/data.bin", "src": str(by_osworld)},
        {"type": "file", "path": "~/s.xlsx", "src": str(by_basename)},
    ]
    assert cache_names(URL, "/home/user/Desktop/data.bin") == [by_osworld.name, "data.bin"]


@pytest.mark.parametrize(("params", "reason"), [
    ({}, "files must be a non-empty list of {url or local_path, path} mappings, got None"),
    ({"files": []}, "files must be a non-empty list of {url or local_path, path} mappings, got []"),
    ({"files": ["x"]}, "files[0] must be a {url or local_path, path} mapping, got 'x'"),
    ({"files": [{"url": "/nope"}]}, "files[0].path must be a non-empty string (where the file goes), got None"),
    ({"files": [{"path": "~/a"}]}, "files[0]: give exactly one of 'url' or 'local_path', got keys ['path']"),
    ({"files": [{"path": "~/a", "url": "/x", "local_path": "/x"}]},
     "files[0]: give exactly one of 'url' or 'local_path', got keys ['local_path', 'path', 'url']"),
    ({"files": [{"path": "~/a", "uri": "/x"}]},
     "files[0]: unknown key(s) 'uri' (expected url or local_path, and path)"),
    ({"files": [{"path": "~/a", "url": 3}]}, "files[0].url must be a non-empty string, got 3"),
    ({"files": [{"path": "~/a", "local_path": "/no/such/file"}]},
     "files[0].local_path: /no/such/file does not exist here (/no/such/file)"),
    ({"files": [{"path": "~/a", "url": "file:///tmp"}]}, "files[0].url: /tmp is not a regular file here (/tmp)"),
    ({"files": [{"path": "~/a", "url": "file://fileserver/share/a"}]},
     "files[0].url: file://fileserver/share/a is a file on another host (fileserver)"),
    ({"files": [{"path": "/tmp/a", "url": "/etc/hostname"}]},
     "files[0].path: '/tmp/a' is outside the home: use ~/..., /home/user/... or a path relative to the home"),
    ({"files": [{"path": "~/a", "url": "/etc/hostname"}], "cache": True},
     "unknown parameter(s) 'cache' (OSWorld's upload_file takes files)"),
])
def test_bad_upload_parameters_name_the_field(params: dict[str, Any], reason: str) -> None:
    steps, problems = convert({"type": "upload_file", "parameters": params})
    assert steps == [] and problems == [f"config step 0 (upload_file): {reason}"]


def test_a_url_that_is_not_here_is_unsupported_naming_the_url(tmp_path: Path) -> None:
    download = {"type": "download", "parameters": {"files": [{"url": URL, "path": "~/data.bin"}]}}
    _, [reason] = convert(download)
    assert reason == (f"config step 0 (download): files[0].url: {URL} would be downloaded, and nothing is "
                      "downloaded here; give the OSWorld cache directory holding it (--osworld-cache DIR, laid out "
                      "as <task id>/<file>)")
    _, [reason] = convert(download, cache=tmp_path)
    tried = [tmp_path / TASK_ID / name for name in cache_names(URL, "~/data.bin")]
    assert reason == (f"config step 0 (download): files[0].url: {URL} is not in the OSWorld cache "
                      f"(looked for {tried[0]} and {tried[1]})")
    osworld_cache(tmp_path, URL, "~/data.bin", DATA)
    assert convert(download, cache=tmp_path)[1] == []


def test_osworld_check_reports_uploads_and_activation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_retrace.cli import main

    examples, cache = tmp_path / "examples", tmp_path / "cache"
    activate = {"type": "activate_window", "parameters": {"window_name": "Mousepad", "strict": False}}
    upload = {"type": "upload_file", "parameters": {"files": [{"url": URL, "path": "/home/user/data.bin"}]}}
    write_example(examples, "os", TASK_ID, config=[upload, activate])
    write_example(examples, "os", "bad-activate", config=[{"type": "activate_window", "parameters": {}}])
    osworld_cache(cache, URL, "/home/user/data.bin", DATA)
    assert main(["osworld", "check", str(examples), "--osworld-cache", str(cache)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"ok  os/{TASK_ID}" in out
    assert ("NO  os/bad-activate: bad config step 0 (activate_window): window_name must be a non-empty string, "
            "got None") in out
    assert main(["osworld", "check", str(examples / "os" / f"{TASK_ID}.json")]) == 1  # no cache: not here
    [line] = capsys.readouterr().out.splitlines()[:1]
    assert line == f"NO  os/{TASK_ID}: cloud file not in cache {URL.rpartition('/')[2]}"


# -- on real environments ---------------------------------------------------------------------------------

# two terminals; the second shows last (and so has the focus) unless the setup moves it to the first
ALPHA = ["xterm", "-name", "alphaname", "-class", "AlphaClass", "-title", "Alpha Term"]
BETA = ["xterm", "-title", "beta-term"]


def osworld_results(root: Path) -> tuple[Path, Path, Path]:
    """An OSWorld results dir whose task uploads two files and activates windows: (results, examples, cache)."""
    results, examples, cache = root / "results", root / "examples", root / "cache"
    local = root / "notes.txt"
    local.write_text("local notes\n")
    osworld_cache(cache, URL, "/home/user/Desktop/data.bin", DATA)
    config = [
        {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Desktop/data.bin"}]}},
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/notes.txt"}]}},
        {"type": "launch", "parameters": {"command": ALPHA}},
        {"type": "launch", "parameters": {"command": BETA}},
        {"type": "sleep", "parameters": {"seconds": 2}},
        {"type": "activate_window", "parameters": {"window_name": "BETA"}},  # a substring, any case
        {"type": "activate_window", "parameters": {"window_name": "alphaname.AlphaClass", "strict": True,
                                                   "by_class": True}},
    ]
    write_run(results, "os", TASK_ID, ["pyautogui.press('enter')", "DONE"])
    write_example(examples, "os", TASK_ID, config=config)
    return results, examples, cache


def imported(root: Path) -> Trajectory:
    results, examples, cache = osworld_results(root)
    kept, dropped = import_osworld(results, examples, cache_dir=cache)
    assert dropped == [] and len(kept) == 1, dropped
    assert [s.type for s in kept[0].task.setup] == ["file", "file", "launch", "launch", "activate", "activate"]
    return kept[0]


def active_window(env: Any) -> str:
    res = env.run("xdotool getactivewindow getwindowname")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.desktop
@needs_desktop
def test_imported_setup_runs_on_the_local_desktop(env: XvfbEnvironment, tmp_path: Path) -> None:
    traj = imported(tmp_path)
    env.reset(traj.task, traj.base_dir)
    assert env.read_file("/home/user/Desktop/data.bin") == DATA
    assert env.read_file("~/notes.txt") == b"local notes\n"
    assert active_window(env) == "Alpha Term"
    assert len(env.find_windows("beta-term")) == 1


@pytest.fixture
def guest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """One `retrace guest` on a display of its own, the only one of the pool whatever the xdist worker."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    display = Display(getattr(request, "param", (640, 480)), wm=True)
    started = None
    try:
        started = Guest(display, tmp_path / "guest" / "home", own_processes=True).start()
        yield started
    finally:
        if started is not None:
            started.close()
        display.close()


@pytest.mark.desktop
@needs_desktop
def test_imported_setup_runs_on_a_remote_guest(guest: Guest, tmp_path: Path) -> None:
    traj = imported(tmp_path)
    env = RemoteEnvironment(size=(640, 480), settle=FAST, urls=guest.url)
    env.start()
    try:
        env.reset(traj.task, traj.base_dir)
        assert env.read_file("/home/user/Desktop/data.bin") == DATA
        assert (guest.home / "Desktop" / "data.bin").read_bytes() == DATA  # in the guest's own home
        assert env.read_file("~/notes.txt") == b"local notes\n"
        assert active_window(env) == "Alpha Term"
        assert len(guest.display.windows("beta-term")) == 1
    finally:
        env.close()


# A whole build: the trajectory copies the uploaded file, appends to the copy; the catalogue's one mistake
# changes directory first, so the append goes elsewhere (hidden state: the screen is the same).
TERM = ["xterm", "-title", "work", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black",
        "-e", "bash", "--norc", "--noprofile"]
NOTES_URL = "https://example.invalid/osworld/notes.txt"
CATALOGUE = [{"name": "parent-directory", "domains": ["os"], "horizon": "short", "intent": "hidden-state",
              "mistake": "changes to the parent directory", "actions": ["pyautogui.write('cd .. && clear\\n')"]}]
# the guest is fresh for each case: its terminals closed (on its display only), its home emptied
GUEST_RESET = "for w in $(xdotool search --class xterm); do xdotool windowkill $w; done; find ~ -mindepth 1 -delete"


def check_the_case_sets_up(env: Any, case: Any) -> None:
    """`case` (built by `build_arguments`' results) on `env`: the uploaded file and the activated terminal."""
    env.start()
    try:
        env.reset(case.task, case.dir)
        assert env.read_file("~/notes.txt") == b"hello\n"
        assert active_window(env) == "work"
    finally:
        env.close()


def build_arguments(tmp_path: Path) -> list[str]:
    """An OSWorld results directory (traj.jsonl, step screenshots, result.txt) whose task uploads a file,
    launches a terminal and activates it, with a catalogue of one mistake: `retrace build`'s arguments for it
    (the caller adds the environment)."""
    results, examples, cache = tmp_path / "results", tmp_path / "examples", tmp_path / "cache"
    osworld_cache(cache, NOTES_URL, "/home/user/notes.txt", b"hello\n", osworld_name=False)
    config = [
        {"type": "upload_file", "parameters": {"files": [{"url": NOTES_URL, "path": "/home/user/notes.txt"}]}},
        {"type": "launch", "parameters": {"command": TERM}},
        {"type": "activate_window", "parameters": {"window_name": "work", "strict": True}},
    ]
    evaluator = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out.txt"},
                 "expected": {"type": "rule", "rules": {"text": "hello\ndone\n"}}}
    write_example(examples, "os", TASK_ID, config=config, evaluator=evaluator)
    write_run(results, "os", TASK_ID, ["pyautogui.write('cp notes.txt out.txt && clear\\n')",
                                       "pyautogui.write('echo done >> out.txt && clear\\n')", "DONE"])
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(yaml.safe_dump(CATALOGUE))
    return ["build", "--osworld", str(results), "--osworld-examples", str(examples), "--osworld-cache", str(cache),
            "--catalogue", str(catalogue), "--workers", "1", "--replays", "2", "--seeds", "1", "--work",
            str(tmp_path / "work"), "--out", str(tmp_path / "cases")]


@pytest.mark.desktop
@needs_desktop
@pytest.mark.parametrize("guest", [(1280, 800)], indirect=True)  # the size retrace build's cases have
def test_retrace_build_on_a_remote_guest_from_osworld_results(guest: Guest, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_retrace.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*build_arguments(tmp_path), "--env", "remote", "--env-option", f"urls={guest.url}",
                 "--env-option", f"reset={GUEST_RESET}"]) == 0
    [path] = sorted((tmp_path / "cases").rglob("*.yaml"))
    case = load_case(path)
    assert case.metadata["kind"] == "hidden-state" and case.t_seed == 1
    assert [s.type for s in case.task.setup] == ["file", "launch", "activate"]
    upload = case.task.setup[0]
    # the uploaded file lives in the case's own directory now, not in the OSWorld cache
    assert upload.src == f"{case.id}/setup/0-notes.txt"
    assert (case.dir / upload.src).read_bytes() == b"hello\n"
    assert json.loads(json.dumps(case.task.setup[2].model_dump())) == {
        "type": "activate", "window": "work", "exact": True, "by_class": False, "timeout": 30.0}
    # and the built case sets its task up from there, on the guest
    check_the_case_sets_up(RemoteEnvironment(urls=guest.url, settle=FAST, reset=GUEST_RESET), case)
