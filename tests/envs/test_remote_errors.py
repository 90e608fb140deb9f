"""The remote provider against an OSWorld-like guest on loopback (http.server, no X server): what a failed call
says (the server's own error text out of JSON, Flask's HTML pages and tracebacks), a display out of X client
slots (OSWorld's leaking /screenshot) as a named infrastructure error, and the screenshots a case may take."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_retrace.actions import Action
from pytest_retrace.envs import ActionFailed, EnvError
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.remote.errors import DisplayExhausted, html_text, server_text, tail
from pytest_retrace.envs.remote.screens import ScreenshotBudgetSpent
from pytest_retrace.replay.result import InfraError, blame
from pytest_retrace.screen.settle import SettleConfig

SIZE = (64, 48)
XLIB = "Xlib.error.DisplayConnectionError: Can't connect to display \":0\": b'Maximum number of clients reached'"
TRACEBACK = ("Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>\n"
             "  File \"/usr/lib/python3/dist-packages/Xlib/display.py\", line 80, in __init__\n"
             "    self.display = _BaseDisplay(display, error_handler=None)\n" + XLIB + "\n")
# Flask's page for an uncaught exception (OSWorld's server without debug), and Werkzeug's debugger page (with it)
FLASK_500 = ("<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n"
             "<p>The server encountered an internal error and was unable to complete your request. Either the server "
             "is overloaded or there is an error in the application.</p>\n")
DEBUGGER_500 = ("<!doctype html>\n<html lang=en>\n<head>\n<title>Xlib.error.DisplayConnectionError: Can&#x27;t connect "
                "to display &#34;:0&#34;: b&#39;Maximum number of clients reached&#39;\n // Werkzeug Debugger</title>\n"
                "<link rel=\"stylesheet\" href=\"?__debugger__=yes&amp;cmd=resource&amp;f=style.css\">\n</head>\n"
                "<body style=\"background-color: #fff\">\n<div class=\"debugger\">\n<h1>DisplayConnectionError</h1>\n"
                "<div class=\"detail\">\n<p class=\"errormsg\">" + XLIB.replace("'", "&#39;") + "</p>\n</div>\n"
                "<h2 class=\"traceback\">Traceback <em>(most recent call last)</em></h2>\n<pre>" + TRACEBACK
                + "</pre>\n" + "<div class=\"frame\">frame</div>\n" * 200 + "</div>\n</body>\n</html>\n")


def _png(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", SIZE, (shade, shade, shade)).save(out, "PNG")
    return out.getvalue()


@dataclass
class Leaky:
    """An OSWorld-like guest: its /screenshot leaks a client slot per call and, once `slots` are gone, answers
    Werkzeug's debugger page with Xlib's error (as OSWorld's server in debug mode); /execute's programs then
    fail the same way. /execute of `REVERT` gives the slots back (a reset that restarts the server)."""

    slots: int = 1000
    shots: int = 0
    platform: str = "Linux"
    output: str = ""  # what every successful /execute prints
    paths: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # as sent, with the query Flask's routes ignore
    executed: list[object] = field(default_factory=list)
    # path -> (status, content type, body) answered instead of the normal reply, with `headers` of the path
    broken: dict[str, tuple[int, str, str | bytes]] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    REVERT = "retrace-test-revert"

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        self.paths.append(path)
        if path in self.broken:
            status, kind, text = self.broken[path]
            return status, kind, text if isinstance(text, bytes) else text.encode()
        if path == "/screenshot":
            self.shots += 1
            if self.shots > self.slots:
                return 500, "text/html; charset=utf-8", DEBUGGER_500.encode()
            return 200, "image/png", _png(0)
        if path == "/screen_size":
            return 200, "application/json", json.dumps({"width": SIZE[0], "height": SIZE[1]}).encode()
        if path == "/platform":
            return 200, "text/html; charset=utf-8", self.platform.encode()
        if path in ("/file", "/setup/upload"):
            self.executed.append(body)
            return 200, "application/octet-stream", b"data"
        if path == "/cursor_position":
            return 200, "application/json", b"[1, 2]"
        if path == "/execute":
            command = json.loads(body)["command"]
            self.executed.append(command)
            if self.REVERT in str(command):
                self.shots = 0
            elif self.shots >= self.slots and "pyautogui" in str(command):
                return 200, "application/json", json.dumps(
                    {"status": "success", "output": "", "error": TRACEBACK, "returncode": 1}).encode()
            return 200, "application/json", json.dumps(
                {"status": "success", "output": self.output, "error": "", "returncode": 0}).encode()
        return 404, "text/html; charset=utf-8", (b"<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n"
                                                 b"<h1>Not Found</h1>\n<p>The requested URL was not found.</p>\n")


@pytest.fixture
def leaky() -> Iterator[tuple[Leaky, str]]:
    guest = Leaky()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            guest.targets.append(self.path)
            path = self.path.partition("?")[0]  # a Flask route ignores the query (OSWorld's /screenshot too)
            status, kind, data = guest.handle(self.command, path, body)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            for name, value in guest.headers.get(path, {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield guest, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Task:
    id: str = "leaky"
    setup: list = field(default_factory=list)
    network: bool = False
    settle_quiet: float | None = None


def start_env(url: str, monkeypatch: pytest.MonkeyPatch, **options: object) -> RemoteEnvironment:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    settle = SettleConfig(timeout=5.0, quiet=0.2, react=1.0, interval=0.03, signal="poll")
    env = RemoteEnvironment(size=SIZE, settle=settle, urls=url, **options)  # type: ignore[arg-type]
    env.start()
    return env


# -- the guest's own words --------------------------------------------------------------------------------


def test_the_servers_error_text_is_extracted() -> None:
    assert server_text(b'{"status": "error", "message": "No such file"}') == "No such file"
    assert server_text(b'{"error": "file_path is required"}', "application/json") == "file_path is required"
    # OSWorld's run_python puts the traceback under "error": its last line, the exception, is what it says
    assert server_text(json.dumps({"status": "error", "message": "", "error": TRACEBACK}).encode()) == XLIB
    assert server_text(json.dumps({"output": "only output"}).encode()) == "only output"
    assert html_text(FLASK_500) == ("500 Internal Server Error: The server encountered an internal error and was unable"
                                    " to complete your request. Either the server is overloaded or there is an error "
                                    "in the application.")
    # the debugger's title is the exception, entities decoded; its 200 frames of traceback are not quoted
    said = server_text(DEBUGGER_500.encode(), "text/html; charset=utf-8")
    assert said == XLIB, said
    assert server_text(TRACEBACK.encode(), "text/plain") == XLIB
    assert server_text(b"<h1>Not Found</h1>", "") == ""  # a page with neither title nor paragraph says nothing


def test_a_tail_never_starts_mid_line() -> None:
    lines = [f"line {i}: " + "x" * 40 for i in range(20)]
    got = tail("\n".join(lines), limit=120)
    assert got == " | ".join(lines[-2:])  # whole lines only: a third would not fit in 120 characters
    assert tail("y" * 500, limit=50) == "y" * 49 + "…"  # one long line: its start, clipped
    assert tail("  \n\n") == ""
    assert tail("retrace: the guest's keyboard has no key for f13\n") == "retrace: the guest's keyboard has no key for f13"


def test_failed_calls_name_the_endpoint_status_and_text(leaky: tuple[Leaky, str], monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch)
    guest.broken["/cursor_position"] = (500, "text/html; charset=utf-8", FLASK_500)
    with pytest.raises(EnvError) as info:
        env.cursor_position()
    assert str(info.value) == (f"{url}/cursor_position: HTTP 500: 500 Internal Server Error: The server encountered "
                               "an internal error and was unable to complete your request. Either the server is "
                               "overloaded or there is an error in the application.")
    guest.broken["/file"] = (500, "application/json",
                             json.dumps({"error": "Failed to serve file: " + TRACEBACK.replace(XLIB, "OSError: [Errno 5] "
                                                                                         "Input/output error")}))
    with pytest.raises(EnvError) as info:
        env.read_file("~/a.txt")
    assert str(info.value) == (f"cannot read ~/a.txt: {url}/file: HTTP 500: "
                               "Failed to serve file: OSError: [Errno 5] Input/output error")
    guest.broken["/execute"] = (500, "application/json", json.dumps({"status": "error", "message": "[Errno 2] No such "
                                                                      "file or directory: 'xdotool'"}))
    with pytest.raises(ActionFailed) as info:
        env.execute(Action("click", x=1, y=1))
    assert str(info.value).endswith(f"{url}/execute: HTTP 500: [Errno 2] No such file or directory: 'xdotool'")
    assert "<" not in str(info.value) and "Traceback" not in str(info.value)


# -- a display out of X client slots ----------------------------------------------------------------------


def test_a_leaking_screenshot_endpoint_is_a_named_infrastructure_error(leaky: tuple[Leaky, str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    guest, url = leaky
    guest.slots = 12
    env = start_env(url, monkeypatch, reset=f"guest:{Leaky.REVERT}", screenshot_budget="off")
    assert not env.ours and env.shots.cap is None  # no /health: OSWorld's server (the cap is off here)
    with pytest.raises(DisplayExhausted) as info:
        for _ in range(20):
            env.screenshot()
    message = str(info.value)
    assert guest.shots == 13
    assert message.startswith(f"{url}/screenshot: the VM's X server has no client slots left ({XLIB}")
    for part in ("leaks an X connection per call, as OSWorld's server does", "revert or restart the VM in `reset`",
                 "reset=host:CMD", "not used again until then"):
        assert part in message
    assert "Werkzeug" not in message and "<" not in message
    # the case is the harness's error, not the agent's: blame turns the agent's failed action into an InfraError
    assert env.harness_fault() == message
    with pytest.raises(InfraError, match="no client slots left"):
        blame(env, "recover", info.value)
    # the guest is not used again until a reset: nothing more reaches it
    asked = len(guest.paths)
    for call in (env.screenshot, env.cursor_position, lambda: env.execute(Action("click", x=1, y=1))):
        with pytest.raises(DisplayExhausted):
            call()
    assert len(guest.paths) == asked
    # the reset (here a guest command that restarts the server, giving the slots back) makes it usable again
    env.reset(Task(), tmp_path)
    assert env.harness_fault() is None and env.screenshot().shape == (SIZE[1], SIZE[0], 3)


def test_a_program_failing_on_the_exhausted_display_is_not_the_agents_failure(leaky: tuple[Leaky, str],
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch)
    guest.slots = 1  # the one screenshot before the action takes the last slot: pyautogui cannot connect
    with pytest.raises(DisplayExhausted) as info:  # never ActionFailed, which would be the agent's
        env.execute(Action("key", keys=("a",)))
    assert f"{url}/execute: the VM's X server has no client slots left ({XLIB}" in str(info.value)
    # without a reset option the guest cannot be made usable: reset says so, naming both
    with pytest.raises(DisplayExhausted, match="no client slots left.*no reset is configured"):
        env.reset(Task(), tmp_path)


# -- how many screenshots a case takes --------------------------------------------------------------------


def _settle_shots(env: RemoteEnvironment, guest: Leaky) -> int:
    before = env.screenshot()  # as execute() grabs it; the screen never changes, so settling waits for `react`
    start = guest.shots
    settled = env.settle(before)
    assert settled.stable
    return guest.shots - start


def test_a_guest_that_is_not_ours_is_polled_at_growing_intervals(leaky: tuple[Leaky, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    guest, url = leaky
    polled = _settle_shots(start_env(url, monkeypatch, screenshot_budget="off"), guest)
    backed_off = _settle_shots(start_env(url, monkeypatch), guest)  # auto: not ours, so counted and backed off
    print(f"screenshots of one settle over react=1.0 s: every 30 ms {polled}, backing off {backed_off}")
    # polls after 0.1, 0.16, 0.26, 0.41 s (0.93 s), then one grab at the end of the window: 6 with the first
    assert backed_off <= 6
    assert polled >= 10  # every 30 ms for a second; fewer only if each grab took over 0.1 s


def test_a_case_takes_at_most_max_screenshots(leaky: tuple[Leaky, str], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch, max_screenshots=4, reset=f"guest:{Leaky.REVERT}")
    assert env.shots.cap == 4
    for _ in range(4):
        env.screenshot()
    with pytest.raises(ScreenshotBudgetSpent, match=r"this case took its 4 screenshots \(option max_screenshots\)"):
        env.screenshot()
    assert guest.shots == 4  # the fifth was never asked for
    assert "max_screenshots" in str(env.harness_fault())  # the harness's bound: an error, not the agent's failure
    env.reset(Task(), tmp_path)  # a new case, a new count (the reset's own settle takes some of it)
    assert env.harness_fault() is None and 0 < env.shots.taken <= 4
    assert env.shots.total == 4 + env.shots.taken


def test_budget_options(leaky: tuple[Leaky, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = leaky
    assert start_env(url, monkeypatch, screenshot_budget=False).shots.cap is None  # YAML's bare `off`
    assert start_env(url, monkeypatch, screenshot_budget=True, max_screenshots="7").shots.cap == 7
    for bad in ({"screenshot_budget": "sometimes"}, {"max_screenshots": 0}, {"max_screenshots": "many"},
                {"windows_shell": "bash"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RemoteEnvironment(size=SIZE, urls=url, **bad)  # type: ignore[arg-type]


# -- raw screenshots: ours, or a PNG from a server that ignores the query ----------------------------------


def test_a_server_that_answers_png_only_is_decoded_in_one_request(leaky: tuple[Leaky, str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch)
    asked = len(guest.targets)
    shot = env.screenshot()
    assert shot.shape == (SIZE[1], SIZE[0], 3) and shot.dtype == np.uint8 and not shot.any()
    assert guest.targets[asked:] == ["/screenshot?format=rgb"]  # no second request to find out what it speaks
    guest.broken["/screenshot"] = (200, "image/png", "not a png")
    with pytest.raises(EnvError, match=rf"^{url}/screenshot\?format=rgb: not an image: "):
        env.screenshot()


def _raw(guest: Leaky, body: bytes, width: str | None = "4", height: str | None = "2",
         names: tuple[str, str] = ("X-Screen-Width", "X-Screen-Height")) -> None:
    """/screenshot answers `body` as raw RGB with these headers (None: left out)."""
    guest.broken["/screenshot"] = (200, "application/octet-stream", body)
    sizes = {names[0]: width, names[1]: height}
    guest.headers["/screenshot"] = {k: v for k, v in sizes.items() if v is not None}


def test_raw_pixels_are_taken_as_sized_by_the_headers(leaky: tuple[Leaky, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch)
    pixels = bytes(range(200, 224))  # two rows of four RGB pixels, each byte different
    _raw(guest, pixels, names=("x-screen-width", "X-SCREEN-HEIGHT"))  # header names are case-insensitive
    shot = env.screenshot()
    assert shot.shape == (2, 4, 3) and shot.dtype == np.uint8
    assert shot[1, 0].tolist() == [212, 213, 214] and shot.tobytes() == pixels


@pytest.mark.parametrize(("body", "width", "height", "said"), [
    (bytes(23), "4", "2", "23 bytes of raw RGB, not 4x2x3 = 24"),
    (bytes(25), "4", "2", "25 bytes of raw RGB, not 4x2x3 = 24"),
    (b"", "4", "2", "0 bytes of raw RGB, not 4x2x3 = 24"),
    (bytes(24), None, "2", "raw RGB without its X-Screen-Width header"),
    (bytes(24), "4", None, "raw RGB without its X-Screen-Height header"),
    (bytes(24), "four", "2", "raw RGB with X-Screen-Width 'four', not a size from 1 to 16384 pixels"),
    (bytes(24), "4", "-2", "raw RGB with X-Screen-Height '-2', not a size from 1 to 16384 pixels"),
    (bytes(24), "4", "2.0", "raw RGB with X-Screen-Height '2.0', not a size from 1 to 16384 pixels"),
    (bytes(24), "0", "2", "raw RGB with X-Screen-Width '0', not a size from 1 to 16384 pixels"),
    (bytes(24), "²", "2", "raw RGB with X-Screen-Width '²', not a size"),  # a digit to str.isdigit, not to us
    (bytes(24), "16385", "2", "raw RGB with X-Screen-Width '16385', not a size from 1 to 16384 pixels"),
    (bytes(24), "4", "99999999999999999999", "raw RGB with X-Screen-Height '99999999999999999999', not a size"),
    # sizes in range but a body far short of them: refused on its length, nothing of that size allocated
    (bytes(24), "16384", "16384", "24 bytes of raw RGB, not 16384x16384x3 = 805306368"),
])
def test_a_malformed_raw_reply_is_a_clear_error(leaky: tuple[Leaky, str], monkeypatch: pytest.MonkeyPatch,
                                               body: bytes, width: str | None, height: str | None,
                                               said: str) -> None:
    guest, url = leaky
    env = start_env(url, monkeypatch)
    _raw(guest, body, width, height)
    with pytest.raises(EnvError) as info:
        env.screenshot()
    assert str(info.value).startswith(f"{url}/screenshot?format=rgb: {said}"), str(info.value)
