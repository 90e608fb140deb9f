"""`retrace guest`: the OSWorld-shaped HTTP server, run as a subprocess on loopback against a real Xvfb display.

Every endpoint's shape, then the bad requests: each gets a JSON {"status": "error", "error": ...} with the right
4xx, and the server keeps serving (a health check after each)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from pytest_retrace.guest import is_loopback
from tests.guests import Display, Guest, multipart, needs_desktop

pytestmark = [pytest.mark.desktop, needs_desktop]
SIZE = (640, 480)


@pytest.fixture(scope="module")
def display() -> Iterator[Display]:
    d = Display(SIZE)
    # a window, so that a screenshot is not blank (no window manager: it sits at the top left)
    xterm = subprocess.Popen(["xterm", "-title", "guest-fixture", "-geometry", "60x10+0+0"], env=d.env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        d.wait_window("guest-fixture")
        yield d
    finally:
        d.close()
        xterm.wait(timeout=10)


@pytest.fixture(scope="module")
def guest(display: Display, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    g = Guest(display, tmp_path_factory.mktemp("guest") / "home").start()
    yield g
    g.close()


def _error(reply, status: int, *words: str) -> None:
    """A clear JSON error with `status`, its message holding `words`."""
    assert reply.status == status, (reply.status, reply.body[:300])
    body = reply.json()
    assert body["status"] == "error" and body["error"] and body["message"] == body["error"], body
    for word in words:
        assert word in body["error"], body


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.org", ""]))


def test_screen_endpoints(guest: Guest) -> None:
    assert guest.request("GET", "/health").json() == {"status": "ok"}
    platform = guest.request("GET", "/platform")
    assert (platform.status, platform.body) == (200, b"Linux")
    assert guest.request("POST", "/screen_size", b"").json() == {"width": SIZE[0], "height": SIZE[1]}
    subprocess.run(["xdotool", "mousemove", "123", "45"], env=guest.display.env(), check=True)
    assert guest.request("GET", "/cursor_position").json() == [123, 45]  # a list, as OSWorld's jsonify(x, y)
    shot = guest.request("GET", "/screenshot")
    assert shot.status == 200 and shot.headers["content-type"] == "image/png"
    assert shot.body.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(shot.body)) as image:
        assert image.size == SIZE
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) >= 2  # the white xterm on the black root window


def test_raw_screenshots_are_the_pngs_pixels(guest: Guest) -> None:
    """``?format=rgb`` (ours, what the remote provider's settling polls): the PNG's pixels, unencoded."""
    raw = guest.request("GET", "/screenshot?format=rgb")
    png = guest.request("GET", "/screenshot?format=png")  # the default, named
    again = guest.request("GET", "/screenshot?format=rgb")
    assert raw.status == 200 and png.status == 200, (raw.body[:300], png.body[:300])
    headers = {k.lower(): v for k, v in raw.headers.items()}
    assert headers["content-type"] == "application/octet-stream"
    assert (int(headers["x-screen-width"]), int(headers["x-screen-height"])) == SIZE
    assert len(raw.body) == SIZE[0] * SIZE[1] * 3
    assert png.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(png.body)) as image:
        decoded = image.convert("RGB").tobytes()  # row-major RGB, as the raw body
    assert raw.body == again.body, "the screen changed between the grabs: the comparison means nothing"
    assert raw.body == decoded
    assert len(set(raw.body)) >= 2  # the white xterm on the black root window: not a blank screen
    _error(guest.request("GET", "/screenshot?format=jpeg"), 400, "format", "'jpeg'", "png, rgb")


def test_task_cpu_counts_what_the_task_runs_and_stops_when_it_is_idle(guest: Guest, tmp_path: Path) -> None:
    """retrace's own request, which a setup's settle step waits on: the CPU time of the processes the guest
    started (as its own user: its descendants), so an app working on a quiet screen is told apart."""
    def seconds() -> float:
        return guest.request("GET", "/task_cpu").json()["seconds"]

    done = tmp_path / "done"
    burn = f"end=$((SECONDS + 4)); while [ $SECONDS -lt $end ]; do :; done; touch {done}"
    first = seconds()
    assert guest.post_json("/setup/launch", {"command": ["bash", "-c", burn], "shell": False}).status == 200
    deadline = time.monotonic() + 3.5  # the loop's 4 s, whatever share of a CPU a loaded machine gives it
    while seconds() - first < 0.3:
        assert time.monotonic() < deadline, "a busy task's CPU time did not grow"
        time.sleep(0.1)
    while not done.exists():
        time.sleep(0.1)
    idle = seconds()
    time.sleep(0.5)
    assert seconds() - idle < 0.05


def test_execute(guest: Guest) -> None:
    res = guest.post_json("/execute", {"command": ["echo", "hi", "~/x"], "shell": False})
    assert res.status == 200
    assert res.json() == {"status": "success", "output": f"hi {guest.home}/x\n", "error": "", "returncode": 0}
    # a string without shell is split, as OSWorld does; with shell it is a shell script; commands run in the home
    assert guest.post_json("/execute", {"command": "printf '%s|' a 'b c'"}).json()["output"] == "a|b c|"
    res = guest.post_json("/execute", {"command": "pwd; echo err >&2; exit 3", "shell": True}).json()
    assert (res["output"], res["error"], res["returncode"], res["status"]) == (f"{guest.home}\n", "err\n", 3, "success")
    # /setup/execute is the same endpoint (OSWorld serves both)
    assert guest.post_json("/setup/execute", {"command": ["true"]}).json()["returncode"] == 0
    # a timeout is exit status 124, as the local environment's run(); the process group is gone
    started = time.monotonic()
    res = guest.post_json("/execute", {"command": "sleep 30 & sleep 30", "shell": True, "timeout": 0.5}).json()
    assert res["returncode"] == 124 and "timed out after 0.5 s" in res["error"]
    assert time.monotonic() - started < 5
    # a process left behind does not hold the request (output goes to files, not pipes)
    started = time.monotonic()
    res = guest.post_json("/execute", {"command": "sleep 10 >/dev/null 2>&1 & echo $!", "shell": True})
    assert time.monotonic() - started < 5
    os.kill(int(res.json()["output"]), signal.SIGKILL)
    # output is capped at 1 MiB per stream
    big = guest.post_json("/execute", {"command": "head -c 3000000 /dev/zero | tr '\\0' a", "shell": True}).json()
    assert len(big["output"]) == 1024 * 1024


def test_files(guest: Guest) -> None:
    data = bytes(range(256)) * 100
    body, headers = multipart({"file_path": "~/sub/dir/data.bin"}, {"file_data": data})
    res = guest.request("POST", "/setup/upload", body, headers)
    assert (res.status, res.body) == (200, f"File Uploaded: {len(data)} bytes".encode())
    assert (guest.home / "sub/dir/data.bin").read_bytes() == data
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    got = guest.request("POST", "/file", b"file_path=%7E%2Fsub%2Fdir%2Fdata.bin", form)
    assert (got.status, got.body) == (200, data)
    assert "attachment" in got.headers["content-disposition"]
    # an absolute path in /tmp and a path relative to the home work too
    assert guest.request("POST", "/file", f"file_path={guest.home}/sub/dir/data.bin".encode(), form).body == data
    assert guest.request("POST", "/file", b"file_path=sub/dir/data.bin", form).body == data
    _error(guest.request("POST", "/file", b"file_path=~/missing.txt", form), 404, "not found")
    _error(guest.request("POST", "/file", b"file_path=~/sub", form), 422, "directory")
    # outside the home and /tmp: refused, whether named directly, through .. or through a link
    _error(guest.request("POST", "/file", b"file_path=/etc/hostname", form), 403, "outside the allowed roots")
    _error(guest.request("POST", "/file", b"file_path=~/" + b"../" * 30 + b"etc/hostname", form), 403, "outside")
    (guest.home / "link").symlink_to("/etc/hostname")
    _error(guest.request("POST", "/file", b"file_path=~/link", form), 403, "outside")
    body, headers = multipart({"file_path": "/etc/retrace-test"}, {"file_data": b"x"})
    _error(guest.request("POST", "/setup/upload", body, headers), 403, "outside the allowed roots")
    assert not Path("/etc/retrace-test").exists()
    body, headers = multipart({"file_path": "~/link"}, {"file_data": b"x"})
    _error(guest.request("POST", "/setup/upload", body, headers), 403, "outside")
    os.mkfifo(guest.home / "fifo")
    _error(guest.request("POST", "/file", b"file_path=~/fifo", form), 422, "FIFO")
    body, headers = multipart({"file_path": "~/fifo"}, {"file_data": b"x"})
    _error(guest.request("POST", "/setup/upload", body, headers), 422, "cannot write")
    assert guest.healthy()


def test_launch_and_open_file(guest: Guest) -> None:
    res = guest.post_json("/setup/launch", {"command": ["xterm", "-title", "launched-one"], "shell": False})
    assert (res.status, res.body) == (200, b"xterm -title launched-one launched successfully")
    guest.display.wait_window("launched-one")
    assert guest.post_json("/setup/launch", {"command": "xterm -title 'launched two'"}).status == 200
    guest.display.wait_window("launched two")
    _error(guest.post_json("/setup/launch", {"command": ["no-such-program-retrace"]}), 400, "cannot launch")
    # open_file starts an application by name and waits for its window (xdotool), or opens a file (xdg-open)
    res = guest.post_json("/setup/open_file", {"path": "xterm", "window_name": "xterm", "timeout_seconds": 15})
    assert (res.status, res.body) == (200, b"File opened and window activated successfully")
    _error(guest.post_json("/setup/open_file", {"path": "~/nothing-here.txt"}), 404, "not found")
    _error(guest.post_json("/setup/open_file", {"path": "/etc/hostname"}), 403, "outside")
    (guest.home / "doc.txt").write_text("x")
    res = guest.post_json("/setup/open_file", {"path": "~/doc.txt", "timeout_seconds": 1})
    if subprocess.run(["which", "xdg-open"], capture_output=True, check=False).returncode != 0:
        _error(res, 501, "xdg-open")
    assert guest.healthy()


HUGE_JSON = b'{"command": "' + b"a" * (2 * 1024 * 1024) + b'"}'

BAD_REQUESTS = [
    # (method, path, body, headers, status, words in the error)
    ("POST", "/execute", b'{"shell": false}', {}, 400, ["command is required"]),
    ("POST", "/execute", b'{"command": 5}', {}, 400, ["list of strings or a string"]),
    ("POST", "/execute", b'{"command": ["a", 1]}', {}, 400, ["list of strings"]),
    ("POST", "/execute", b'{"command": []}', {}, 400, ["empty"]),
    ("POST", "/execute", b'{"command": "ls", "shell": "yes"}', {}, 400, ["shell must be true or false"]),
    ("POST", "/execute", b'{"command": "ls", "timeout": -1}', {}, 400, ["timeout must be a positive number"]),
    ("POST", "/execute", b'{"command": "echo \'unclosed"}', {}, 400, ["cannot be split"]),
    ("POST", "/execute", b'{"command": ["no-such-program-retrace"]}', {}, 400, ["cannot run"]),
    ("POST", "/execute", b'{"command": [', {}, 400, ["not valid JSON"]),
    ("POST", "/execute", b'["ls"]', {}, 400, ["must be an object"]),
    ("POST", "/execute", b"", {}, 400, ["JSON object body"]),
    ("POST", "/execute", b"\xff\xfe", {}, 400, ["not valid JSON"]),
    ("POST", "/execute", HUGE_JSON, {}, 413, ["over this endpoint's limit"]),
    ("POST", "/setup/launch", b'{"command": null}', {}, 400, ["list of strings or a string"]),
    ("POST", "/setup/open_file", b"{}", {}, 400, ["path is required"]),
    ("POST", "/setup/open_file", b'{"path": 3}', {}, 400, ["path must be a non-empty string"]),
    ("POST", "/setup/open_file", b'{"path": "xterm", "timeout_seconds": "x"}', {}, 400, ["timeout_seconds"]),
    ("POST", "/file", b"", {}, 400, ["file_path is required"]),
    ("POST", "/file", b"file_path=", {"Content-Type": "application/x-www-form-urlencoded"}, 400, ["non-empty"]),
    ("POST", "/setup/upload", b"file_path=~/x", {"Content-Type": "application/x-www-form-urlencoded"}, 400,
     ["file_path and file_data are required"]),
    ("POST", "/setup/upload", *multipart({"file_path": "~/x", "file_data": "not a file"}, {}), 400,
     ["file_data must be a file part"]),
    ("POST", "/setup/upload", *multipart({}, {"file_path": b"~/x", "file_data": b"x"}), 400,
     ["file_path must be a plain form field"]),
    ("POST", "/setup/upload", b"--x\r\nbroken", {"Content-Type": "multipart/form-data; boundary=x"}, 400, []),
    ("GET", "/execute", None, {}, 405, ["Method Not Allowed"]),
    ("GET", "/no/such/endpoint", None, {}, 404, ["Not Found"]),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "words"), BAD_REQUESTS,
                         ids=[f"{m} {p} {s} {i}" for i, (m, p, _, _, s, _) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_clear_errors(guest: Guest, method: str, path: str, body: bytes | None,
                                       headers: dict[str, str], status: int, words: list[str]) -> None:
    _error(guest.request(method, path, body, headers), status, *words)
    assert guest.healthy()


def test_declared_huge_bodies_are_refused_before_they_are_sent(guest: Guest) -> None:
    """A 100 MB Content-Length is answered at once, the body unread (a smaller excess is read and dropped, so that
    a client still sending sees the 413: the HUGE_JSON case above)."""
    for path, size in (("/execute", 100_000_000), ("/setup/upload", 100_000_000)):
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()
        answer = guest.raw(head)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["status"] == "error"
        assert guest.healthy()
    # a chunked body (no Content-Length) is cut off as soon as it passes the limit
    chunk = b"a" * 65536
    head = b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = guest.raw(head + (b"10000\r\n" + chunk + b"\r\n") * 20 + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert guest.healthy()


def test_token(display: Display, tmp_path: Path) -> None:
    guest = Guest(display, tmp_path / "home", token="s3cret-token").start()
    try:
        assert guest.request("GET", "/health", token="").status == 200  # the health check needs no token
        missing = guest.request("GET", "/platform", token="")
        guest_headers = {"Authorization": "Basic czNjcmV0"}
        _error(missing, 401, "bearer token is required")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        _error(guest.request("GET", "/platform", token="wrong"), 401, "wrong bearer token")
        _error(guest.request("GET", "/platform", headers=guest_headers, token=""), 401, "bearer token is required")
        # refused before the body is read: an unauthenticated upload never reaches the disk
        body, headers = multipart({"file_path": "~/x"}, {"file_data": b"x"})
        _error(guest.request("POST", "/setup/upload", body, headers, token="wrong"), 401)
        assert not (guest.home / "x").exists()
        assert guest.request("GET", "/platform").body == b"Linux"
        # the token is not in the environment of the commands the guest runs
        env = guest.post_json("/execute", {"command": ["env"]}).json()["output"]
        assert Guest.TOKEN_VAR not in env and "s3cret-token" not in env
        assert guest.healthy()
    finally:
        guest.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_retrace.cli", "guest", *args], capture_output=True,
                          text=True, timeout=30, env=env, check=False)


def test_a_non_loopback_address_needs_a_token() -> None:
    res = _cli("--host", "0.0.0.0", "--port", "0")
    assert res.returncode == 2
    assert "refusing to listen on 0.0.0.0" in res.stderr and "token" in res.stderr
    assert "listening" not in res.stdout
    res = _cli("--token-env", "RETRACE_TEST_UNSET_VARIABLE", "--port", "0",
               env={k: v for k, v in os.environ.items() if k != "RETRACE_TEST_UNSET_VARIABLE"})
    assert res.returncode == 2 and "RETRACE_TEST_UNSET_VARIABLE is not set" in res.stderr
