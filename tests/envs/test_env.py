"""The xvfb environment on a real X server with real apps (no mocked screen)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.actions import Action
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import DESKTOP_MENU
from pytest_retrace.envs.xvfb.environment import GUEST_HOME, XvfbEnvironment
from pytest_retrace.replay.cases import Task
from tests.helpers import retrace_processes

# every test here drives the module's real Xvfb desktop (or starts desktops of its own)
pytestmark = pytest.mark.desktop

_TRUE = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}


def task(*setup: dict) -> Task:
    return Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "setup": list(setup),
                                "evaluator": _TRUE})


MOUSEPAD = task({"type": "file", "path": "~/notes.txt", "content": ""},
                {"type": "launch", "command": ["mousepad", "~/notes.txt"], "window": "Mousepad"})



def test_start_gives_a_real_display_with_a_window_manager(env: XvfbEnvironment) -> None:
    shot = env.screenshot()
    assert shot.shape == (800, 1280, 3) and shot.dtype == np.uint8
    assert env.display.startswith(":")
    assert env.run("xprop -root _NET_SUPPORTING_WM_CHECK").stdout.count("window id") == 1


def test_guest_home_is_the_same_path_in_every_environment(env: XvfbEnvironment) -> None:
    # window titles show paths: they must not depend on the worker's temp dir
    env.reset(task(), Path("."))
    res = env.run("echo $HOME; pwd; touch ~/made-inside")
    assert res.stdout.split() == [GUEST_HOME, GUEST_HOME]
    assert env.read_file("~/made-inside") == b""
    assert (env.home / "made-inside").exists()


def test_reset_ends_every_session_process_and_restores_home(env: XvfbEnvironment) -> None:
    env.reset(MOUSEPAD, Path("."))
    env.run("sleep 300 & setsid sleep 301 &")  # a backgrounded and a re-parented daemon
    env.write_file("~/junk.txt", b"left over")
    pids = env.session_pids()
    assert len(pids) >= 3
    start = time.monotonic()
    env.reset(task(), Path("."))
    elapsed = time.monotonic() - start
    assert env.session_pids() == []
    assert env.read_file("~/junk.txt") is None
    assert env.find_windows("Mousepad") == []
    assert elapsed < 3.0, f"reset took {elapsed:.2f} s (benchmarks/bench_env.py measures it precisely)"


def test_a_closed_window_can_be_reopened_from_the_desktop_menu(env: XvfbEnvironment) -> None:
    # closing the task's only window is a catalogue mistake; the desktop must let an agent undo it
    xterm = task({"type": "launch", "command": list(DESKTOP_MENU[0][1]), "window": "XTerm"})
    env.reset(xterm, Path("."))
    start = env.screenshot()
    env.execute(Action("click", x=1270, y=9))  # the title bar's close button
    assert env.find_windows("XTerm") == [] and env.session_pids() == []
    env.execute(Action("click", x=200, y=200, button="right"))
    menu = env.screenshot()
    assert np.any(menu[200:260, 200:290] != 0)  # the menu opened at the pointer on the black desktop
    env.execute(Action("click", x=230, y=210))  # its first entry: Terminal
    assert env.find_windows("XTerm")
    assert np.array_equal(env.screenshot(), start)  # the same terminal the task started, pixel for pixel
    pids = env.session_pids()  # a member of the task's namespace: the app is part of the task
    assert pids and all(f"HOME={GUEST_HOME}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
                        for p in pids)
    env.reset(task(), Path("."))
    assert env.session_pids() == []  # so reset ends it like any app the task started


@pytest.mark.parametrize("text", [
    "Grüße é€ 中文 ÉÀ\tΩ\nline two",  # xdotool's own binding typed É as é, and lost é under load
    "".join(chr(0x4E00 + 7 * i) for i in range(60)) + " ÀÉÎÕÜ àéîõü ß",  # more than the spare keycodes
], ids=["mixed", "more-than-the-keymap-holds"])
def test_typing_unicode_text_reaches_the_app_exactly(env: XvfbEnvironment, text: str) -> None:
    env.reset(MOUSEPAD, Path("."))
    env.execute(Action("type", text=text))
    env.execute(Action("hotkey", keys=("ctrl", "s")))
    assert env.read_file("~/notes.txt").decode() == text


def test_a_key_released_late_types_once_as_it_does_on_a_quiet_machine(env: XvfbEnvironment) -> None:
    """Under load xdotool, or the X server, can stall between a key's press and its release. With autorepeat
    (the X default: a repeat after 660 ms) the key then typed again, so a replayed step's effect depended on
    the machine's load: a `tab` moved past a form field in a calibration run at -n 16."""
    env.reset(MOUSEPAD, Path("."))
    env.execute(Action("key_down", keys=("a",)))
    time.sleep(1.5)  # the stall, made long on purpose
    env.execute(Action("key_up", keys=("a",)))
    env.execute(Action("hotkey", keys=("ctrl", "s")))
    assert env.read_file("~/notes.txt") == b"a"


def test_settled_screenshot_already_shows_the_effect_of_an_action(env: XvfbEnvironment) -> None:
    env.reset(MOUSEPAD, Path("."))
    before = env.screenshot()
    settle = env.execute(Action("type", text="abc")).seconds
    after = env.screenshot()
    assert 0 < settle < env.settle_cfg.timeout
    assert not np.array_equal(before, after)
    time.sleep(1.0)
    assert np.array_equal(after, env.screenshot()), "screen changed after it was declared settled"


