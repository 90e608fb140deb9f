"""The remote provider against two real guests (`retrace guest` on two Xvfb displays) on loopback, the pool
split by PYTEST_XDIST_WORKER; and its action translator, whose every program is run by a real pyautogui."""

from __future__ import annotations

import ast
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pytest_retrace.actions import ACTION_KINDS, Action
from pytest_retrace.envs import ActionFailed, EnvError, FileRefused, create_environment, environment_factory
from pytest_retrace.envs.remote.actions import action_program
from pytest_retrace.envs.remote.client import Reply
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.remote.pool import parse_urls
from pytest_retrace.envs.steps import CommandStep, FileStep, LaunchStep
from pytest_retrace.screen.frames import park_point
from pytest_retrace.screen.settle import SettleConfig
from tests.guests import Display, Guest, needs_desktop

SIZE = (640, 480)
FAST = SettleConfig(timeout=3.0, quiet=0.15, interval=0.02)
TERM = ["xterm", "-title", "remote-term", "-geometry", "60x12", "-e", "bash", "--norc", "--noprofile"]
# what makes guest A fresh before a case: its xterms closed (every X client of that display), the task's files gone
RESET = "for w in $(xdotool search --class xterm); do xdotool windowkill $w 2>/dev/null; done; rm -rf ~/task; true"
# one of each kind, as a case or an agent would send them
EVERY_KIND = [
    Action("click", x=320, y=240), Action("click", x=320, y=240, clicks=2, button="middle", hold=("shift",)),
    Action("move", x=10, y=10), Action("drag", x=20, y=20, x2=60, y2=70), Action("drag", x2=30, y2=30, button="right"),
    Action("mouse_down", x=5, y=5), Action("mouse_up", x=6, y=6), Action("mouse_down", button="right"),
    Action("mouse_up", button="right"), Action("scroll", dy=2, dx=-1, x=100, y=100), Action("scroll", dy=-1),
    Action("type", text="Ab !~\t"), Action("type", text="ü€"), Action("key", keys=("left", "right"), presses=2),
    Action("key", keys=("menu",)), Action("hotkey", keys=("ctrl", "shift", "a")),
    Action("hotkey", keys=("alt",), seconds=0.1, presses=2), Action("key_down", keys=("shift", "ctrl")),
    Action("key_up", keys=("ctrl", "shift")), Action("wait", seconds=0.05), Action("done"), Action("fail"),
]


@dataclass
class Task:
    id: str
    setup: list = field(default_factory=list)
    network: bool = False
    settle_quiet: float | None = None


# -- the translator, without a desktop ---------------------------------------------------------------------


def test_every_action_kind_has_a_program() -> None:
    assert {a.kind for a in EVERY_KIND} == set(ACTION_KINDS)
    for action in EVERY_KIND:
        program = action_program(action)
        if action.kind in ("wait", "done", "fail"):
            assert program is None
            continue
        assert program is not None
        ast.parse(program)  # valid Python, whatever the text or keys
        assert "pyautogui.FAILSAFE = False" in program
    assert "pyautogui.press(['apps']" in str(action_program(Action("key", keys=("menu",))))  # pyautogui's name
    typed = str(action_program(Action("type", text="a'\"\\b ü")))
    assert "pyautogui.write('a\\'\"\\\\b ', interval=0.025)" in typed and "'xdotool', 'type'" in typed
    held = str(action_program(Action("click", x=1, y=2, hold=("ctrl",))))
    assert held.index("keyDown('ctrl')") < held.index("pyautogui.click(1, 2") < held.index("keyUp('ctrl')")
    assert "finally:" in held  # the held key is released even when the click fails


def test_options(tmp_path: Path) -> None:
    listing = tmp_path / "guests.txt"
    listing.write_text("# the pool\nhttp://10.0.0.7:5000\n\n  https://guest.example:8443/  \n")
    assert parse_urls("http://a:1, http://b:2,", listing) == [
        "http://a:1", "http://b:2", "http://10.0.0.7:5000", "https://guest.example:8443/"]
    assert parse_urls(["http://a:1"], None) == ["http://a:1"]
    for bad in (None, "", "ftp://a", "a:5000", ["http://a", 3]):
        with pytest.raises(ValueError, match="urls"):
            parse_urls(bad, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="urls_file"):
        parse_urls(None, tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="token_env"):
        RemoteEnvironment(urls="http://a:1", token_env="RETRACE_TEST_UNSET_VARIABLE")
    env = RemoteEnvironment(urls="http://a:1", reset="host: virsh snapshot-revert vm fresh")
    assert (env.reset_mode, env.reset_command) == ("host", "virsh snapshot-revert vm fresh")
    assert RemoteEnvironment(urls="http://a:1", reset="pkill -u user").reset_mode == "guest"
    assert environment_factory("remote") is RemoteEnvironment


