"""Chrome's DevTools port of a task reached from the harness (``forward``), as OSWorld's chrome setup steps and
getters reach it: a real desktop runs ``google-chrome --remote-debugging-port=1337`` and ``socat`` on 9222 as
OSWorld's task configs do, and desktop-env's own code (controllers/setup.py, evaluators/getters/chrome.py) drives
it through playwright's ``connect_over_cdp``. The pages are served inside the task's sandbox (no internet here).
"""

from __future__ import annotations

import inspect
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_retrace.envs import EnvError, check_port, forward
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import Task
from tests.guests import osworld_module

_TRUE = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
WWW = 8000  # the task's own web server, on its loopback
DEADLINE = 90.0  # seconds for chromium to come up on a loaded machine


def _page(title: str) -> str:
    return f"<!doctype html><html><head><title>{title}</title></head><body><h1>{title}</h1></body></html>"


def chrome_task(tag: str, *, network: bool = False) -> Task:
    """OSWorld's chrome config (google-chrome on 1337, socat 9222 -> 1337) plus a web server in the task."""
    setup: list[dict[str, Any]] = [
        *({"type": "file", "path": f"~/www/{name}.html", "content": _page(f"{tag} {name}")}
          for name in ("start", "alpha", "beta")),
        {"type": "launch", "command": ["python3", "-m", "http.server", str(WWW), "--bind", "127.0.0.1",
                                       "--directory", "/home/user/www"]},
        {"type": "launch", "command": ["google-chrome", "--remote-debugging-port=1337",
                                       f"http://127.0.0.1:{WWW}/start.html"], "window": f"^{tag} start", "timeout": DEADLINE},
        {"type": "launch", "command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]},
    ]
    return Task.model_validate({"id": f"cdp-{tag}", "instruction": "x", "domain": "test", "setup": setup,
                                "evaluator": _TRUE, "network": network})


def relayed(env: XvfbEnvironment, port: int = 9222) -> tuple[str, int]:
    """Where the harness reaches the task's DevTools (socat's 9222): its own loopback, at the relay's port."""
    return "127.0.0.1", forward(env, port)


def wait_for_devtools(address: tuple[str, int]) -> dict[str, Any]:
    """DevTools' /json/version through the relay, once socat and chromium both answer."""
    host, port = address
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            with opener.open(f"http://{host}:{port}/json/version", timeout=10) as reply:
                return json.load(reply)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def answer(address: tuple[str, int]) -> bytes:
    """What a port answers a DevTools request with; a connection cut unanswered (closed or reset) is b''."""
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            return conn.recv(100)
        except ConnectionResetError:
            return b""


def devtools_pages(address: tuple[str, int]) -> list[dict[str, Any]]:
    """The browser's tabs, most recently active first (DevTools' /json/list)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address[0]}:{address[1]}/json/list", timeout=10) as reply:
        return [t for t in json.load(reply) if t["type"] == "page"]


def osworld_env(address: tuple[str, int]) -> SimpleNamespace:
    """What desktop-env's getters read of its DesktopEnv: the VM's address, its DevTools port, and a controller.
    Its accessibility tree is a stand-in: our desktops serve none (no AT-SPI bus), so it carries only what
    get_active_url_from_accessTree looks for, Chrome's address bar, holding the active tab's URL as Chrome's
    address bar shows it (no scheme), read from DevTools' list, whose first page is the active one."""
    def tree() -> str:
        shown = devtools_pages(address)[0]["url"].removeprefix("http://")
        return ('<desktop xmlns:st="uri:deskat:state.at-spi.gnome.org"><application name="Google Chrome">'
                f'<entry name="Address and search bar">{shown}</entry></application></desktop>')

    return SimpleNamespace(vm_ip=address[0], chromium_port=address[1], server_port=0,
                           controller=SimpleNamespace(get_accessibility_tree=tree))


@pytest.fixture(scope="module")
def osworld() -> SimpleNamespace:
    """desktop-env's setup controller and chrome getters, each module imported alone (osworld/package.py)."""
    return SimpleNamespace(setup=osworld_module("desktop_env.controllers.setup"),
                           chrome=osworld_module("desktop_env.evaluators.getters.chrome"))


@pytest.fixture(scope="module")
def second() -> Iterator[XvfbEnvironment]:
    e = XvfbEnvironment()
    e.start()
    yield e
    e.close()


# -- without a desktop -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 65536, -1, "9222", True, 9222.0])
def test_a_port_must_be_a_tcp_port_number(bad: object) -> None:
    with pytest.raises(ValueError, match=r"port: a TCP port number 1-65535, got"):
        check_port(bad)


def test_a_provider_without_forward_is_an_env_error() -> None:
    with pytest.raises(EnvError, match="the fake environment cannot reach a port of its desktop"):
        forward(SimpleNamespace(name="fake"), 9222)  # type: ignore[arg-type]


def test_remote_relays_the_port_at_the_guests_host() -> None:
    env = RemoteEnvironment(urls="http://127.0.0.1:5000")
    with pytest.raises(EnvError, match="not started"):
        env.forward(9222)
    with socket.create_server(("127.0.0.1", 0)) as guest:  # the guest's socat, on its host (here loopback)
        env.attach(f"http://127.0.0.1:{guest.getsockname()[1] + 1}", None, probe=False)
        local = forward(env, guest.getsockname()[1])
        assert local != guest.getsockname()[1]
        with socket.create_connection(("127.0.0.1", local), timeout=10) as conn:
            served, _ = guest.accept()
            with served:
                served.sendall(b"from the guest")
                assert conn.recv(100) == b"from the guest"
        env.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", local), timeout=5).close()


# -- on a real desktop -----------------------------------------------------------------------------------------


@pytest.mark.desktop
def test_google_chrome_is_on_the_tasks_path_beside_the_machines_programs(env: XvfbEnvironment) -> None:
    env.reset(Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "evaluator": _TRUE}), Path("."))
    found = env.run("command -v google-chrome; command -v socat; ls /usr/local/bin; cat /usr/local/bin/google-chrome")
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert lines[:2] == ["/usr/local/bin/google-chrome", "/usr/bin/socat"]
    assert {p.name for p in Path("/usr/local/bin").iterdir()} <= set(lines)  # laid over, nothing hidden
    assert 'exec chromium --no-first-run' in found.stdout and '--user-data-dir="$HOME/.config/google-chrome"' in found.stdout
    assert env.run("echo x > /usr/local/bin/google-chrome").returncode != 0  # read-only for the task


