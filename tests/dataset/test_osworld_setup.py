"""An imported OSWorld task set up on real environments by OSWorld's own SetupController (desktop-env, through
replay/judge.py ``reset``): its download taken from the cache, its launch and activate_window steps, on the local
desktop, through the remote provider on a loopback guest, and through a whole `retrace build` on that guest."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_retrace.dataset.osworld import import_osworld
from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case
from pytest_retrace.replay.judge import reset
from pytest_retrace.screen.settle import SettleConfig
from tests.guests import Display, Guest, needs_desktop

from .test_osworld_import import write_example, write_run

URL = "https://example.invalid/osworld/data.bin"
DATA = bytes(range(256)) * 4 + b"\0end"  # binary: every byte value survives the trip
TASK_ID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
FAST = SettleConfig(timeout=3.0, quiet=0.15, interval=0.02)


def osworld_cache(root: Path, url: str, dest: str, data: bytes) -> Path:
    """A file in an OSWorld cache directory as OSWorld's `download` leaves it: <task id>/<uuid5(url)>_<name>."""
    path = root / TASK_ID / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{Path(dest).name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- on real environments ---------------------------------------------------------------------------------

# two terminals; the second shows last (and so has the focus) unless the setup moves it to the first
ALPHA = ["xterm", "-name", "alphaname", "-class", "AlphaClass", "-title", "Alpha Term"]
BETA = ["xterm", "-title", "beta-term"]


def osworld_results(root: Path) -> tuple[Path, Path, Path]:
    """An OSWorld results dir whose task downloads a file and activates windows: (results, examples, cache)."""
    results, examples, cache = root / "results", root / "examples", root / "cache"
    osworld_cache(cache, URL, "/home/user/Desktop/data.bin", DATA)
    config = [
        {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/Desktop/data.bin"}]}},
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
    assert kept[0].task.osworld is not None and kept[0].task.setup == []
    return kept[0]


def active_window(env: Any) -> str:
    res = env.run("xdotool getactivewindow getwindowname")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.desktop
@needs_desktop
def test_imported_setup_runs_on_the_local_desktop(env: XvfbEnvironment, tmp_path: Path) -> None:
    traj = imported(tmp_path)
    reset(env, traj.task, traj.base_dir)
    assert env.read_file("/home/user/Desktop/data.bin") == DATA
    assert active_window(env) == "Alpha Term"
    assert len(env.find_windows("beta-term")) == 1


def launched_only(root: Path, command: list[str], settle_quiet: float | None = None) -> Trajectory:
    """An imported task whose config only launches `command` (OSWorld's launch returns before any window)."""
    results, examples = root / "results", root / "examples"
    write_run(results, "os", TASK_ID, ["pyautogui.press('enter')", "DONE"])
    write_example(examples, "os", TASK_ID, config=[{"type": "launch", "parameters": {"command": command}}])
    [traj], dropped = import_osworld(results, examples, settle_quiet=settle_quiet)
    assert dropped == []
    return traj


@pytest.mark.desktop
@needs_desktop
def test_the_first_action_waits_for_the_configs_app(env: XvfbEnvironment, tmp_path: Path) -> None:
    """After the config, reset waits for a quiet screen and idle processes: the launched terminal is drawn, and
    its screen no longer changes, when the first action could come."""
    traj = launched_only(tmp_path, ["xterm", "-title", "late-term"], settle_quiet=0.6)
    assert traj.task.settle_quiet == 0.6  # retrace build --osworld-settle-quiet
    reset(env, traj.task, traj.base_dir)
    assert env.find_windows("late-term")
    first = env.screenshot()
    time.sleep(0.6)
    assert (env.screenshot() == first).all()


@pytest.mark.desktop
@needs_desktop
def test_a_config_whose_screen_never_settles_is_the_harness_error(env: XvfbEnvironment, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_retrace.envs import EnvError
    from pytest_retrace.replay import judge

    monkeypatch.setattr(judge, "CONFIG_SETTLE", judge.CONFIG_SETTLE.model_copy(update={"timeout": 4.0}))
    traj = launched_only(tmp_path, ["xterm", "-e", "bash", "-c", "while :; do date +%N; sleep 0.05; done"])
    with pytest.raises(EnvError, match=r"task .*: after its OSWorld config: the screen still changed after 4 s"):
        reset(env, traj.task, traj.base_dir)


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
        reset(env, traj.task, traj.base_dir)
        assert env.read_file("/home/user/Desktop/data.bin") == DATA
        assert (guest.home / "Desktop" / "data.bin").read_bytes() == DATA  # in the guest's own home
        assert active_window(env) == "Alpha Term"
        assert len(guest.display.windows("beta-term")) == 1
    finally:
        env.close()


# A whole build: the trajectory copies the downloaded file, appends to the copy; the catalogue's one mistake
# changes directory first, so the append goes elsewhere (hidden state: the screen is the same).
TERM = ["xterm", "-title", "work", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black",
        "-e", "bash", "--norc", "--noprofile"]
NOTES_URL = "https://example.invalid/osworld/notes.txt"
CATALOGUE = [{"name": "parent-directory", "domains": ["os"], "horizon": "short", "intent": "hidden-state",
              "mistake": "changes to the parent directory", "actions": ["pyautogui.write('cd .. && clear\\n')"]}]
# the guest is fresh for each case: its terminals closed (on its display only), its home emptied
GUEST_RESET = "for w in $(xdotool search --class xterm); do xdotool windowkill $w; done; find ~ -mindepth 1 -delete"


def check_the_case_sets_up(env: Any, case: Any) -> None:
    """`case` (built by `build_arguments`' results) on `env`, set up by OSWorld's SetupController from the case's
    own copy of the cache: the downloaded file and the activated terminal."""
    env.start()
    try:
        reset(env, case.task, case.dir)
        assert env.read_file("~/notes.txt") == b"hello\n"
        assert active_window(env) == "work"
    finally:
        env.close()


def build_arguments(tmp_path: Path) -> list[str]:
    """An OSWorld results directory (traj.jsonl, step screenshots, result.txt) whose task downloads a file,
    launches a terminal and activates it, with a catalogue of one mistake: `retrace build`'s arguments for it
    (the caller adds the environment)."""
    results, examples, cache = tmp_path / "results", tmp_path / "examples", tmp_path / "cache"
    osworld_cache(cache, NOTES_URL, "/home/user/notes.txt", b"hello\n")
    config = [
        {"type": "download", "parameters": {"files": [{"url": NOTES_URL, "path": "/home/user/notes.txt"}]}},
        {"type": "launch", "parameters": {"command": TERM}},
        {"type": "activate_window", "parameters": {"window_name": "work", "strict": True}},
    ]
    evaluator = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "cat ~/out.txt", "shell": True},
                 "expected": {"type": "rule", "rules": {"expected": "hello\ndone\n"}}}
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
    osworld = case.task.osworld
    assert osworld is not None and [s["type"] for s in osworld.config] == ["download", "launch", "activate_window"]
    # the downloaded file lives in the case's own directory now, not in the OSWorld cache
    [(name, copy)] = osworld.cache.items()
    assert name == f"{uuid.uuid5(uuid.NAMESPACE_URL, NOTES_URL)}_notes.txt"
    assert copy.startswith(f"{case.id}/") and (case.dir / copy).read_bytes() == b"hello\n"
    assert json.loads(json.dumps(osworld.config[2])) == {
        "type": "activate_window", "parameters": {"window_name": "work", "strict": True}}
    # and the built case sets its task up from there, on the guest
    check_the_case_sets_up(RemoteEnvironment(urls=guest.url, settle=FAST, reset=GUEST_RESET), case)