def test_an_unreachable_guest_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = create_environment("remote", size=SIZE, urls=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(EnvError, match="Connection refused"):
        env.start()
    assert time.monotonic() - started < 10  # a few retries with back-off, then it gives up
    env.close()


def test_a_guest_without_task_cpu_is_settled_on_the_screen_alone() -> None:
    """OSWorld's server has no /task_cpu: the environment says it cannot tell (None), and asks only once."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked = []

    class OSWorldLike(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<h1>Not Found</h1>")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OSWorldLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = RemoteEnvironment(size=SIZE, urls=f"http://127.0.0.1:{server.server_address[1]}")
        env.attach(env.urls[0], None, probe=False)
        assert env.task_cpu_seconds() is None
        assert env.task_cpu_seconds() is None
        assert asked == ["/task_cpu"]
    finally:
        server.shutdown()
        server.server_close()


# -- against real guests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Guest, Guest]]:
    """Guest A (no token) and guest B (a token), each on a display of its own with openbox."""
    displays, started = [], []
    try:
        for name, token in (("a", None), ("b", "token-of-b")):
            displays.append(Display(SIZE, wm=True))
            started.append(Guest(displays[-1], tmp_path_factory.mktemp(f"guest-{name}") / "home", token=token).start())
        yield started[0], started[1]
    finally:
        for thing in [*started, *displays]:
            thing.close()


def _eventually(env: RemoteEnvironment, path: str, timeout: float = 10.0) -> bytes | None:
    """The file once the shell wrote it: the screen may settle before a loaded machine ran the command."""
    deadline = time.monotonic() + timeout
    while (data := env.read_file(path)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return data


def _env(guests: tuple[Guest, Guest], worker: str, monkeypatch: pytest.MonkeyPatch, **options) -> RemoteEnvironment:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv(Guest.TOKEN_VAR, "token-of-b")
    env = RemoteEnvironment(size=SIZE, settle=FAST, urls=f"{guests[0].url},{guests[1].url}",
                            token_env=Guest.TOKEN_VAR, **options)
    env.start()
    return env


@pytest.mark.desktop
@needs_desktop
def test_the_pool_is_split_by_worker(guests: tuple[Guest, Guest], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _env(guests, "gw0", monkeypatch).url == guests[0].url
    assert _env(guests, "gw1", monkeypatch).url == guests[1].url
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    env = RemoteEnvironment(size=SIZE, urls=[guests[0].url, guests[1].url])
    env.start()
    assert env.url == guests[0].url  # without xdist: the first
    with pytest.raises(EnvError, match="gw2 has no guest"):
        _env(guests, "gw2", monkeypatch)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    with pytest.raises(EnvError, match="3 pytest-xdist workers but 2 guest URL"):
        RemoteEnvironment(size=SIZE, urls=[guests[0].url, guests[1].url]).start()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    # guest B needs its token; a wrong one is refused at start, and so is a guest whose screen is not the cases'
    monkeypatch.setenv(Guest.TOKEN_VAR, "wrong")
    with pytest.raises(EnvError, match="wrong bearer token"):
        RemoteEnvironment(size=SIZE, urls=guests[1].url, token_env=Guest.TOKEN_VAR).start()
    with pytest.raises(EnvError, match="the guest's screen is 640x480, the cases need 1280x800"):
        RemoteEnvironment(size=(1280, 800), urls=guests[0].url).start()


@pytest.mark.desktop
@needs_desktop
def test_reset_setup_and_actions(guests: tuple[Guest, Guest], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = _env(guests, "gw0", monkeypatch, reset=RESET)
    # retrace guest answers /health: its screenshots are polled as the local desktop's, uncounted (screens.py)
    assert env.ours and env.shots.cap is None and env.platform == "Linux" and not env.windows
    (tmp_path / "seed.txt").write_text("from a file\n")
    task = Task("remote-1", [FileStep(type="file", path="~/task/notes.txt", content="hello\n"),
                             FileStep(type="file", path="/home/user/task/seed.txt", src="seed.txt"),
                             CommandStep(type="command", command="echo made > ~/task/made.txt"),
                             LaunchStep(type="launch", command=TERM, window="remote-term")])
    env.reset(task, tmp_path)
    assert env.read_file("~/task/notes.txt") == b"hello\n"
    assert env.read_file("/home/user/task/seed.txt") == b"from a file\n"  # GUEST_HOME is the guest's home
    assert env.read_file("task/made.txt") == b"made\n"
    assert len(env.find_windows("remote-term")) >= 1
    assert env.cursor_position() == park_point(SIZE)  # parked by reset, off pyautogui's fail-safe corner
    before = env.screenshot()
    assert before.shape == (SIZE[1], SIZE[0], 3) and before.dtype == np.uint8
    # a click into the terminal (openbox centres it), typing, a hotkey: through pyautogui on the guest
    env.execute(Action("click", x=SIZE[0] // 2, y=SIZE[1] // 2))
    assert env.cursor_position() == (SIZE[0] // 2, SIZE[1] // 2)
    env.execute(Action("type", text="echo typed > ~/task/typed.txt\n"))
    env.execute(Action("type", text="echo never"))
    env.execute(Action("hotkey", keys=("ctrl", "u")))  # readline: the line is discarded
    seconds = env.execute(Action("type", text="echo Hi! > ~/task/hotkey.txt\n")).seconds
    assert 0 < seconds < FAST.timeout + 1
    assert _eventually(env, "~/task/typed.txt") == b"typed\n"
    assert _eventually(env, "~/task/hotkey.txt") == b"Hi!\n"
    assert not np.array_equal(env.screenshot(), before)
    # the reset command closed the task's apps and removed its files: the second case starts fresh
    env.reset(Task("remote-2", [LaunchStep(type="launch", command=TERM, window="remote-term")]), tmp_path)
    assert env.read_file("~/task/typed.txt") is None
    assert len(guests[0].display.windows("remote-term")) == 1
    env.close()


@pytest.mark.desktop
@needs_desktop
def test_our_guests_screenshots_come_raw_and_are_its_pngs_pixels(guests: tuple[Guest, Guest],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(guests, "gw1", monkeypatch)
    kinds = []
    request = env.client.request

    def noted(*args: Any, **kw: Any) -> Reply:  # the real request; what came back is noted
        reply = request(*args, **kw)
        kinds.append((args[1], reply.content_type))
        return reply

    monkeypatch.setattr(env.client, "request", noted)
    shot = env.screenshot()
    png = guests[1].request("GET", "/screenshot")
    again = env.screenshot()
    assert kinds == [("/screenshot?format=rgb", "application/octet-stream")] * 2  # one request each, raw
    assert shot.shape == (SIZE[1], SIZE[0], 3) and shot.dtype == np.uint8
    assert np.array_equal(shot, again), "the screen changed between the grabs: the comparison means nothing"
    with Image.open(io.BytesIO(png.body)) as image:
        assert np.array_equal(shot, np.asarray(image.convert("RGB")))


@pytest.mark.desktop
@needs_desktop
def test_without_a_reset_a_guest_runs_one_case(guests: tuple[Guest, Guest], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    env = _env(guests, "gw1", monkeypatch)
    env.reset(Task("only", [FileStep(type="file", path="~/one.txt", content="1")]), tmp_path)
    with pytest.raises(EnvError, match="no reset configured"):
        env.reset(Task("second", []), tmp_path)
    assert env.read_file("~/one.txt") == b"1"


@pytest.mark.desktop
@needs_desktop
def test_files_and_commands(guests: tuple[Guest, Guest], monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(guests, "gw1", monkeypatch)
    data = bytes(range(256)) * 64
    env.write_file("~/deep/dir/data.bin", data)
    assert env.read_file("~/deep/dir/data.bin") == data
    assert env.read_file("deep/dir/data.bin") == data
    assert env.read_file("~/deep/missing.txt") is None
    with pytest.raises(FileRefused, match="outside the allowed roots"):
        env.read_file("/etc/hostname")
    with pytest.raises(FileRefused, match="directory"):
        env.read_file("~/deep")
    with pytest.raises(EnvError, match="outside the allowed roots"):
        env.write_file("/etc/retrace-remote-test", b"x")
    res = env.run("echo out; echo err >&2; pwd; exit 7")
    assert (res.returncode, res.stdout, res.stderr) == (7, f"out\n{guests[1].home}\n", "err\n")
    started = time.monotonic()
    res = env.run("sleep 20", timeout=0.5)
    assert res.returncode == 124 and "timed out after 0.5 s" in res.stderr
    assert time.monotonic() - started < 5
    assert env.run("trap '' TERM; sleep 20", timeout=0.3).returncode == 124  # SIGTERM ignored: killed anyway


@pytest.mark.desktop
@needs_desktop
def test_every_action_kind_runs_on_the_guest(guests: tuple[Guest, Guest], monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(guests, "gw1", monkeypatch)
    # a terminal over the whole screen takes the clicks (on the root window, openbox would open its menu)
    env.launch(["xterm", "-title", "every-kind", "-geometry", "200x80+0+0"], window="every-kind")
    for action in EVERY_KIND:
        env.execute(action)
    assert env.cursor_position() == (100, 100)  # the last action with a position: the scroll at (100, 100)
    # refusals: outside the screen, and a key the guest's keyboard lacks (pyautogui would drop it silently)
    with pytest.raises(ActionFailed, match="outside the 640x480 screen"):
        env.execute(Action("click", x=640, y=10))
    with pytest.raises(ActionFailed, match="no key for f13"):
        env.execute(Action("key", keys=("f13",)))
