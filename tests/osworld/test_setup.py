"""OSWorld's setup steps checked against desktop-env's SetupController and run by it on a real ``retrace guest``:
a failure before the agent acts is the harness's (EnvError), a bad step is named before anything runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_retrace.envs import EnvError
from pytest_retrace.evaluators import EvaluatorError
from pytest_retrace.osworld import package, setup
from pytest_retrace.osworld.server import VMServer
from tests.guests import Guest, needs_desktop
from tests.osworld.test_evaluate import Counting, counting_server

pytestmark = pytest.mark.skipif(package.root() is None, reason="desktop-env is not installed (scripts/bootstrap)")


def step(kind: str, **parameters: Any) -> dict[str, Any]:
    return {"type": kind, "parameters": parameters}


@pytest.fixture
def web() -> Iterator[str]:
    with counting_server() as url:
        yield url


def server_of(guest: Guest) -> VMServer:
    return VMServer("127.0.0.1", guest.port, chromium_port=9222, vlc_port=8080)


@pytest.mark.parametrize(("config", "message"), [
    ([step("login", settings_file="x")], "config[0] (login): needs a Google account: login (not supported)"),
    ([step("sleep", seconds=1), step("googledrive", operation=[])],
     "config[1] (googledrive): needs a Google account: googledrive (not supported)"),
    ([step("frobnicate")], "config[0] (frobnicate): unsupported config step: frobnicate (desktop-env's"),
    ([step("act", action_seq=[])], "config[0] (act): unsupported config step: act (not implemented"),
    ([step("launch", command=["x"], shel=True)],
     "config[0] (launch): bad config step: got an unexpected keyword argument 'shel'"),
    ([step("execute", shell=True)], "config[0] (execute): bad config step: missing a required argument: 'command'"),
    ([step("command", command=["ls"], until={"returncode": 0}, wait=1)],
     "config[0] (command): bad config step: got an unexpected keyword argument 'wait'"),  # passed to execute
    ([{"type": "sleep"}], "config[0] (sleep): bad config step: parameters must be a mapping"),
    ([step("upload_file", files=[{"local_path": "/no/such/file", "path": "/home/user/a"}])],
     "config[0] (upload_file).files[0].local_path: local file not found: /no/such/file"),
    ({"type": "sleep"}, "config: invalid config: must be a list of steps"),
])
def test_validate_config_names_the_step(config: Any, message: str) -> None:
    with pytest.raises(EvaluatorError) as caught:
        setup.validate_config(config, "config")
    assert isinstance(caught.value, ValueError) and str(caught.value).startswith(message)
    assert setup.config_problems(config, None, None)[0][0] == str(caught.value).split(": ")[1]


def test_steps_osworld_runs_pass(tmp_path: Path) -> None:
    local = tmp_path / "a.xlsx"
    local.write_bytes(b"x")
    setup.validate_config([
        step("launch", command=["gedit"]), step("execute", command="ls", shell=True, until={"stdout": "x"}),
        step("activate_window", window_name="gedit", strict=True), step("sleep", seconds=0.5),
        step("open", path="/home/user/a.txt"), step("upload_file", files=[{"local_path": str(local), "path": "/a"}]),
        step("chrome_open_tabs", urls_to_open=["https://example.com"]), step("close_window", window_name="x"),
    ], "config")


def test_a_download_is_taken_from_the_cache_or_named(tmp_path: Path) -> None:
    url = "https://example.com/files/sales.xlsx"
    config = [step("download", files=[{"url": url, "path": "/home/user/sales.xlsx"}])]
    assert setup.config_problems(config, None, None) == [("cloud file not in cache", url)]
    assert setup.config_problems(config, tmp_path, "task-1") == [("cloud file not in cache", url)]
    with pytest.raises(EvaluatorError, match=r"no cache directory given, and nothing is downloaded here"):
        setup.validate_config(config, "config")
    # where OSWorld's SetupController looks before downloading: <cache>/<task id>/<uuid5(url)>_<name>
    cached = setup.cached(tmp_path / "task-1", url, "/home/user/sales.xlsx")
    assert cached.name.endswith("_sales.xlsx") and cached.parent.name == "task-1"
    cached.parent.mkdir()
    cached.write_bytes(b"x")
    assert setup.config_problems(config, tmp_path, "task-1") == []


@needs_desktop
@pytest.mark.desktop
def test_run_config_runs_osworlds_steps_on_the_guest(guest: Guest, tmp_path: Path, web: str) -> None:
    local = tmp_path / "report.txt"
    local.write_text("uploaded\n")
    url = f"{web}/gold.csv"
    cache = tmp_path / "cache"
    cache.mkdir()
    setup.cached(cache, url, str(guest.home / "gold.csv")).write_text("a,b\n1,2\n")
    marker = guest.home / "ran"
    setup.run_config([
        step("upload_file", files=[{"local_path": str(local), "path": str(guest.home / "report.txt")}]),
        step("download", files=[{"url": url, "path": str(guest.home / "gold.csv")}]),
        step("execute", command=["sh", "-c", f"echo {{SCREEN_WIDTH}} > {marker}"]),  # OSWorld's placeholders
        step("execute", command=f"test -f {marker} && echo done", shell=True, until={"stdout": "done"},
             stdout="out.txt"),
    ], server_of(guest), cache)
    assert (guest.home / "report.txt").read_text() == "uploaded\n"
    assert (guest.home / "gold.csv").read_text() == "a,b\n1,2\n"
    assert marker.read_text() == "1920\n"
    assert (cache / "out.txt").read_text() == "done\n"  # execute's stdout option writes into the cache
    assert Counting.hits == []  # the download came from the cache


@needs_desktop
@pytest.mark.desktop
def test_a_failing_setup_step_is_an_env_error_naming_it(guest: Guest, tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"Setup step 2 failed: _open_setup - Failed to open file .*no-such\.odt"):
        setup.run_config([step("sleep", seconds=0), step("open", path=str(guest.home / "no-such.odt"))],
                         server_of(guest), tmp_path)


def test_an_unreachable_server_is_an_env_error_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(EnvError, match="unreachable"):  # SetupController alone would retry for 100 s
        setup.run_config([step("sleep", seconds=0)], VMServer("127.0.0.1", 9, 9222, 8080), tmp_path)
    assert time.monotonic() - started < 30


def test_a_bad_step_is_refused_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(EvaluatorError, match="needs a Google account"):
        setup.run_config([step("login", settings_file="x")], VMServer("127.0.0.1", 9, 9222, 8080), tmp_path)


@needs_desktop
@pytest.mark.desktop
def test_an_until_never_met_ends_at_the_deadline(guest: Guest, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setattr(setup, "SETUP_DEADLINE", 2.0)  # OSWorld's own loop would ask for ever
    with pytest.raises(EnvError, match=r"did not finish in 2 s"):
        setup.run_config([step("execute", command="echo not yet", shell=True, until={"stdout": "done"})],
                         server_of(guest), tmp_path)
    deadline = time.monotonic() + 60
    while any(t.name == "osworld-setup" for t in threading.enumerate()):  # its loop was made to give up
        assert time.monotonic() < deadline, "desktop-env's execute loop still runs"
        time.sleep(0.1)


def test_quiet_silences_its_own_thread_only() -> None:
    """desktop-env's prints are kept out of the output, per thread: `retrace build` runs OSWorld setups on several
    desktops' threads at once, and another thread's output, or the process's after two overlapping calls, must
    still reach the real stream (contextlib.redirect_stdout swapped the process's stream: the build's log stopped)."""
    import io
    import sys
    import threading

    from pytest_retrace.osworld.setup import quiet

    real = io.StringIO()
    saved = sys.stdout
    sys.stdout = real
    try:
        inside, release = threading.Event(), threading.Event()

        def other() -> None:
            with quiet():
                print("from desktop-env, thread 2")
                inside.set()
                release.wait(5)

        thread = threading.Thread(target=other)
        with quiet():
            thread.start()
            inside.wait(5)
            print("from desktop-env, thread 1")
        print("the build's log, while thread 2 is still quiet")  # thread 1 left first: overlapping calls
        release.set()
        thread.join(5)
        print("the build's log, after both")
    finally:
        sys.stdout = saved
    assert real.getvalue().splitlines() == ["the build's log, while thread 2 is still quiet",
                                            "the build's log, after both"]