@pytest.mark.desktop
def test_osworld_setup_and_getters_drive_the_tasks_chrome_through_forward(
        env: XvfbEnvironment, osworld: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    env.reset(chrome_task("one"), Path("."))
    address = relayed(env)
    assert address[1] != 9222
    assert "Chrome/" in wait_for_devtools(address)["Browser"]
    # the profile is where OSWorld's getters read Chrome's files
    assert env.run("test -d ~/.config/google-chrome/Default").returncode == 0

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(f"http://{address[0]}:{address[1]}")
        assert [page.title() for page in browser.contexts[0].pages] == ["one start"]
        browser.close()  # the connection only: chromium stays

    controller = osworld.setup.SetupController(vm_ip=address[0], chromium_port=address[1])
    urls = [f"http://127.0.0.1:{WWW}/alpha.html", f"http://127.0.0.1:{WWW}/beta.html"]
    start = time.monotonic()
    controller._chrome_open_tabs_setup(urls)
    opened = time.monotonic() - start
    with capsys.disabled():
        print(f"\nconnect_over_cdp + open 2 tabs (desktop-env's _chrome_open_tabs_setup): {opened:.2f} s")

    desk = osworld_env(address)
    tabs = osworld.chrome.get_open_tabs_info(desk, {})
    # in the order playwright met the pages, which varies between runs
    assert sorted(tabs, key=lambda t: t["url"]) == [{"title": "one alpha", "url": urls[0]},
                                                    {"title": "one beta", "url": urls[1]}]
    active = osworld.chrome.get_active_tab_info(desk, {"goto_prefix": "http://"})
    assert active is not None and active["title"] == "one beta" and active["url"] == urls[1]

    controller._chrome_close_tabs_setup([urls[0]])
    remaining = [t["title"] for t in osworld.chrome.get_open_tabs_info(desk, {})]
    assert "one alpha" not in remaining and "one beta" in remaining


@pytest.mark.desktop
def test_two_desktops_each_have_their_own_9222(env: XvfbEnvironment, second: XvfbEnvironment) -> None:
    env.reset(chrome_task("one"), Path("."))
    second.reset(chrome_task("two"), Path("."))
    ours, theirs = relayed(env), relayed(second)
    assert ours != theirs
    for address, tag in ((ours, "one"), (theirs, "two")):
        wait_for_devtools(address)
        assert [t["title"] for t in devtools_pages(address)] == [f"{tag} start"]


@pytest.mark.desktop
def test_a_forward_ends_with_its_task(env: XvfbEnvironment) -> None:
    env.reset(chrome_task("one"), Path("."))
    old = relayed(env)
    wait_for_devtools(old)
    assert relayed(env) == old  # one relay per port and task
    env.reset(Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "evaluator": _TRUE}), Path("."))
    with pytest.raises(OSError):
        socket.create_connection(old, timeout=5).close()
    # a port nothing listens on in the new task: the relay accepts, then closes the connection unanswered
    assert answer(relayed(env)) == b""


@pytest.mark.desktop
def test_a_task_with_the_network_cannot_use_a_relay(env: XvfbEnvironment, second: XvfbEnvironment) -> None:
    # a task on the harness's own loopback reaches the relay's port; the relay must not serve it another
    # desktop's browser (nor its own: only the harness drives DevTools)
    env.reset(chrome_task("one"), Path("."))
    address = relayed(env)
    wait_for_devtools(address)
    second.reset(Task.model_validate({"id": "t", "instruction": "x", "domain": "test", "evaluator": _TRUE,
                                      "network": True}), Path("."))
    probe = f"import socket\n{inspect.getsource(answer)}\nprint(repr(answer(('127.0.0.1', {address[1]}))))\n"
    second.write_file("~/probe.py", probe.encode())  # the harness's own answer(), run by the task
    res = second.run("python3 ~/probe.py")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "b''"
    assert answer(address).startswith(b"HTTP/1.")  # the same request, from the harness
    assert "Chrome/" in wait_for_devtools(address)["Browser"]  # the harness still is served