def test_mouse_click_reaches_the_app(env: XvfbEnvironment) -> None:
    env.reset(MOUSEPAD, Path("."))
    before = env.screenshot()
    env.execute(Action("click", x=30, y=30))  # the File menu
    assert not np.array_equal(before, env.screenshot())
    env.execute(Action("key", keys=("esc",)))


def held_state(dpy):  # noqa: ANN001, ANN201
    """(keycodes held down, mouse buttons held down, modifier mask) as the X server sees them now."""
    from Xlib import X

    keymap = dpy.query_keymap()
    keys = [i * 8 + bit for i, byte in enumerate(keymap) for bit in range(8) if byte >> bit & 1]
    mask = dpy.screen().root.query_pointer().mask
    buttons = [b for b, m in ((1, X.Button1Mask), (2, X.Button2Mask), (3, X.Button3Mask)) if mask & m]
    return keys, buttons, mask


def test_held_keys_buttons_and_caps_lock_never_leak_into_the_next_case(env: XvfbEnvironment) -> None:
    """An agent may end its turn holding shift, a mouse button, or with Caps Lock on: all of it lives in the
    X server, not in any process of the task, so reset must clear it (it starts a new server) or the next case
    on this worker types and clicks differently."""
    from Xlib import X
    from Xlib import display as xdisplay

    env.reset(MOUSEPAD, Path("."))
    for action in (Action("key_down", keys=("shift",)), Action("key_down", keys=("ctrl",)),
                   Action("mouse_down", 600, 400), Action("key", keys=("capslock",))):
        env.execute(action)
    for reset in (False, True):
        if reset:
            env.reset(MOUSEPAD, Path("."))  # the next case on the same worker
        dpy = xdisplay.Display(env.display)
        try:
            keys, buttons, mask = held_state(dpy)
        finally:
            dpy.close()
        if not reset:
            assert keys and buttons == [1] and mask & X.LockMask, "the agent's held input did not reach the server"
    assert (keys, buttons, mask & (X.LockMask | X.ShiftMask | X.ControlMask)) == ([], [], 0)
    env.execute(Action("type", text="abc"))
    env.execute(Action("hotkey", keys=("ctrl", "s")))
    assert env.read_file("~/notes.txt") == b"abc"  # lower case, and a save: nothing was still held


def test_keys_held_during_a_click_and_a_held_chord(env: XvfbEnvironment) -> None:
    env.reset(MOUSEPAD, Path("."))
    env.execute(Action("type", text="one two"))
    env.execute(Action("click", 35, 56, hold=("shift",)))  # shift+click before "two": selects "two"
    env.execute(Action("type", text="X"))  # replaces the selection
    env.execute(Action("hotkey", keys=("shift",), seconds=0.5))  # Claude's hold_key: types nothing
    env.execute(Action("hotkey", keys=("ctrl", "s")))
    assert env.read_file("~/notes.txt") == b"one X"


def test_an_action_the_desktop_refuses_is_action_failed_not_a_broken_env(env: XvfbEnvironment) -> None:
    from pytest_retrace.envs import ActionFailed

    env.reset(MOUSEPAD, Path("."))
    with pytest.raises(ActionFailed, match="outside the 1280x800 screen"):
        env.execute(Action("click", 1280, 10))
    assert env.cursor_position() != (1280, 10)
    env.execute(Action("move", 123, 456))
    assert env.cursor_position() == (123, 456)


def test_setup_failures_are_environment_errors(env: XvfbEnvironment) -> None:
    with pytest.raises(EnvError, match=r"setup\[0\].*exited 3"):
        env.reset(task({"type": "command", "command": "exit 3"}), Path("."))
    with pytest.raises(EnvError, match="not installed"):
        env.reset(task({"type": "launch", "command": ["no-such-app-xyz"]}), Path("."))
    with pytest.raises(EnvError, match="no window matching"):
        env.reset(task({"type": "launch", "command": ["sleep", "5"], "window": "Nope", "timeout": 0.5}), Path("."))


def test_close_leaves_no_process_and_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    e = XvfbEnvironment()
    e.start()
    try:
        e.reset(MOUSEPAD, Path("."))
        assert retrace_processes(str(tmp_path)), "the environment's processes should be visible while it runs"
    finally:
        e.close()
    assert retrace_processes(str(tmp_path)) == {}
    assert list(tmp_path.iterdir()) == []


def test_desktops_starting_at_the_same_time_all_come_up() -> None:
    # xdist workers start their desktops together. Without `Xvfb -noreset`, about 1 start in 30 failed
    # here ("openbox: Failed to open the display"): the server reset as the first polling client left.
    from concurrent.futures import ThreadPoolExecutor

    def start_and_close(_: int) -> str | None:
        e = XvfbEnvironment()
        try:
            e.start()
            return None
        except EnvError as exc:
            return str(exc)
        finally:
            e.close()

    with ThreadPoolExecutor(3) as pool:
        failures = [f for f in pool.map(start_and_close, range(90)) if f]
    assert failures == []
